//! Shared argument parsers used by the server's modules: flags, numbers, sizes, offsets and
//! durations, with nginx's syntax, limits and error messages.
//!
//! The plain functions (`size`, `msec`...) take one argument string and return `None` when it
//! is invalid; the `*_arg` wrappers take a directive and an argument index and produce the
//! `file:line` error nginx would print (`"client_max_body_size" directive invalid value`).
//! All values are capped at `i64::MAX`, nginx's limit on 64-bit systems.

use crate::{ConfError, Directive};

/// nginx's ngx_atoi: one or more ASCII digits, nothing else, at most `i64::MAX`.
pub fn num(s: &str) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut n: i64 = 0;
    for b in s.bytes() {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(i64::from(b - b'0'))?;
    }
    u64::try_from(n).ok()
}

/// nginx's ngx_parse_size: a number of bytes with an optional `k`, `m` or `g` suffix (either
/// case, powers of 1024). `None` when malformed or beyond `i64::MAX` bytes.
pub fn size(s: &str) -> Option<u64> {
    let (digits, scale) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1u64 << 10),
        b'm' | b'M' => (&s[..s.len() - 1], 1 << 20),
        b'g' | b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let bytes = num(digits)?.checked_mul(scale)?;
    (bytes <= i64::MAX as u64).then_some(bytes)
}

/// nginx's ngx_parse_offset: same syntax and limit as [`size`] on 64-bit systems.
pub fn offset(s: &str) -> Option<u64> {
    size(s)
}

/// A duration in milliseconds, nginx's ngx_parse_time(.., 0): `500ms`, `30s`, `5m`, `1h 30m`,
/// `1h30m`, `2d`, `1w`; a bare number is seconds. As in nginx, `M` (months) and `y` (years)
/// are accepted only by [`sec`].
pub fn msec(s: &str) -> Option<u64> {
    parse_time(s, false)
}

/// A duration in seconds, nginx's ngx_parse_time(.., 1): like [`msec`] plus `M` (30 days) and
/// `y` (365 days), minus `ms`.
pub fn sec(s: &str) -> Option<u64> {
    parse_time(s, true)
}

/// Units must come in decreasing order, each at most once: the steps of nginx's parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    Start,
    Year,
    Month,
    Week,
    Day,
    Hour,
    Min,
    Sec,
    Msec,
    /// After a bare number followed by a space.
    Last,
}

fn parse_time(s: &str, is_sec: bool) -> Option<u64> {
    const DAY: i64 = 24 * 60 * 60;
    let b = s.as_bytes();
    let mut valid = false;
    let mut value: i64 = 0;
    let mut total: i64 = 0;
    // Starting at Month rules out `y` and `M` for milliseconds, as nginx does.
    let mut step = if is_sec { Step::Start } else { Step::Month };
    let mut p = 0;
    while let Some(&c) = b.get(p) {
        p += 1;
        if c.is_ascii_digit() {
            value = value.checked_mul(10)?.checked_add(i64::from(c - b'0'))?;
            valid = true;
            continue;
        }
        let (next, scale) = match c {
            b'y' if step == Step::Start => (Step::Year, 365 * DAY),
            b'M' if step < Step::Month => (Step::Month, 30 * DAY),
            b'w' if step < Step::Week => (Step::Week, 7 * DAY),
            b'd' if step < Step::Day => (Step::Day, DAY),
            b'h' if step < Step::Hour => (Step::Hour, 60 * 60),
            b'm' if b.get(p) == Some(&b's') => {
                if is_sec || step >= Step::Msec {
                    return None;
                }
                p += 1;
                (Step::Msec, 1)
            }
            b'm' if step < Step::Min => (Step::Min, 60),
            b's' if step < Step::Sec => (Step::Sec, 1),
            b' ' if step < Step::Sec => (Step::Last, 1),
            _ => return None,
        };
        step = next;
        let scale = if step != Step::Msec && !is_sec {
            scale * 1000
        } else {
            scale
        };
        total = total.checked_add(value.checked_mul(scale)?)?;
        value = 0;
        while b.get(p) == Some(&b' ') {
            p += 1;
        }
    }
    if !valid {
        return None;
    }
    // A trailing bare number is seconds.
    if !is_sec {
        value = value.checked_mul(1000)?;
    }
    u64::try_from(total.checked_add(value)?).ok()
}

/// Argument `i` (0-based, after the name), or nginx's argument-count error.
pub fn arg(d: &Directive, i: usize) -> Result<&str, ConfError> {
    d.args.get(i).map(String::as_str).ok_or_else(|| {
        d.error(format_args!(
            "invalid number of arguments in \"{}\" directive",
            d.name
        ))
    })
}

/// `on` / `off` (any case) as the directive's only argument.
pub fn flag(d: &Directive) -> Result<bool, ConfError> {
    let [v] = d.args.as_slice() else {
        return Err(d.error(format_args!(
            "invalid number of arguments in \"{}\" directive",
            d.name
        )));
    };
    if v.eq_ignore_ascii_case("on") {
        Ok(true)
    } else if v.eq_ignore_ascii_case("off") {
        Ok(false)
    } else {
        Err(d.error(format_args!(
            "invalid value \"{v}\" in \"{}\" directive, it must be \"on\" or \"off\"",
            d.name
        )))
    }
}

/// Apply `parse` to argument `i`; failure is `"NAME" directive <what>`, nginx's wording for
/// the size, time and number slots.
fn parsed(
    d: &Directive,
    i: usize,
    parse: fn(&str) -> Option<u64>,
    what: &str,
) -> Result<u64, ConfError> {
    parse(arg(d, i)?).ok_or_else(|| d.error(format_args!("\"{}\" directive {what}", d.name)))
}

/// Argument `i` as a [`num`]; error `"NAME" directive invalid number`.
pub fn num_arg(d: &Directive, i: usize) -> Result<u64, ConfError> {
    parsed(d, i, num, "invalid number")
}

/// Argument `i` as a [`size`]; error `"NAME" directive invalid value`.
pub fn size_arg(d: &Directive, i: usize) -> Result<u64, ConfError> {
    parsed(d, i, size, "invalid value")
}

/// Argument `i` as an [`offset`]; error `"NAME" directive invalid value`.
pub fn offset_arg(d: &Directive, i: usize) -> Result<u64, ConfError> {
    parsed(d, i, offset, "invalid value")
}

/// Argument `i` as a [`msec`] duration; error `"NAME" directive invalid value`.
pub fn msec_arg(d: &Directive, i: usize) -> Result<u64, ConfError> {
    parsed(d, i, msec, "invalid value")
}

/// Argument `i` as a [`sec`] duration; error `"NAME" directive invalid value`.
pub fn sec_arg(d: &Directive, i: usize) -> Result<u64, ConfError> {
    parsed(d, i, sec, "invalid value")
}

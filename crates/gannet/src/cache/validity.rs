//! Whether an application's answer may be cached and until when, as nginx's upstream
//! module decides it (`ngx_http_upstream_process_accel_expires`, `_cache_control`,
//! `_expires`, `_set_cookie`, `_vary`, then `ngx_http_file_cache_valid`):
//!
//! - `X-Accel-Expires: N` (seconds, or `@T`, an absolute time) sets the time and wins over
//!   the others; `0` keeps the answer out of the cache.
//! - `Cache-Control`: `no-cache`, `no-store` or `private` keep it out; `s-maxage=N`, else
//!   `max-age=N`, sets the time (0 keeps it out). Its extensions `stale-while-revalidate=N`
//!   and `stale-if-error=N` count with `X-Accel-Expires` too: how long past its time the
//!   entry may still be served while it is updated, or in place of an error.
//! - `Expires` sets the time when the above did not (a time past keeps it out).
//! - `Set-Cookie` keeps it out; `Vary: *` (or a `Vary` longer than 128 bytes) too.
//! - Else `*_cache_valid` for the status (exact code, then `any`).
//!
//! Each header is not looked at when `*_ignore_headers` lists it.

use gannet_proto::cgi::CgiHead;

/// The answer may be kept until `valid` (seconds since the epoch), varying by `vary`.
pub struct Verdict {
    pub valid: i64,
    pub vary: Option<String>,
    /// `stale-while-revalidate` and `stale-if-error` seconds.
    pub updating: u32,
    pub error: u32,
}

/// What the answer's own headers say of its time.
#[derive(Default)]
struct Times {
    until: Option<i64>,
    updating: u32,
    error: u32,
}

/// The time the answer's own headers give (`X-Accel-Expires`, `Cache-Control`,
/// `Expires`); `Err` when they keep it out of the cache.
fn header_time(head: &CgiHead, ignores: &impl Fn(&str) -> bool, now: i64) -> Result<Times, ()> {
    let mut until: Option<i64> = None;
    let (mut updating, mut error) = (0, 0);
    if !ignores("x-accel-expires") {
        if let Some(v) = head.get("x-accel-expires") {
            let v = v.trim();
            let (abs, digits) = match v.strip_prefix('@') {
                Some(d) => (true, d),
                None => (false, v),
            };
            if let Ok(n) = digits.parse::<i64>() {
                if n == 0 && !abs {
                    return Err(());
                }
                until = Some(if abs { n } else { now + n });
            }
        }
    }
    if !ignores("cache-control") {
        for (n, v) in head.headers.iter() {
            if !n.eq_ignore_ascii_case("cache-control") {
                continue;
            }
            let lower = v.to_ascii_lowercase();
            let age = |name: &str| {
                let at = lower.find(name)? + name.len();
                let digits: String = lower[at..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                digits.parse::<i64>().ok()
            };
            // With X-Accel-Expires only the extensions count (nginx's `goto extensions`).
            if until.is_none() {
                if ["no-cache", "no-store", "private"]
                    .iter()
                    .any(|t| lower.contains(t))
                {
                    return Err(());
                }
                if let Some(n) = age("s-maxage=").or_else(|| age("max-age=")) {
                    if n == 0 {
                        return Err(());
                    }
                    until = Some(now + n);
                }
            }
            // A bad number keeps the answer out, as nginx's delta-seconds parser.
            let ext = |name: &str| match lower.contains(name) {
                false => Ok(None),
                true => age(name)
                    .map(|n| Some(u32::try_from(n).unwrap_or(u32::MAX)))
                    .ok_or(()),
            };
            if let Some(n) = ext("stale-while-revalidate=")? {
                (updating, error) = (n, n);
            }
            if let Some(n) = ext("stale-if-error=")? {
                error = n;
            }
        }
    }
    if until.is_none() && !ignores("expires") {
        if let Some(v) = head.get("expires") {
            let t = httpdate::parse_http_date(v.trim())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_secs() as i64);
            match t {
                Some(t) if t > now => until = Some(t),
                // A past or malformed date: nginx keeps the answer out.
                _ => return Err(()),
            }
        }
    }
    Ok(Times {
        until,
        updating,
        error,
    })
}

/// The time a revalidation's 304 makes an entry fresh until, as nginx's "upstream not
/// modified": the 304's own headers, else the entry's stored ones, else `*_cache_valid`
/// for the entry's status; `None` leaves it expired.
pub fn revalidated(
    reply: &CgiHead,
    stored: &CgiHead,
    valid: &[(u16, i64)],
    ignores: impl Fn(&str) -> bool,
    now: i64,
) -> Option<i64> {
    let own = |h: &CgiHead| header_time(h, &ignores, now).ok().and_then(|t| t.until);
    own(reply).or_else(|| own(stored)).or_else(|| {
        let status = stored.status.unwrap_or(200);
        let secs = valid
            .iter()
            .find(|(s, _)| *s == status)
            .or_else(|| valid.iter().find(|(s, _)| *s == 0))?
            .1;
        (secs > 0).then_some(now + secs)
    })
}

/// `valid`: `*_cache_valid`'s (status, seconds) pairs, status 0 for `any`.
pub fn judge(
    head: &CgiHead,
    status: u16,
    valid: &[(u16, i64)],
    ignores: impl Fn(&str) -> bool,
    now: i64,
) -> Option<Verdict> {
    let Times {
        until,
        updating,
        error,
    } = header_time(head, &ignores, now).ok()?;
    let mut vary = None;
    if !ignores("set-cookie") && head.get("set-cookie").is_some() {
        return None;
    }
    if !ignores("vary") {
        let values: Vec<&str> = head
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("vary"))
            .map(|(_, v)| v)
            .collect();
        if !values.is_empty() {
            let all = values.join(",");
            if all.len() > 128 || all.split(',').any(|v| v.trim() == "*") {
                return None;
            }
            vary = Some(all);
        }
    }
    let valid = match until {
        Some(t) => t,
        None => {
            let secs = valid
                .iter()
                .find(|(s, _)| *s == status)
                .or_else(|| valid.iter().find(|(s, _)| *s == 0))?
                .1;
            if secs == 0 {
                return None;
            }
            now + secs
        }
    };
    Some(Verdict {
        valid,
        vary,
        updating,
        error,
    })
}

/// The part of a request a `Vary` answer depends on, as nginx's
/// `ngx_http_file_cache_vary`: for each header named, its values (several fields joined by
/// `,`); `Accept-Charset`, `Accept-Encoding` and `Accept-Language` with their spaces and
/// empty items taken out (`foo, bar` and `foo,,bar ,` are one variant).
pub fn variant_of<'a, I>(vary: &str, headers: impl Fn() -> I) -> Vec<u8>
where
    I: Iterator<Item = (&'a str, &'a [u8])>,
{
    let mut out = Vec::new();
    for name in vary.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        out.extend_from_slice(name.to_ascii_lowercase().as_bytes());
        out.push(b':');
        let normalize = ["accept-charset", "accept-encoding", "accept-language"]
            .iter()
            .any(|n| n.eq_ignore_ascii_case(name));
        let mut multiple = false;
        let values = headers()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v);
        for v in values {
            if !normalize {
                if multiple {
                    out.push(b',');
                }
                out.extend_from_slice(v);
                multiple = true;
                continue;
            }
            for item in v
                .split(|&b| b == b',' || b == b' ')
                .filter(|i| !i.is_empty())
            {
                if multiple {
                    out.push(b',');
                }
                out.extend_from_slice(item);
                multiple = true;
            }
        }
        out.extend_from_slice(b"\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::judge;
    use gannet_proto::cgi::{CgiHead, Fields};

    fn head(pairs: &[(&str, &str)]) -> CgiHead {
        CgiHead {
            status: Some(200),
            headers: Fields::from_pairs(pairs),
        }
    }

    #[test]
    fn nginx_rules() {
        let v = [(200, 60)];
        let none = |_: &str| false;
        assert_eq!(
            judge(&head(&[]), 200, &v, none, 1000).map(|v| v.valid),
            Some(1060)
        );
        assert!(judge(&head(&[]), 404, &v, none, 1000).is_none());
        let cc = head(&[("Cache-Control", "public, max-age=5")]);
        assert_eq!(judge(&cc, 200, &v, none, 1000).map(|v| v.valid), Some(1005));
        assert!(judge(&head(&[("Cache-Control", "private")]), 200, &v, none, 0).is_none());
        let xa = head(&[("X-Accel-Expires", "7"), ("Cache-Control", "max-age=5")]);
        assert_eq!(judge(&xa, 200, &v, none, 1000).map(|v| v.valid), Some(1007));
        assert!(judge(&head(&[("Set-Cookie", "a=b")]), 200, &v, none, 0).is_none());
        let ign = |h: &str| h == "set-cookie";
        assert!(judge(&head(&[("Set-Cookie", "a=b")]), 200, &v, ign, 0).is_some());
        assert!(judge(&head(&[("Vary", "*")]), 200, &v, none, 0).is_none());
    }

    #[test]
    fn cache_control_extensions() {
        let none = |_: &str| false;
        let times = |pairs: &[(&str, &str)]| {
            judge(&head(pairs), 200, &[], none, 1000).map(|v| (v.valid, v.updating, v.error))
        };
        let swr = ("Cache-Control", "max-age=5, stale-while-revalidate=30");
        assert_eq!(times(&[swr]), Some((1005, 30, 30)));
        let both = (
            "Cache-Control",
            "max-age=5, stale-while-revalidate=30, stale-if-error=90",
        );
        assert_eq!(times(&[both]), Some((1005, 30, 90)));
        // X-Accel-Expires wins over no-cache, but the extensions still count, either order.
        let xa = ("X-Accel-Expires", "60");
        let nc = ("Cache-Control", "no-cache, stale-if-error=9");
        assert_eq!(times(&[xa, nc]), Some((1060, 0, 9)));
        assert_eq!(times(&[nc, xa]), Some((1060, 0, 9)));
        // A bad number keeps the answer out.
        assert_eq!(
            times(&[("Cache-Control", "max-age=5, stale-if-error=x")]),
            None
        );
    }
}

//! `split_clients string $name { percent value; ... * value; }` (http context; nginx's
//! ngx_http_split_clients_module), for A/B tests: the string (with variables) is hashed
//! with MurmurHash2 and `$name` takes the value of the share the hash falls in, the shares
//! laid out from 0 in the order written; `*` takes the rest. When the shares leave some of
//! the range uncovered and no `*` is given, those requests get an empty value. Percentages
//! have at most two decimals and together may not pass 100%. Values are literal text.

use super::{LoadCtx, LocConf};
use crate::http::request::Request;
use crate::http::user_vars::{self, Computed};
use crate::http::variables::{Sent, Template};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use std::sync::Arc;

pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "split_clients",
    ctx: Ctx::HTTP,
    args: Args::Exactly(2),
    block: true,
}];

#[derive(Debug)]
pub struct Split {
    key: Template,
    shares: Shares,
}

/// The block's shares: each one's upper bound (exclusive) in hash space, `None` for `*`,
/// in order. Shared with the stream context's `split_clients` (`stream::map`).
#[derive(Debug)]
pub struct Shares {
    parts: Vec<(Option<u32>, String)>,
}

pub fn set(d: &Directive, _lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let (name, split) = parse(d)?;
    user_vars::define_computed(name, Arc::new(split)).map_err(|e| d.error(e))?;
    Ok(())
}

fn parse(d: &Directive) -> Result<(&str, Split), ConfError> {
    let key = Template::compile(&d.args[0]).map_err(|e| d.error(e))?;
    let name = d.args[1]
        .strip_prefix('$')
        .filter(|n| !n.is_empty())
        .ok_or_else(|| d.error(format!("invalid variable name \"{}\"", d.args[1])))?;
    Ok((
        name,
        Split {
            key,
            shares: shares(d)?,
        },
    ))
}

/// The shares of a `split_clients` block.
pub fn shares(d: &Directive) -> Result<Shares, ConfError> {
    let mut parts = Vec::new();
    // In hundredths of a percent, as nginx counts; `*` makes it 100%.
    let mut sum: u32 = 0;
    let mut last: u32 = 0;
    for e in d.block.as_deref().unwrap_or_default() {
        if e.block.is_some() {
            return Err(e.error("unexpected \"{\""));
        }
        let [value] = e.args.as_slice() else {
            return Err(e.error("invalid number of the split_clients parameters"));
        };
        if e.name == "*" {
            sum = 10_000;
            parts.push((None, value.clone()));
            continue;
        }
        let share = e
            .name
            .strip_suffix('%')
            .and_then(hundredths)
            .filter(|&n| n > 0)
            .ok_or_else(|| e.error(format!("invalid percent value \"{}\"", e.name)))?;
        sum = sum.saturating_add(share);
        if sum > 10_000 {
            return Err(e.error("percent total is greater than 100%"));
        }
        // nginx's arithmetic, truncations included, so a key lands in the same share.
        last = last.wrapping_add((u64::from(share) * u64::from(u32::MAX) / 10_000) as u32);
        parts.push((Some(last), value.clone()));
    }
    Ok(Shares { parts })
}

/// `12.34` as 1234: digits with at most one dot and two decimals.
fn hundredths(s: &str) -> Option<u32> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = |t: &str| t.bytes().all(|c| c.is_ascii_digit());
    if (int.is_empty() && frac.is_empty()) || !digits(int) || !digits(frac) || frac.len() > 2 {
        return None;
    }
    let mut n: u32 = 0;
    for c in int.bytes().chain(frac.bytes().chain(*b"00").take(2)) {
        n = n.checked_mul(10)?.checked_add(u32::from(c - b'0'))?;
    }
    Some(n)
}

/// MurmurHash2 (seed 0) as nginx's `ngx_murmur_hash2`. Written out because the shares must
/// match nginx's bit for bit (clients keep their variant when a site moves to gannet); it
/// is a dozen lines, and no crate in use offers this 32-bit variant.
fn murmur2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    let mut h = data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        for (i, &b) in tail.iter().enumerate() {
            h ^= u32::from(b) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^ (h >> 15)
}

impl Shares {
    /// The value of the share `key` hashes into.
    pub fn pick(&self, key: &str) -> &str {
        let hash = murmur2(key.as_bytes());
        self.parts
            .iter()
            .find(|(bound, _)| bound.is_none_or(|b| hash < b))
            .map_or("", |(_, v)| v)
    }
}

impl Computed for Split {
    fn value(&self, req: &Request, sent: Option<&Sent>) -> String {
        self.shares.pick(&self.key.eval(req, sent)).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn split(body: &str) -> Result<Split, String> {
        let _scope = user_vars::LoadScope::begin();
        let src = format!("split_clients \"${{remote_addr}}AAA\" $v {{\n{body}\n}}");
        let tree =
            gannet_conf::parse_str(&src, "t.conf", Path::new("/")).map_err(|e| e.to_string())?;
        parse(&tree[0]).map(|(_, s)| s).map_err(|e| e.to_string())
    }

    #[test]
    fn murmur2_matches_the_reference() {
        // Values of the reference MurmurHash2 (seed 0), every tail length.
        assert_eq!(murmur2(b""), 0);
        assert_eq!(murmur2(b"a"), 0x9268_5f5e);
        assert_eq!(murmur2(b"ab"), 0x1aa1_4063);
        assert_eq!(murmur2(b"abc"), 0x1357_7c9b);
        assert_eq!(murmur2(b"abcd"), 0x2687_3021);
        assert_eq!(murmur2(b"abcde"), 0x5f09_a8de);
        assert_eq!(murmur2(b"127.0.0.1AAA"), 0xb5fc_5e4b);
    }

    #[test]
    fn shares_in_order() {
        let s = split("50% a;\n25.5% b;\n* c;").unwrap();
        let bounds: Vec<_> = s.shares.parts.iter().map(|p| p.0).collect();
        assert_eq!(bounds, [Some(2_147_483_647), Some(3_242_700_307), None]);
        assert_eq!(hundredths("0.125"), None);
        assert_eq!(hundredths("0.12"), Some(12));
        assert_eq!(hundredths("100"), Some(10_000));
        assert_eq!(hundredths(".5"), Some(50));
        assert_eq!(hundredths("."), None);
        assert_eq!(hundredths("1.2.3"), None);
    }

    #[test]
    fn errors() {
        for (body, msg) in [
            (
                "60% a;\n50% b;",
                "t.conf:3: percent total is greater than 100%",
            ),
            ("* a;\n1% b;", "percent total is greater than 100%"),
            ("0% a;", "invalid percent value \"0%\""),
            ("5 a;", "invalid percent value \"5\""),
            ("x% a;", "invalid percent value \"x%\""),
            ("5% a b;", "invalid number of the split_clients parameters"),
        ] {
            let err = split(body).err().unwrap_or_default();
            assert!(err.contains(msg), "{body}: {err}");
        }
    }
}

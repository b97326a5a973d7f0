//! ngx_http_secure_link_module: `secure_link`, `secure_link_md5`, `secure_link_secret`
//! and the variables `$secure_link` and `$secure_link_expires`.
//!
//! The module only computes variables; a config acts on them (`if ($secure_link = "")
//! { return 403; }`). Two forms, as in nginx:
//!
//! - `secure_link $hash[,$expires]` with `secure_link_md5 "text"`: the hash is the
//!   base64url MD5 of the text (decoded with nginx's lenient rules); `$secure_link` is
//!   empty when it does not match, `0` when it matches but the expiry time has passed, `1`
//!   when it matches and has not.
//! - `secure_link_secret word`: the request URI is `/prefix/<md5 hex>/<link>`, the hash
//!   that of `<link>` followed by the word; `$secure_link` is `<link>` when it matches.

use super::{LoadCtx, LocConf};
use crate::http::request::Request;
use crate::http::variables::Template;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use md5::{Digest, Md5};
use std::sync::Arc;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "secure_link",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "secure_link_md5",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "secure_link_secret",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
];

#[derive(Debug, Clone, Default)]
pub struct SecureLinkConf {
    /// `secure_link`: `Some(None)` is nginx's "set to nothing" after a merge.
    variable: Option<Option<Arc<Template>>>,
    md5: Option<Option<Arc<Template>>>,
    secret: Option<Arc<str>>,
}

impl SecureLinkConf {
    /// nginx's merge: a level with a secret takes nothing from above (and may not mix it
    /// with the other two); one with neither `secure_link` nor `secure_link_md5` inherits
    /// the secret.
    pub fn merge(&mut self, p: &SecureLinkConf) {
        if self.secret.is_some() {
            return;
        }
        if self.variable.is_none() {
            self.variable = Some(p.variable.clone().flatten());
        }
        if self.md5.is_none() {
            self.md5 = Some(p.md5.clone().flatten());
        }
        if matches!((&self.variable, &self.md5), (Some(None), Some(None))) {
            self.secret = p.secret.clone();
        }
    }

    /// The check nginx makes while merging: a level with a secret and either other
    /// directive (its own; the secret blocks inheritance of them).
    fn mixed(&self) -> bool {
        self.secret.is_some() && (self.variable.is_some() || self.md5.is_some())
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.secure_link;
    let dup = || d.error(format!("\"{}\" directive is duplicate", d.name));
    let tpl = || -> Result<Option<Arc<Template>>, ConfError> {
        Ok(Some(Arc::new(
            Template::compile(&d.args[0]).map_err(|e| d.error(e))?,
        )))
    };
    match d.name.as_str() {
        "secure_link" => {
            if c.variable.is_some() {
                return Err(dup());
            }
            c.variable = Some(tpl()?);
        }
        "secure_link_md5" => {
            if c.md5.is_some() {
                return Err(dup());
            }
            c.md5 = Some(tpl()?);
        }
        _ => {
            if c.secret.is_some() {
                return Err(dup());
            }
            c.secret = Some(Arc::from(d.args[0].as_str()));
        }
    }
    if c.mixed() {
        return Err(d.error(
            "\"secure_link_secret\" cannot be mixed with \"secure_link\" and \"secure_link_md5\"",
        ));
    }
    Ok(())
}

/// Append `$secure_link`; records `$secure_link_expires` on the request as nginx does (it
/// is only known once `$secure_link` was evaluated).
pub fn append_secure_link(out: &mut String, req: &Request) {
    let c = &req.conf.secure_link;
    if let Some(secret) = &c.secret {
        if let Some(link) = old_style(req.head.target(), secret.as_bytes()) {
            out.push_str(&String::from_utf8_lossy(link));
        }
        return;
    }
    let (Some(Some(var)), Some(Some(md5))) = (&c.variable, &c.md5) else {
        return;
    };
    let val = var.eval(req, None);
    let (hash, expires) = match val.split_once(',') {
        Some((h, e)) => {
            let Some(t) = atotm(e.as_bytes()).filter(|&t| t > 0) else {
                return;
            };
            *req.secure_link_expires.borrow_mut() = Some(e.to_string());
            (h, Some(t))
        }
        None => (val.as_str(), None),
    };
    if hash.len() > 24 {
        return;
    }
    let Some(got) = decode_base64url(hash.as_bytes()) else {
        return;
    };
    if got.len() != 16 {
        return;
    }
    let want = Md5::digest(md5.eval(req, None).as_bytes());
    if !same(&got, &want) {
        return;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    out.push(if expires.is_some_and(|t| t < now) {
        '0'
    } else {
        '1'
    });
}

/// `$secure_link_expires`: the time after the comma, once `$secure_link` found one.
pub fn append_expires(out: &mut String, req: &Request) {
    if let Some(e) = req.secure_link_expires.borrow().as_deref() {
        out.push_str(e);
    }
}

/// Compare without an early exit, as nginx does (no timing hint of how much matched).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `secure_link_secret`: the raw URI `/prefix/<32 hex>/<link>` whose hex is the MD5 of
/// link and secret; the link (which may hold `?args`, as nginx reads the unparsed URI).
fn old_style<'a>(uri: &'a [u8], secret: &[u8]) -> Option<&'a [u8]> {
    let rest = uri.get(1..)?;
    let start = memchr::memchr(b'/', rest)? + 1;
    let rest = &rest[start..];
    let end = memchr::memchr(b'/', rest)?;
    let (hex, link) = (&rest[..end], &rest[end + 1..]);
    if hex.len() != 32 || link.is_empty() {
        return None;
    }
    let mut h = Md5::new();
    h.update(link);
    h.update(secret);
    let want = h.finalize();
    let mut got = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        got[i] = u8::from_str_radix(s, 16).ok()?;
    }
    same(&got, &want).then_some(link)
}

/// nginx's `ngx_atotm`: digits only, no sign, no overflow.
fn atotm(s: &[u8]) -> Option<i64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0i64, |v, &c| {
        if !c.is_ascii_digit() {
            return None;
        }
        v.checked_mul(10)?.checked_add(i64::from(c - b'0'))
    })
}

/// The value of one base64 character in `alphabet`'s two extra places (62, 63).
fn sextet(c: u8, extra: [u8; 2]) -> Option<u8> {
    Some(match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        _ if c == extra[0] => 62,
        _ if c == extra[1] => 63,
        _ => return None,
    })
}

/// nginx's `ngx_decode_base64_internal`: everything up to the first `=` must be in the
/// alphabet (what follows it is ignored), a length of 4n+1 is refused, and the bits of an
/// incomplete last group are dropped rather than checked. A strict decoder would refuse
/// links and cookies nginx accepts, so this one is nginx's, not a library's.
pub fn decode_base64_lenient(src: &[u8], extra: [u8; 2]) -> Option<Vec<u8>> {
    let len = memchr::memchr(b'=', src).unwrap_or(src.len());
    let vals: Vec<u8> = src[..len]
        .iter()
        .map(|&c| sextet(c, extra))
        .collect::<Option<_>>()?;
    if len % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(len * 3 / 4);
    for g in vals.chunks(4) {
        if g.len() > 1 {
            out.push(g[0] << 2 | g[1] >> 4);
        }
        if g.len() > 2 {
            out.push(g[1] << 4 | g[2] >> 2);
        }
        if g.len() > 3 {
            out.push(g[2] << 6 | g[3]);
        }
    }
    Some(out)
}

fn decode_base64url(src: &[u8]) -> Option<Vec<u8>> {
    decode_base64_lenient(src, [b'-', b'_'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_as_nginx() {
        // MD5("") in base64url, with and without padding, and with junk after the `=`.
        let want = Md5::digest(b"").to_vec();
        assert_eq!(
            decode_base64url(b"1B2M2Y8AsgTpgAmY7PhCfg").as_deref(),
            Some(&want[..])
        );
        assert_eq!(
            decode_base64url(b"1B2M2Y8AsgTpgAmY7PhCfg==").as_deref(),
            Some(&want[..])
        );
        assert_eq!(
            decode_base64url(b"1B2M2Y8AsgTpgAmY7PhCfg=x!").as_deref(),
            Some(&want[..])
        );
        // Trailing bits that are not zero are dropped, not refused.
        assert_eq!(
            decode_base64url(b"1B2M2Y8AsgTpgAmY7PhCfh").as_deref(),
            Some(&want[..])
        );
        assert_eq!(decode_base64url(b"1B2M2Y8AsgTpgAmY7PhCf+"), None);
        assert_eq!(decode_base64url(b"abcde"), None);
        assert_eq!(decode_base64url(b"").as_deref(), Some(&[][..]));
    }

    #[test]
    fn parses_times_as_nginx() {
        assert_eq!(atotm(b"2147483647"), Some(2147483647));
        assert_eq!(atotm(b""), None);
        assert_eq!(atotm(b"-1"), None);
        assert_eq!(atotm(b"12a"), None);
        assert_eq!(atotm(b"99999999999999999999"), None);
    }

    #[test]
    fn old_style_links() {
        let hex = |d: &[u8]| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let h = {
            let mut m = Md5::new();
            m.update(b"file.txt");
            m.update(b"word");
            hex(&m.finalize())
        };
        let uri = format!("/p/{h}/file.txt");
        assert_eq!(old_style(uri.as_bytes(), b"word"), Some(&b"file.txt"[..]));
        assert_eq!(old_style(uri.as_bytes(), b"other"), None);
        assert_eq!(old_style(format!("/p/{h}/").as_bytes(), b"word"), None);
        assert_eq!(old_style(b"/p/abc/file.txt", b"word"), None);
    }
}

//! memcached, the configuration side (nginx's ngx_http_memcached_module): `memcached_pass`
//! answers a GET or HEAD with the value memcached holds under `$memcached_key` (a variable
//! the config sets). It is one more upstream protocol of the gateway (`Proto::Memcached`),
//! so address, unix socket and `upstream` group, balancing and next-upstream are the other
//! `*_pass`es'; the I/O, `get KEY\r\n` and the `VALUE key flags len` answer, is in
//! `conn::gateway`.
//!
//! Only nginx's subset of the upstream directives exists here, and `memcached_next_upstream`
//! has its own words (`invalid_response`, `not_found`), kept internally under the shared
//! names (`invalid_header`, `http_404`) that the gateway's retry rules read. nginx hard-codes
//! the rest: no temporary file for an answer, no request headers or body,
//! a miss (404) always answered by gannet's own page or the location's `error_page`.

use super::gateway::{self, spec, GatewayConf, Proto};
use super::{inherit, LoadCtx, LocConf};
use crate::http::request::Request;
use crate::http::user_vars::{self, UserVar};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use std::sync::Arc;

pub const DIRECTIVES: &[Spec] = &[
    spec(
        "memcached_pass",
        Ctx(Ctx::LOCATION.0 | Ctx::IF.0),
        Args::Exactly(1),
    ),
    spec("memcached_connect_timeout", Ctx::HSL, Args::Exactly(1)),
    spec("memcached_send_timeout", Ctx::HSL, Args::Exactly(1)),
    spec("memcached_read_timeout", Ctx::HSL, Args::Exactly(1)),
    spec("memcached_buffer_size", Ctx::HSL, Args::Exactly(1)),
    spec("memcached_next_upstream", Ctx::HSL, Args::AtLeast(1)),
    spec("memcached_next_upstream_tries", Ctx::HSL, Args::Exactly(1)),
    spec(
        "memcached_next_upstream_timeout",
        Ctx::HSL,
        Args::Exactly(1),
    ),
    spec("memcached_socket_keepalive", Ctx::HSL, Args::Exactly(1)),
    spec("memcached_gzip_flag", Ctx::HSL, Args::Exactly(1)),
];

#[derive(Debug, Clone, Default)]
pub struct MemcachedConf {
    pub gw: GatewayConf,
    /// `memcached_gzip_flag`: the flag bits that mark a value as gzipped; 0: none.
    pub gzip_flag: Option<u64>,
    /// `$memcached_key`, known where `memcached_pass` is.
    pub key: Option<UserVar>,
}

impl MemcachedConf {
    pub fn merge(&mut self, parent: &MemcachedConf) {
        self.gw.merge(&parent.gw);
        inherit!(self, parent, gzip_flag, key);
    }

    pub fn gzip_flag(&self) -> u64 {
        self.gzip_flag.unwrap_or(0)
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let a0 = d.args[0].as_str();
    match d.name.as_str() {
        "memcached_pass" => {
            gateway::set(d, Proto::Memcached, lc, ctx)?;
            let c = &mut lc.memcached;
            // nginx's hard-coded upstream settings for memcached. nginx does not buffer;
            // gannet reads an answer that came whole at once (it is then sent with ranges,
            // nginx's `force_ranges`), but never into a temporary file.
            c.gw.max_temp_file_size = Some(0);
            c.gw.pass_request_body = Some(false);
            c.gw.pass_request_headers = Some(false);
            // A read of `$memcached_key`: nginx fails the load (`unknown "memcached_key"
            // variable`) when no `set` or `map` defines it.
            c.key = user_vars::reference("memcached_key");
        }
        // nginx's plain size, with no lower bound (the other protocols' check does not apply).
        "memcached_buffer_size" => lc.memcached.gw.buffer_size = Some(setters::size_arg(d, 0)?),
        "memcached_next_upstream" => {
            let mut l = Vec::with_capacity(d.args.len());
            for a in &d.args {
                l.push(match a.as_str() {
                    "error" | "timeout" | "off" => a.clone(),
                    "invalid_response" => "invalid_header".into(),
                    "not_found" => "http_404".into(),
                    // nginx's bitmask wording, without the directive's name.
                    _ => return Err(d.error(format!("invalid value \"{a}\""))),
                });
            }
            lc.memcached.gw.next_upstream = Some(Arc::new(l));
        }
        "memcached_gzip_flag" => lc.memcached.gzip_flag = Some(setters::num_arg(d, 0)?),
        _ => {
            if !gateway::set(d, Proto::Memcached, lc, ctx)? {
                unreachable!("not a memcached directive: {a0}")
            }
        }
    }
    Ok(())
}

/// The request line for `req`: `get KEY\r\n`, the key escaped as nginx's
/// `NGX_ESCAPE_MEMCACHED` (control bytes, space and `%` as `%XX`); `Err` with the error log's
/// line when `$memcached_key` is empty or unset.
pub fn request_line(req: &Request, out: &mut Vec<u8>) -> Result<(), &'static str> {
    let mut key = String::new();
    if let Some(v) = &req.conf.memcached.key {
        user_vars::append(&mut key, v, req, None);
    }
    if key.is_empty() {
        return Err("the \"$memcached_key\" variable is not set");
    }
    out.extend_from_slice(b"get ");
    escape_key(key.as_bytes(), out);
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// The key as sent (and as the answer's `VALUE` line must repeat it).
fn escape_key(key: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in key {
        if b <= b' ' || b == b'%' {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        } else {
            out.push(b);
        }
    }
}

/// The first line of memcached's answer, parsed as nginx's
/// `ngx_http_memcached_process_header`.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// `VALUE key flags len`: the value follows, gzipped if the flags say so.
    Value { len: u64, gzip: bool },
    /// `END`: no such key.
    Miss,
}

/// Parse `line` (without its CR LF) of an answer to a request for `key` (as sent); `Err`
/// with nginx's error log wording.
pub fn parse_reply(line: &[u8], key: &[u8], gzip_flag: u64) -> Result<Reply, String> {
    let shown = || String::from_utf8_lossy(line).into_owned();
    if line == b"END" {
        return Ok(Reply::Miss);
    }
    let Some(rest) = line.strip_prefix(b"VALUE ") else {
        return Err(format!("memcached sent invalid response: \"{}\"", shown()));
    };
    let Some(rest) = rest.strip_prefix(key) else {
        return Err(format!(
            "memcached sent invalid key in response \"{}\" for key \"{}\"",
            shown(),
            String::from_utf8_lossy(key)
        ));
    };
    let Some(rest) = rest.strip_prefix(b" ") else {
        return Err(format!("memcached sent invalid response: \"{}\"", shown()));
    };
    // nginx splits at the first space after the flags: the rest (a CAS unique included)
    // must be the length.
    let Some(sp) = rest.iter().position(|&b| b == b' ') else {
        return Err(format!("memcached sent invalid response: \"{}\"", shown()));
    };
    let (flags, len) = (&rest[..sp], &rest[sp + 1..]);
    let mut gzip = false;
    if gzip_flag != 0 {
        let Some(f) = number(flags) else {
            return Err(format!(
                "memcached sent invalid flags in response \"{}\" for key \"{}\"",
                shown(),
                String::from_utf8_lossy(key)
            ));
        };
        gzip = f & gzip_flag != 0;
    }
    match number(len) {
        Some(len) => Ok(Reply::Value { len, gzip }),
        None => Err(format!(
            "memcached sent invalid length in response \"{}\" for key \"{}\"",
            shown(),
            String::from_utf8_lossy(key)
        )),
    }
}

/// nginx's `ngx_atoi`/`ngx_atoof`: digits only, at least one, no overflow.
fn number(s: &[u8]) -> Option<u64> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_as_nginx() {
        let mut out = Vec::new();
        escape_key(b"/a b%c\x01\xc3\xa9~", &mut out);
        assert_eq!(out, b"/a%20b%25c%01\xc3\xa9~");
    }

    #[test]
    fn parses_replies() {
        assert_eq!(parse_reply(b"END", b"k", 0), Ok(Reply::Miss));
        assert_eq!(
            parse_reply(b"VALUE k 2 5", b"k", 2),
            Ok(Reply::Value { len: 5, gzip: true })
        );
        assert_eq!(
            parse_reply(b"VALUE k 1 5", b"k", 2),
            Ok(Reply::Value {
                len: 5,
                gzip: false
            })
        );
        assert!(parse_reply(b"VALUE j 0 5", b"k", 0).is_err());
        assert!(parse_reply(b"VALUE k 0 x", b"k", 0).is_err());
        assert!(parse_reply(b"VALUE k x 5", b"k", 1).is_err());
        assert!(parse_reply(b"SERVER_ERROR out of memory", b"k", 0).is_err());
    }
}

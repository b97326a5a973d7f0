//! The request path: one `Request` type, virtual host and location selection, the phases,
//! and the response with its filters.

pub mod browser;
pub mod cidr;
pub mod compress;
pub mod conditional;
pub mod encoder;
pub mod flow;
pub mod handler;
pub mod regex;
pub mod request;
pub mod response;
pub mod router;
pub mod user_vars;
pub mod variables;

/// nginx's ngx_http_parse_unsafe_uri (a DAV Destination, an SSI include): the path before
/// `?`, percent-decoded, refused if it
/// is empty, holds a NUL or climbs with `..`.
pub fn unsafe_uri(raw: &str) -> Option<String> {
    let path = raw.split('?').next().unwrap_or("");
    let climbs = |p: &[u8]| {
        p.contains(&0)
            || p.starts_with(b"../")
            || p == b".."
            || p.windows(4).any(|w| w == b"/../")
            || p.ends_with(b"/..")
    };
    if path.is_empty() || climbs(path.as_bytes()) {
        return None;
    }
    let mut out = Vec::with_capacity(path.len());
    let b = path.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (b[i], b.get(i + 1).copied(), b.get(i + 2).copied()) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                let v = hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0);
                out.push(v as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    if climbs(&out) {
        return None;
    }
    String::from_utf8(out).ok()
}

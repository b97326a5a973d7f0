//! Request-target handling: splitting the target into path, query and (absolute-form) host,
//! percent-decoding and normalising the path the way nginx does before location matching,
//! and the escaping helpers for building Location headers and HTML listings.

use crate::h1::ParseError;

/// A request target, decoded and normalised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Percent-decoded, normalised path (always starts with `/`, or is `*`). A trailing `/`
    /// is kept: it marks a directory request.
    pub path: String,
    /// The raw query after `?` (not decoded), without the `?`.
    pub query: Option<String>,
    /// Host from an absolute-form target, lowercased, without the port. IPv6 literals keep
    /// their brackets.
    pub host: Option<String>,
}

const fn bad(reason: &'static str) -> ParseError {
    ParseError::BadRequest(reason)
}

/// Parse a request target: origin-form (`/p?q`), absolute-form (`http://h:1/p?q`) or `*`.
/// Anything else, a bad percent-escape, a decoded NUL, a path that is not UTF-8 once
/// decoded, or one whose `..` segments climb above the root is a 400.
pub fn parse_target(raw: &[u8]) -> Result<Target, ParseError> {
    parse_target_with(raw, true)
}

/// [`parse_target`], with repeated slashes kept as they are (`merge_slashes off`): an empty
/// segment is one of its own, which a following `..` removes, as nginx's
/// ngx_http_parse_complex_uri.
pub fn parse_target_with(raw: &[u8], merge_slashes: bool) -> Result<Target, ParseError> {
    parse_target_into(raw, merge_slashes, String::new())
}

/// [`parse_target_with`], the usual target's path written into `path` (emptied first): a
/// server hands in the last request's path buffer, and the request costs no allocation for
/// its path (a `malloc` and a `free`, about 130 instructions, callgrind).
pub fn parse_target_into(
    raw: &[u8],
    merge_slashes: bool,
    path: String,
) -> Result<Target, ParseError> {
    match plain_origin_into(raw, path) {
        Some(t) => Ok(t),
        None => parse_general(raw, merge_slashes),
    }
}

/// Every target form, every check: what [`plain_origin`] does not take.
fn parse_general(raw: &[u8], merge_slashes: bool) -> Result<Target, ParseError> {
    if raw.iter().any(|&c| c <= b' ' || c == 0x7f) {
        return Err(bad("invalid character in request target"));
    }
    // A fragment is never meant for the server (RFC 9110 4.2.4); nginx drops it too.
    let raw = match memchr::memchr(b'#', raw) {
        Some(i) => &raw[..i],
        None => raw,
    };
    if raw == b"*" {
        return Ok(Target {
            path: "*".to_string(),
            query: None,
            host: None,
        });
    }
    let (host, rest) = match raw.first() {
        Some(b'/') => (None, raw),
        _ => {
            let (host, rest) = split_absolute(raw)?;
            (Some(host), rest)
        }
    };
    let (path, query) = match memchr::memchr(b'?', rest) {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let path = if path.is_empty() {
        "/".to_string()
    } else {
        normalize_path(path, merge_slashes)?
    };
    let query = match query {
        Some(q) => Some(String::from_utf8(q.to_vec()).map_err(|_| bad("invalid query"))?),
        None => None,
    };
    Ok(Target { path, query, host })
}

/// The usual target in one pass: origin-form, a path of printable ASCII with no escape and
/// nothing to resolve (no `//`, no `/.`), then maybe a query. The path is then its own
/// normal form and is copied as it is. `None` sends the target down the general path
/// (which also gives the errors): a second pass for the control bytes, then the fragment,
/// the query, the decoding, a UTF-8 check and two searches, several hundred instructions
/// for a short path where this is about one compare a byte (callgrind, robots.txt).
#[cfg(test)]
fn plain_origin(raw: &[u8]) -> Option<Target> {
    plain_origin_into(raw, String::new())
}

fn plain_origin_into(raw: &[u8], mut path: String) -> Option<Target> {
    if raw.first() != Some(&b'/') {
        return None;
    }
    let mut end = raw.len();
    let mut prev = 0u8;
    for (i, &c) in raw.iter().enumerate() {
        match c {
            b'?' | b'#' => {
                end = i;
                break;
            }
            // Escapes, bytes past ASCII (and DEL), spaces and controls.
            b'%' | 0x7f.. | ..=b' ' => return None,
            b'/' | b'.' if prev == b'/' => return None,
            _ => {}
        }
        prev = c;
    }
    // The query runs to a fragment (dropped); it is checked as the general path does.
    let query = match raw.get(end) {
        Some(b'?') => {
            let rest = &raw[end + 1..];
            let q_end = memchr::memchr(b'#', rest).unwrap_or(rest.len());
            if raw[end..].iter().any(|&c| c <= b' ' || c == 0x7f) {
                return None;
            }
            Some(String::from_utf8(rest[..q_end].to_vec()).ok()?)
        }
        Some(_) => {
            if raw[end..].iter().any(|&c| c <= b' ' || c == 0x7f) {
                return None;
            }
            None
        }
        None => None,
    };
    path.clear();
    // SAFETY: every byte before `end` was checked above to be from `!` to `~` (ASCII), so
    // the bytes are UTF-8. (The check itself was 93 instructions for `/robots.txt`,
    // callgrind: a path of a few bytes does not reach its word-at-a-time loop.)
    path.push_str(unsafe { std::str::from_utf8_unchecked(&raw[..end]) });
    Some(Target {
        path,
        query,
        host: None,
    })
}

/// Split `scheme://authority/rest` into the lowercased host and the part from the path on.
fn split_absolute(raw: &[u8]) -> Result<(String, &[u8]), ParseError> {
    let sep = memchr::memmem::find(raw, b"://").ok_or(bad("invalid request target"))?;
    let scheme = &raw[..sep];
    if !scheme.eq_ignore_ascii_case(b"http") && !scheme.eq_ignore_ascii_case(b"https") {
        return Err(bad("invalid request target scheme"));
    }
    let after = &raw[sep + 3..];
    let end = after
        .iter()
        .position(|&c| c == b'/' || c == b'?')
        .unwrap_or(after.len());
    let authority = &after[..end];
    let host = authority_host(authority).ok_or(bad("invalid host in request target"))?;
    Ok((host.to_ascii_lowercase(), &after[end..]))
}

/// The host part of an authority, validated: a reg-name of letters, digits, `-`, `.` and `_`
/// or a bracketed IP literal (IPv6, or RFC 3986's IPvFuture: letters, digits, `:`, the
/// unreserved and sub-delims characters, as nginx's request line parser takes), then an
/// optional `:port` of digits. Userinfo (`@`) is refused, as nginx does.
fn authority_host(a: &[u8]) -> Option<String> {
    let (host, port) = if a.first() == Some(&b'[') {
        let close = a.iter().position(|&c| c == b']')?;
        let inner = &a[1..close];
        if inner.is_empty()
            || !inner
                .iter()
                .all(|c| c.is_ascii_alphanumeric() || b":-._~!$&'()*+,;=".contains(c))
        {
            return None;
        }
        (&a[..=close], &a[close + 1..])
    } else {
        let colon = a.iter().position(|&c| c == b':').unwrap_or(a.len());
        let host = &a[..colon];
        if host.is_empty()
            || !host
                .iter()
                .all(|c| c.is_ascii_alphanumeric() || b"-._".contains(c))
        {
            return None;
        }
        (host, &a[colon..])
    };
    match port.split_first() {
        None => {}
        Some((b':', digits)) if digits.iter().all(u8::is_ascii_digit) => {}
        Some(_) => return None,
    }
    // nginx's ngx_http_validate_host, as for the Host header: no `..`, one trailing dot
    // dropped, and something left.
    if host.windows(2).any(|w| w == b"..") {
        return None;
    }
    let host = host.strip_suffix(b".").unwrap_or(host);
    if host.is_empty() {
        return None;
    }
    // Only ASCII passed the checks above.
    String::from_utf8(host.to_vec()).ok()
}

/// Percent-decode `raw` (which starts with `/`) and resolve `.`, `..` and repeated slashes.
fn normalize_path(raw: &[u8], merge: bool) -> Result<String, ParseError> {
    let decoded = percent_decode(raw)?;
    if decoded.contains(&0) {
        return Err(bad("NUL in request path"));
    }
    let decoded = String::from_utf8(decoded).map_err(|_| bad("request path is not UTF-8"))?;
    // Fast path: most paths have nothing to resolve.
    if !decoded.contains("//") && !decoded.contains("/.") {
        return Ok(decoded);
    }
    let mut out = String::with_capacity(decoded.len());
    // Whether the result ends in a directory (`/a/`, `/a/.`, `/a/b/..`).
    let mut dir = false;
    let mut segs = decoded.split('/').skip(1).peekable();
    while let Some(seg) = segs.next() {
        match seg {
            // Unmerged, an empty segment (not the trailing slash) stays: `//`.
            "" if !merge && segs.peek().is_some() => {
                out.push('/');
                dir = false;
            }
            "" | "." => dir = true,
            ".." => {
                // `out` is `/seg/seg...`: dropping the last segment means cutting at its `/`.
                let cut = out.rfind('/').ok_or(bad("request path leaves the root"))?;
                out.truncate(cut);
                dir = true;
            }
            s => {
                out.push('/');
                out.push_str(s);
                dir = false;
            }
        }
    }
    if out.is_empty() || dir {
        out.push('/');
    }
    Ok(out)
}

fn percent_decode(raw: &[u8]) -> Result<Vec<u8>, ParseError> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while let Some(&c) = raw.get(i) {
        if c == b'%' {
            let hi = raw.get(i + 1).and_then(|&h| hex(h));
            let lo = raw.get(i + 2).and_then(|&l| hex(l));
            let (Some(hi), Some(lo)) = (hi, lo) else {
                return Err(bad("invalid percent-escape in path"));
            };
            out.push(hi << 4 | lo);
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    Ok(out)
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

/// Whether a path byte must be percent-encoded: what nginx's `ngx_escape_uri` escapes for
/// URIs (controls, space, `#`, `%`, `?`, DEL, non-ASCII) plus the bytes that would break
/// out of an HTML attribute or are unsafe in URLs (`"`, `<`, `>`, `` ` ``, `\`, `^`, `{`,
/// `|`, `}`).
fn needs_escape(c: u8) -> bool {
    c <= b' ' || c >= 0x7f || b"\"#%<>?\\^`{|}".contains(&c)
}

/// Percent-encode a decoded path for a Location header or a link.
pub fn percent_encode_path(s: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(s.len());
    for &c in s.as_bytes() {
        if needs_escape(c) {
            out.push('%');
            out.push(char::from(HEX[usize::from(c >> 4)]));
            out.push(char::from(HEX[usize::from(c & 15)]));
        } else {
            out.push(char::from(c));
        }
    }
    out
}

/// Escape text for HTML element content and quoted attribute values.
pub fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(ch),
        }
    }
    out
}

#[cfg(test)]
#[path = "uri_tests.rs"]
mod tests;

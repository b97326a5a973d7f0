//! HTTP Basic authentication, as nginx's ngx_http_auth_basic_module: `auth_basic REALM |
//! off` and `auth_basic_user_file FILE` (http, server, location, `limit_except`; both may
//! hold variables), checked in the access phase with `allow` / `deny` (see `satisfy` in
//! `modules::access`). `$remote_user` is the user a request's Basic credentials name.
//!
//! The user file is read on every request, as nginx does, so edits apply at once. Lines are
//! `user:password[:comment]`, `#` starts a comment line. Passwords may be `{PLAIN}text`,
//! `{SHA}base64(SHA-1)`, `{SSHA}base64(SHA-1 + salt)`, Apache's `$apr1$` (MD5-based), or
//! anything the system's crypt(3) knows (libxcrypt on Debian: `$y$` yescrypt, `$2b$`/`$2y$`
//! bcrypt, `$6$`/`$5$` SHA-crypt, `$1$` MD5-crypt, DES). As in nginx, the check runs in the
//! worker: a slow hash (bcrypt, yescrypt) holds the worker for its duration.

use super::{LoadCtx, LocConf};
use crate::errlog::{self, Level};
use crate::http::flow::Flow;
use crate::http::request::Request;
use crate::http::variables::Template;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use std::ffi::{CStr, CString};
use std::sync::Arc;

use super::gateway::spec;

const CTX: Ctx = Ctx::HSL.or(Ctx::LIMIT_EXCEPT);

pub const DIRECTIVES: &[Spec] = &[
    spec("auth_basic", CTX, Args::Exactly(1)),
    spec("auth_basic_user_file", CTX, Args::Exactly(1)),
];

#[derive(Debug, Clone, Default)]
pub struct AuthBasicConf {
    /// The realm; `Some(None)` is `auth_basic off`.
    realm: Option<Option<Template>>,
    user_file: Option<UserFile>,
}

/// `auth_basic_user_file`: the path, and for one that starts with a variable the prefix a
/// relative value is under (nginx's `ngx_get_full_name` per request).
#[derive(Debug, Clone)]
struct UserFile {
    path: Template,
    prefix: Option<Arc<std::path::Path>>,
}

impl AuthBasicConf {
    pub fn merge(&mut self, parent: &AuthBasicConf) {
        super::inherit!(self, parent, realm, user_file);
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let t = |s: &str| Template::compile(s).map_err(|e| d.error(e));
    if d.name == "auth_basic" {
        lc.auth_basic.realm = Some(match d.args[0].as_str() {
            "off" => None,
            realm => Some(t(realm)?),
        });
    } else {
        let file = &d.args[0];
        // Relative to the prefix, as nginx's ngx_conf_full_name makes it; a value that
        // starts with a variable, once it is known.
        let full = if file.starts_with('/') || file.starts_with('$') {
            file.clone()
        } else {
            ctx.prefix.join(file).to_string_lossy().into_owned()
        };
        lc.auth_basic.user_file = Some(UserFile {
            path: t(&full)?,
            prefix: file
                .starts_with('$')
                .then(|| Arc::from(ctx.prefix.as_path())),
        });
    }
    Ok(())
}

/// The user and password of a request's `Authorization: Basic` header.
pub fn credentials(req: &Request) -> Option<(String, Vec<u8>)> {
    let v = req.head.header("authorization")?;
    let v = std::str::from_utf8(v).ok()?.trim();
    let (scheme, b64) = v.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = data_encoding::BASE64.decode(b64.trim().as_bytes()).ok()?;
    let colon = raw.iter().position(|&b| b == b':')?;
    let user = String::from_utf8_lossy(&raw[..colon]).into_owned();
    Some((user, raw[colon + 1..].to_vec()))
}

/// What the check found.
pub enum Auth {
    /// No `auth_basic` here (or `off`, or no user file).
    Off,
    Passed,
    /// 401 (with the challenge set on the request), or 403 / 500 for a user file that
    /// cannot be read.
    Refused(Flow),
}

impl Auth {
    pub fn refusal(self) -> Option<Flow> {
        match self {
            Auth::Refused(f) => Some(f),
            Auth::Off | Auth::Passed => None,
        }
    }
}

/// Check the request's credentials against the user file.
pub fn check(req: &mut Request) -> Auth {
    let (Some(Some(realm)), Some(file)) =
        (&req.conf.auth_basic.realm, &req.conf.auth_basic.user_file)
    else {
        return Auth::Off;
    };
    let (realm, mut path) = (realm.eval(req, None), file.path.eval(req, None));
    if let Some(prefix) = file.prefix.as_deref().filter(|_| !path.starts_with('/')) {
        path = prefix.join(&path).to_string_lossy().into_owned();
    }
    match verdict(req, &realm, &path) {
        Some(flow) => Auth::Refused(flow),
        None => Auth::Passed,
    }
}

fn verdict(req: &mut Request, realm: &str, path: &str) -> Option<Flow> {
    let challenge = || vec![format!("Basic realm=\"{}\"", realm.replace('"', "\\\""))];
    let Some((user, password)) = credentials(req) else {
        req.auth_challenge = challenge();
        return Some(Flow::Status(401));
    };
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) => {
            errlog::request(
                Level::Error,
                req,
                format_args!("open() \"{path}\" failed ({e})"),
            );
            return Some(Flow::Status(match e.kind() {
                std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => 403,
                _ => 500,
            }));
        }
    };
    let Some(stored) = find_user(&text, user.as_bytes()) else {
        errlog::request(
            Level::Error,
            req,
            format_args!("user \"{user}\" was not found in \"{path}\""),
        );
        req.auth_challenge = challenge();
        return Some(Flow::Status(401));
    };
    if verify(&password, stored) {
        return None;
    }
    errlog::request(
        Level::Error,
        req,
        format_args!("user \"{user}\": password mismatch"),
    );
    req.auth_challenge = challenge();
    Some(Flow::Status(401))
}

/// The stored password of `user` in a user file (the field after its name, up to a `:` or
/// the line's end; `#` lines are comments).
fn find_user<'a>(text: &'a [u8], user: &[u8]) -> Option<&'a [u8]> {
    text.split(|&b| b == b'\n').find_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.starts_with(b"#") {
            return None;
        }
        let colon = line.iter().position(|&b| b == b':')?;
        if &line[..colon] != user {
            return None;
        }
        let rest = &line[colon + 1..];
        Some(&rest[..rest.iter().position(|&b| b == b':').unwrap_or(rest.len())])
    })
}

/// Whether `password` matches the stored one, in any scheme nginx reads.
fn verify(password: &[u8], stored: &[u8]) -> bool {
    let sha1 = |data: &[u8]| {
        aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, data)
            .as_ref()
            .to_vec()
    };
    if let Some(plain) = stored.strip_prefix(b"{PLAIN}") {
        return same(plain, password);
    }
    if let Some(b64) = stored.strip_prefix(b"{SHA}") {
        let Ok(digest) = data_encoding::BASE64.decode(b64) else {
            return false;
        };
        return same(&digest, &sha1(password));
    }
    if let Some(b64) = stored.strip_prefix(b"{SSHA}") {
        let Ok(raw) = data_encoding::BASE64.decode(b64) else {
            return false;
        };
        if raw.len() < 20 {
            return false;
        }
        let (digest, salt) = raw.split_at(20);
        return same(digest, &sha1(&[password, salt].concat()));
    }
    if stored.starts_with(APR1) {
        return apr1(password, stored).is_some_and(|h| same(h.as_bytes(), stored));
    }
    system_crypt(password, stored).is_some_and(|h| same(&h, stored))
}

/// Equal, in a time that does not depend on where two values of one length differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

const APR1: &[u8] = b"$apr1$";

/// Apache's `$apr1$` scheme: Poul-Henning Kamp's MD5-crypt with its own magic string,
/// which the system's crypt(3) does not know. Written here over aws-lc's MD5 (the
/// digest itself is the library's), as nginx's ngx_crypt_apr1 is.
fn apr1(password: &[u8], setting: &[u8]) -> Option<String> {
    let rest = setting.strip_prefix(APR1)?;
    let salt = &rest[..rest
        .iter()
        .position(|&b| b == b'$')
        .unwrap_or(rest.len())
        .min(8)];
    let mut alt = md5(&[password, salt, password].concat());
    let mut ctx = [password, APR1, salt].concat();
    let mut n = password.len();
    while n > 0 {
        ctx.extend_from_slice(&alt[..n.min(16)]);
        n = n.saturating_sub(16);
    }
    let mut i = password.len();
    while i != 0 {
        ctx.push(if i & 1 == 1 { 0 } else { *password.first()? });
        i >>= 1;
    }
    alt = md5(&ctx);
    for round in 0..1000 {
        let mut c = Vec::with_capacity(64);
        c.extend_from_slice(if round & 1 == 1 { password } else { &alt });
        if round % 3 != 0 {
            c.extend_from_slice(salt);
        }
        if round % 7 != 0 {
            c.extend_from_slice(password);
        }
        c.extend_from_slice(if round & 1 == 1 { &alt } else { password });
        alt = md5(&c);
    }
    let mut out = String::from("$apr1$");
    out.push_str(std::str::from_utf8(salt).ok()?);
    out.push('$');
    let f = alt;
    let groups = [
        (f[0], f[6], f[12]),
        (f[1], f[7], f[13]),
        (f[2], f[8], f[14]),
        (f[3], f[9], f[15]),
        (f[4], f[10], f[5]),
    ];
    for (a, b, c) in groups {
        to64(
            &mut out,
            u32::from(a) << 16 | u32::from(b) << 8 | u32::from(c),
            4,
        );
    }
    to64(&mut out, u32::from(f[11]), 2);
    Some(out)
}

/// crypt(3)'s base-64 digits, least significant first.
fn to64(out: &mut String, mut v: u32, n: usize) {
    const DIGITS: &[u8; 64] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    for _ in 0..n {
        out.push(char::from(DIGITS[(v & 0x3f) as usize]));
        v >>= 6;
    }
}

fn md5(data: &[u8]) -> [u8; 16] {
    let mut out = [0u8; 16];
    // SAFETY: `data` is valid for `data.len()` bytes and `out` has the 16 bytes MD5 writes;
    // the function keeps neither pointer.
    unsafe {
        aws_lc_sys::MD5(data.as_ptr(), data.len(), out.as_mut_ptr());
    }
    out
}

#[link(name = "crypt")]
extern "C" {
    /// libxcrypt's reentrant crypt(3) with a caller-given work area.
    fn crypt_rn(
        phrase: *const libc::c_char,
        setting: *const libc::c_char,
        data: *mut libc::c_void,
        size: libc::c_int,
    ) -> *mut libc::c_char;
}

/// The system's crypt(3) of `password` with `setting` (the stored hash), or `None` when it
/// does not know the scheme.
fn system_crypt(password: &[u8], setting: &[u8]) -> Option<Vec<u8>> {
    let phrase = CString::new(password).ok()?;
    let setting = CString::new(setting).ok()?;
    // Larger than libxcrypt's `struct crypt_data` (32 KiB), which crypt_rn checks.
    let mut work = vec![0u8; 64 * 1024];
    // SAFETY: both strings are NUL-terminated and live across the call; `work` is a
    // writable area of the size passed. The result points into `work` (or is null) and
    // is copied out before `work` is dropped.
    unsafe {
        let out = crypt_rn(
            phrase.as_ptr(),
            setting.as_ptr(),
            work.as_mut_ptr().cast(),
            work.len() as libc::c_int,
        );
        if out.is_null() {
            return None;
        }
        let hash = CStr::from_ptr(out).to_bytes();
        // libxcrypt marks failure with a string starting with '*'.
        (!hash.starts_with(b"*")).then(|| hash.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apr1_matches_apache() {
        // htpasswd's and openssl passwd -apr1's answers for these.
        assert_eq!(
            apr1(b"password", b"$apr1$RandSalt$").as_deref(),
            Some("$apr1$RandSalt$PgCXHRrkpSt4cbyC2C6bm/")
        );
        assert!(verify(
            b"password",
            b"$apr1$RandSalt$PgCXHRrkpSt4cbyC2C6bm/"
        ));
        assert!(!verify(
            b"Password",
            b"$apr1$RandSalt$PgCXHRrkpSt4cbyC2C6bm/"
        ));
    }

    #[test]
    fn user_lines() {
        let f = b"# admins\nann:{PLAIN}a1:Ann\r\nbob:{PLAIN}b2\n#carl:{PLAIN}x\n";
        assert_eq!(find_user(f, b"ann"), Some(&b"{PLAIN}a1"[..]));
        assert_eq!(find_user(f, b"bob"), Some(&b"{PLAIN}b2"[..]));
        assert_eq!(find_user(f, b"carl"), None);
        assert_eq!(find_user(f, b"#carl"), None);
    }
}

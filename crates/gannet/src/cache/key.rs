//! An entry's name: the md5 of its key, in hex, under `levels` folders named by the hash's
//! last hex digits (nginx's `ngx_http_file_cache_name`: `levels=1:2` puts
//! `.../c29b7f54b2df7773722d382f4809d650` in `0/65/`).

use md5::{Digest, Md5};
use std::path::{Path, PathBuf};

pub type Hash = [u8; 16];

pub fn hash(key: &[u8]) -> Hash {
    Md5::digest(key).into()
}

/// The hash of a `Vary` variant of `main`: the main key's hash with the request's values
/// of the named headers.
pub fn variant(main: &Hash, values: &[u8]) -> Hash {
    let mut h = Md5::new();
    h.update(main);
    h.update(values);
    h.finalize().into()
}

pub fn hex(h: &Hash) -> [u8; 32] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 32];
    for (i, b) in h.iter().enumerate() {
        out[2 * i] = DIGITS[usize::from(b >> 4)];
        out[2 * i + 1] = DIGITS[usize::from(b & 15)];
    }
    out
}

/// The file of `h` under `dir` with `levels` (each 1 or 2 hex digits, taken from the end),
/// made in one allocation (a lookup's and a miss's cost: `PathBuf::push` per part
/// reallocated each time).
pub fn file(dir: &Path, levels: &[u8], h: &Hash) -> PathBuf {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let name = hex(h);
    let dir = dir.as_os_str().as_bytes();
    let mut p = Vec::with_capacity(dir.len() + 3 * levels.len() + 1 + name.len());
    p.extend_from_slice(dir);
    let mut end = name.len();
    for &l in levels {
        let l = usize::from(l).min(end);
        if p.last() != Some(&b'/') {
            p.push(b'/');
        }
        p.extend_from_slice(&name[end - l..end]);
        end -= l;
    }
    if p.last() != Some(&b'/') {
        p.push(b'/');
    }
    p.extend_from_slice(&name);
    PathBuf::from(std::ffi::OsString::from_vec(p))
}

#[cfg(test)]
mod tests {
    #[test]
    fn nginx_layout() {
        // nginx's documented example: levels=1:2, key hash c29b7f54b2df7773722d382f4809d650.
        let mut h = [0u8; 16];
        let hex = b"c29b7f54b2df7773722d382f4809d650";
        for i in 0..16 {
            let s = std::str::from_utf8(&hex[2 * i..2 * i + 2]).unwrap();
            h[i] = u8::from_str_radix(s, 16).unwrap();
        }
        let p = super::file(std::path::Path::new("/c"), &[1, 2], &h);
        assert_eq!(p.to_str(), Some("/c/0/65/c29b7f54b2df7773722d382f4809d650"));
        let p = super::file(std::path::Path::new("/c/"), &[], &h);
        assert_eq!(p.to_str(), Some("/c/c29b7f54b2df7773722d382f4809d650"));
        let p = super::file(std::path::Path::new("/"), &[2, 2, 2], &h);
        assert_eq!(
            p.to_str(),
            Some("/50/d6/09/c29b7f54b2df7773722d382f4809d650")
        );
    }
}

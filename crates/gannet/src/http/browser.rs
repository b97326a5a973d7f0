//! The browsers nginx recognises from a request's User-Agent (its
//! `ngx_http_process_user_agent`): old MSIE, which `gzip_disable msie6` and
//! `keepalive_disable msie6` work around, and Safari (`keepalive_disable safari`).

/// MSIE 4 to 6, but not 6 with "SV1" after the version (it copes with gzip and
/// keep-alive), nor anything that also says "Opera".
pub fn is_msie6(ua: &[u8]) -> bool {
    let Some(i) = memchr::memmem::find(ua, b"MSIE ") else {
        return false;
    };
    // nginx looks at the version only when at least 8 bytes follow "MSIE".
    if i + 7 >= ua.len() || ua[i + 6] != b'.' || opera(ua) {
        return false;
    }
    match ua[i + 5] {
        b'4' | b'5' => true,
        b'6' => memchr::memmem::find(&ua[i + 8..], b"SV1").is_none(),
        _ => false,
    }
}

/// Safari on Mac OS X, as nginx tells it from MSIE, Opera, Gecko and Chrome.
pub fn is_safari(ua: &[u8]) -> bool {
    let has = |s: &[u8]| memchr::memmem::find(ua, s).is_some();
    let msie = memchr::memmem::find(ua, b"MSIE ").is_some_and(|i| i + 7 < ua.len());
    !msie
        && !opera(ua)
        && !has(b"Gecko/")
        && !has(b"Chrome/")
        && has(b"Safari/")
        && has(b"Mac OS X")
}

fn opera(ua: &[u8]) -> bool {
    memchr::memmem::find(ua, b"Opera").is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_browsers_as_nginx() {
        assert!(is_msie6(b"Mozilla/4.0 (compatible; MSIE 5.0; Windows)"));
        assert!(is_msie6(b"MSIE 6.0; Windows"));
        assert!(!is_msie6(b"MSIE 6.0; SV1; Windows"));
        assert!(!is_msie6(b"MSIE 7.0; Windows"));
        assert!(is_msie6(b"MSIE 5.0"));
        assert!(!is_msie6(b"MSIE 5."), "too short after MSIE");
        assert!(!is_msie6(b"MSIE 5.0; Opera 7"));
        assert!(is_msie6(b"Mozilla/4.0 (compatible; MSIE 5.5; Windows 98)"));
        assert!(!is_msie6(b"curl/7.88.1"));
        assert!(is_safari(b"Mac OS X Safari/7534.48.3"));
        assert!(!is_safari(b"Mac OS X Chrome/1 Safari/7534.48.3"));
        assert!(!is_safari(b"Windows Safari/7534.48.3"));
    }
}

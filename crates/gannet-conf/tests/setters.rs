//! Table tests for the argument parsers, with nginx's accepted forms and limits, and the
//! directive-level wrappers' error messages.

use gannet_conf::setters::{self, flag, msec, num, offset, sec, size};
use gannet_conf::{Directive, Loc};
use std::sync::Arc;

const MAX: u64 = i64::MAX as u64;

fn dir(name: &str, args: &[&str]) -> Directive {
    Directive {
        name: name.into(),
        args: args.iter().map(|s| s.to_string()).collect(),
        block: None,
        loc: Loc {
            file: Arc::from("t.conf"),
            line: 7,
        },
    }
}

#[test]
fn sizes() {
    let table: &[(&str, Option<u64>)] = &[
        ("0", Some(0)),
        ("512", Some(512)),
        ("1k", Some(1024)),
        ("8K", Some(8192)),
        ("1m", Some(1 << 20)),
        ("10M", Some(10 << 20)),
        ("2g", Some(2 << 30)),
        ("1G", Some(1 << 30)),
        ("9223372036854775807", Some(MAX)),
        ("9223372036854775808", None),
        ("8589934591g", Some(8589934591 << 30)),
        ("8589934592g", None),
        ("", None),
        ("k", None),
        ("-1", None),
        ("+1", None),
        ("1.5m", None),
        ("1 m", None),
        ("1kb", None),
        ("1t", None),
        ("１", None),
    ];
    for &(s, want) in table {
        assert_eq!(size(s), want, "size({s:?})");
        assert_eq!(offset(s), want, "offset({s:?})");
    }
}

#[test]
fn numbers() {
    assert_eq!(num("0"), Some(0));
    assert_eq!(num("0042"), Some(42));
    assert_eq!(num("9223372036854775807"), Some(MAX));
    for bad in [
        "",
        "-1",
        "1k",
        " 1",
        "9223372036854775808",
        "99999999999999999999",
    ] {
        assert_eq!(num(bad), None, "{bad:?}");
    }
}

#[test]
fn msec_durations() {
    let table: &[(&str, Option<u64>)] = &[
        ("0", Some(0)),
        ("60", Some(60_000)),
        ("500ms", Some(500)),
        ("30s", Some(30_000)),
        ("5m", Some(300_000)),
        ("1h", Some(3_600_000)),
        ("2d", Some(172_800_000)),
        ("1w", Some(604_800_000)),
        ("1h 30m", Some(5_400_000)),
        ("1h30m", Some(5_400_000)),
        ("1h  30m 10s 5ms", Some(5_410_005)),
        ("1s500ms", Some(1500)),
        ("1m 5", Some(65_000)),
        ("1m5", Some(65_000)),
        // A bare number then a space counts as seconds, then more may follow (nginx quirk).
        ("5 6", Some(11_000)),
        ("5 6 7", None),
        ("1M", None),
        ("1y", None),
        ("", None),
        ("s", None),
        ("ms", None),
        ("1x", None),
        ("-1s", None),
        ("1s 1m", None),
        ("1m1h", None),
        ("1s1s", None),
        ("5ms5ms", None),
        ("1.5s", None),
        ("1S", None),
        ("1H", None),
        ("9223372036854775807ms", Some(MAX)),
        ("9223372036854775808ms", None),
        ("9223372036854775s", Some(9_223_372_036_854_775_000)),
        ("9223372036854776s", None),
        ("9223372036854776", None),
        ("9223372036854775807ms 1ms", None),
    ];
    for &(s, want) in table {
        assert_eq!(msec(s), want, "msec({s:?})");
    }
}

#[test]
fn sec_durations() {
    let table: &[(&str, Option<u64>)] = &[
        ("0", Some(0)),
        ("10", Some(10)),
        ("10s", Some(10)),
        ("1m", Some(60)),
        ("1h 1m 1s", Some(3661)),
        ("1d", Some(86_400)),
        ("1w", Some(604_800)),
        ("1M", Some(2_592_000)),
        ("1y", Some(31_536_000)),
        (
            "1y 1M 1w 1d 1h 1m 1s",
            Some(31_536_000 + 2_592_000 + 604_800 + 86_400 + 3661),
        ),
        ("1y1M", Some(34_128_000)),
        ("1M1y", None),
        ("1y1y", None),
        ("500ms", None),
        ("", None),
        ("1e", None),
        ("9223372036854775807", Some(MAX)),
        ("9223372036854775807s", Some(MAX)),
        ("9223372036854775808", None),
        ("292471208677y", Some(292_471_208_677 * 31_536_000)),
        ("292471208678y", None),
    ];
    for &(s, want) in table {
        assert_eq!(sec(s), want, "sec({s:?})");
    }
}

#[test]
fn flags() {
    assert_eq!(flag(&dir("sendfile", &["on"])), Ok(true));
    assert_eq!(flag(&dir("sendfile", &["OFF"])), Ok(false));
    assert_eq!(flag(&dir("sendfile", &["On"])), Ok(true));
    let e = flag(&dir("sendfile", &["yes"])).unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"t.conf:7: invalid value "yes" in "sendfile" directive, it must be "on" or "off""#
    );
    let e = flag(&dir("sendfile", &[])).unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"t.conf:7: invalid number of arguments in "sendfile" directive"#
    );
}

#[test]
fn directive_wrappers() {
    let d = dir("client_max_body_size", &["10m", "bad"]);
    assert_eq!(setters::size_arg(&d, 0), Ok(10 << 20));
    assert_eq!(
        setters::size_arg(&d, 1).unwrap_err().to_string(),
        r#"t.conf:7: "client_max_body_size" directive invalid value"#
    );
    assert_eq!(
        setters::size_arg(&d, 2).unwrap_err().to_string(),
        r#"t.conf:7: invalid number of arguments in "client_max_body_size" directive"#
    );
    let d = dir("keepalive_timeout", &["75s", "60", "1y"]);
    assert_eq!(setters::msec_arg(&d, 0), Ok(75_000));
    assert_eq!(setters::sec_arg(&d, 1), Ok(60));
    assert_eq!(setters::sec_arg(&d, 2), Ok(31_536_000));
    assert!(setters::msec_arg(&d, 2)
        .unwrap_err()
        .msg
        .ends_with("directive invalid value"));
    let d = dir("worker_connections", &["768", "x"]);
    assert_eq!(setters::num_arg(&d, 0), Ok(768));
    assert_eq!(
        setters::num_arg(&d, 1).unwrap_err().msg,
        r#""worker_connections" directive invalid number"#
    );
    assert_eq!(setters::offset_arg(&dir("x", &["1g"]), 0), Ok(1 << 30));
    assert_eq!(setters::arg(&d, 1), Ok("x"));
}

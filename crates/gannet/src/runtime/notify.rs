//! systemd's readiness protocol (sd_notify(3)), for a unit with `Type=notify`: the master
//! tells the service manager when it serves (`READY=1`), when a SIGHUP reload starts
//! (`RELOADING=1` with `MONOTONIC_USEC=`) and ends (`READY=1` again), and when it stops
//! (`STOPPING=1`), each with a `STATUS=` line `systemctl status` shows; an old master
//! leaving after a binary upgrade names the new one as the main process (`MAINPID=`).
//!
//! Only when `NOTIFY_SOCKET` names a socket: a path, or an abstract name written `@name`
//! (systemd's own is a path; containers and tests use either). Each message is one
//! datagram on a fresh unbound unix socket, as libsystemd sends it, so nothing stays open
//! for worker processes to inherit. A send that fails is logged and otherwise ignored: a
//! server that cannot report its state must still serve.
//!
//! `NOTIFY_SOCKET` is left in the environment: worker processes never send (systemd's
//! default `NotifyAccess=main` would drop their messages anyway), and a binary upgrade
//! needs it in the new master.

use super::listener::Bound;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::OnceLock;

/// Where to send, from `NOTIFY_SOCKET`, read once.
fn target() -> Option<&'static SocketAddr> {
    static TARGET: OnceLock<Option<SocketAddr>> = OnceLock::new();
    TARGET
        .get_or_init(|| {
            let v = std::env::var_os("NOTIFY_SOCKET")?;
            let parsed = parse(v.as_encoded_bytes());
            if parsed.is_none() {
                crate::errlog::warn(format_args!(
                    "NOTIFY_SOCKET \"{}\" is neither a path nor an @abstract name; \
                     systemd will not be told of the state",
                    v.to_string_lossy()
                ));
            }
            parsed
        })
        .as_ref()
}

/// `/path` or `@abstract`; anything else (an empty value, `vsock:`) is not for us.
fn parse(v: &[u8]) -> Option<SocketAddr> {
    match v.first()? {
        b'/' => SocketAddr::from_pathname(std::ffi::OsStr::from_bytes(v)).ok(),
        b'@' => SocketAddr::from_abstract_name(&v[1..]).ok(),
        _ => None,
    }
}

/// Send `state` (newline-separated `KEY=value` lines) if a socket is set.
fn send(state: &str) {
    let Some(addr) = target() else { return };
    let sent = UnixDatagram::unbound().and_then(|s| s.send_to_addr(state.as_bytes(), addr));
    if let Err(e) = sent {
        crate::errlog::warn(format_args!(
            "sd_notify \"{}\" failed ({e})",
            first_line(state)
        ));
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

/// The master serves: its sockets listen and a worker process runs on them.
pub fn ready(status: &str) {
    send(&format!(
        "READY=1\nSTATUS={status}\nMAINPID={}",
        std::process::id()
    ));
}

/// The `STATUS=` of a serving master: the addresses it listens on.
pub fn serving(bound: &Bound) -> String {
    let mut addrs: Vec<String> = bound.keys().map(ToString::to_string).collect();
    addrs.sort();
    format!("serving on {}", addrs.join(" "))
}

/// A reload ended: `READY=1` either way (the old config still serves after a failed one),
/// with a status that says which.
pub fn reloaded(applied: bool, bound: &Bound) {
    let status = serving(bound);
    if applied {
        ready(&status);
    } else {
        ready(&format!(
            "reload failed, the running configuration is kept (see the error log); {status}"
        ));
    }
}

/// A reload starts. systemd (253+) wants the CLOCK_MONOTONIC time with it, to tell this
/// reload from an older one.
pub fn reloading() {
    send(&format!(
        "RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=reloading the configuration",
        monotonic_usec()
    ));
}

/// The master is stopping (fast or graceful). With a new binary running (the last step of
/// a binary upgrade) the service goes on in it: the manager is told that its master is the
/// main process now, not that the service stops (which would make systemd kill it).
pub fn stopping(status: &str, successor: Option<libc::pid_t>) {
    match successor {
        Some(pid) => send(&format!(
            "MAINPID={pid}\nSTATUS=upgraded: the new master process {pid} serves"
        )),
        None => send(&format!("STOPPING=1\nSTATUS={status}")),
    }
}

fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec that outlives the call; CLOCK_MONOTONIC always
    // exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_abstract_names_parse_and_the_rest_is_refused() {
        let p = parse(b"/run/systemd/notify").unwrap();
        assert_eq!(
            p.as_pathname().unwrap().to_str(),
            Some("/run/systemd/notify")
        );
        let a = parse(b"@gannet/test").unwrap();
        assert_eq!(a.as_abstract_name(), Some(&b"gannet/test"[..]));
        assert!(parse(b"").is_none());
        assert!(parse(b"vsock:2:1234").is_none());
        assert!(parse(b"relative/path").is_none());
    }

    #[test]
    fn a_datagram_reaches_a_socket_bound_at_an_abstract_name() {
        let name = format!("gannet-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = UnixDatagram::bind_addr(&addr).unwrap();
        let parsed = parse(format!("@{name}").as_bytes()).unwrap();
        UnixDatagram::unbound()
            .unwrap()
            .send_to_addr(b"READY=1", &parsed)
            .unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
    }
}

//! Binary upgrade with no connection refused, as nginx's SIGUSR2: the master starts the
//! executable again (the path it was started from, so a package that replaced the file
//! starts the new version) with the same arguments, and hands it its listening sockets.
//!
//! The sockets cross the `exec` as open descriptors listed in the `GANNET_INHERIT`
//! environment variable, `fd;fd;...;` (the form of nginx's `NGINX` variable). The new
//! master takes them for the addresses its config listens on instead of binding (which
//! would fail: the old master holds the ports) and closes the rest. Both masters' workers
//! then accept on the very same sockets, so a connection waits in a backlog whichever of
//! them is going away. The sequence, signals and pid files are in `runtime::master`.

use super::listener::Bound;
use crate::config::listen::Endpoint;
use std::ffi::OsString;
use std::io;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The environment variable that lists inherited listening sockets.
pub const INHERIT_VAR: &str = "GANNET_INHERIT";

/// How the process was started: what SIGUSR2 runs again.
pub struct Exec {
    path: PathBuf,
    argv: Vec<OsString>,
}

impl Exec {
    /// The executable as started, resolved now (a later `cd` or `PATH` change must not
    /// change what runs): `argv[0]` made absolute, or found in `PATH`; /proc/self/exe if
    /// neither works. Not /proc/self/exe first: after a package upgrade replaced the file,
    /// that link names the old, deleted one.
    pub fn at_start() -> Exec {
        let argv: Vec<OsString> = std::env::args_os().collect();
        let path = argv
            .first()
            .and_then(|a0| resolve(Path::new(a0)))
            .or_else(|| std::fs::read_link("/proc/self/exe").ok())
            .unwrap_or_else(|| PathBuf::from("gannet"));
        Exec { path, argv }
    }
}

fn resolve(a0: &Path) -> Option<PathBuf> {
    if a0.as_os_str().is_empty() {
        return None;
    }
    if a0.components().count() > 1 || a0.is_absolute() {
        return Some(std::env::current_dir().ok()?.join(a0));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(a0))
        .find(|p| p.is_file())
        .map(|p| {
            if p.is_absolute() {
                p
            } else {
                std::env::current_dir().map_or(p.clone(), |cwd| cwd.join(p))
            }
        })
}

/// Start the new binary with `bound`'s sockets; its pid.
pub fn start_new_binary(exec: &Exec, bound: &Bound) -> Result<libc::pid_t, String> {
    let fds: Vec<RawFd> = bound.values().flatten().map(|s| s.as_raw_fd()).collect();
    let list: String = fds.iter().map(|fd| format!("{fd};")).collect();
    let mut cmd = std::process::Command::new(&exec.path);
    if let Some(a0) = exec.argv.first() {
        cmd.arg0(a0);
    }
    cmd.args(exec.argv.iter().skip(1)).env(INHERIT_VAR, list);
    // SAFETY: the closure runs in the forked child before exec; it only calls fcntl, which
    // is async-signal-safe, on a Vec allocated before the fork (read, not allocated or
    // freed). Clearing FD_CLOEXEC on the child's copies lets the sockets cross the exec;
    // the master's own descriptors keep the flag.
    unsafe {
        cmd.pre_exec(move || {
            for &fd in &fds {
                if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    // The child is reaped by the master's SIGCHLD loop, not through this handle.
    let child = cmd
        .spawn()
        .map_err(|e| format!("execve() \"{}\" failed ({e})", exec.path.display()))?;
    libc::pid_t::try_from(child.id()).map_err(|_| "pid out of range".to_string())
}

/// Sockets a master handed over (`GANNET_INHERIT`), by address, and the old master's pid
/// (the parent while it lives). The variable is removed, so that no worker and no later
/// binary sees stale numbers.
pub struct Inherited {
    pub bound: Bound,
    pub parent: libc::pid_t,
}

pub fn inherited() -> Option<Inherited> {
    let list = std::env::var_os(INHERIT_VAR)?;
    // Sound while the process has one thread, as here: the master reads it before it
    // forks a worker or starts any thread.
    std::env::remove_var(INHERIT_VAR);
    let mut bound = Bound::new();
    let mut seen: Vec<RawFd> = Vec::new();
    for item in list.to_string_lossy().split(';').filter(|s| !s.is_empty()) {
        let Ok(fd) = item.parse::<RawFd>() else {
            crate::errlog::warn(format_args!(
                "invalid socket number \"{item}\" in {INHERIT_VAR} environment variable, \
                 ignoring the rest of the variable"
            ));
            break;
        };
        if seen.contains(&fd) {
            continue;
        }
        seen.push(fd);
        match adopt(fd) {
            Ok((s, at)) => bound.entry(at).or_default().push(s),
            Err(e) => crate::errlog::warn(format_args!("inherited socket #{fd} ignored: {e}")),
        }
    }
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    Some(Inherited { bound, parent })
}

/// Take ownership of `fd` if it is an open listening TCP or unix stream socket, or a bound
/// UDP one (held as a
/// `TcpListener`, see `listener::bind`); close-on-exec again. Returns it with its address.
fn adopt(fd: RawFd) -> io::Result<(TcpListener, Endpoint)> {
    if fd < 0 {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    // SAFETY: F_GETFD only reads the descriptor's flags; an unused number answers EBADF.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
        return Err(io::Error::last_os_error());
    }
    let at = {
        // SAFETY: `fd` is open (F_GETFD succeeded) and nothing closes it while borrowed.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let s = socket2::SockRef::from(&borrowed);
        let local = s.local_addr()?;
        let kind = s.r#type()?;
        let at = match (local.as_socket(), local.as_pathname()) {
            // A stream `listen ... udp` socket (held as a listener too, `listener::bind`).
            (Some(a), _) if kind == socket2::Type::DGRAM => Some(Endpoint::Udp(a)),
            (Some(a), _) if kind == socket2::Type::STREAM => Some(Endpoint::Tcp(a)),
            (None, Some(p)) if kind == socket2::Type::STREAM => Some(Endpoint::Unix(Arc::from(p))),
            _ => None,
        };
        match at {
            Some(at @ Endpoint::Udp(_)) => at,
            Some(at) if s.is_listener()? => at,
            _ => return Err(io::Error::other("not a listening TCP, UDP or unix socket")),
        }
    };
    // SAFETY: `fd` is an open listening socket this process inherited across exec and that
    // nothing else in it owns (the variable is read once and duplicates are skipped).
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: F_SETFD on the open descriptor just adopted.
    if unsafe { libc::fcntl(owned.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) } == -1 {
        return Err(io::Error::last_os_error());
    }
    let l = TcpListener::from(owned);
    l.set_nonblocking(true)?;
    Ok((l, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_argv0_to_an_absolute_path() {
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(resolve(Path::new("./gannet")), Some(cwd.join("./gannet")));
        assert_eq!(
            resolve(Path::new("/usr/sbin/gannet")),
            Some(PathBuf::from("/usr/sbin/gannet"))
        );
        assert!(resolve(Path::new("sh")).is_some_and(|p| p.is_absolute()));
        assert_eq!(resolve(Path::new("")), None);
    }

    #[test]
    fn adopts_only_listening_tcp_sockets() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let raw = std::os::fd::IntoRawFd::into_raw_fd(l);
        let (got, at) = adopt(raw).unwrap();
        assert_eq!(got.local_addr().unwrap(), addr);
        assert_eq!(at, Endpoint::Tcp(addr));
        let f = std::fs::File::open("/dev/null").unwrap();
        assert!(adopt(f.as_raw_fd()).is_err(), "a file is refused");
        let c = std::net::TcpStream::connect(addr).unwrap();
        assert!(
            adopt(c.as_raw_fd()).is_err(),
            "a connected socket is refused"
        );
        assert!(adopt(-1).is_err());
    }
}

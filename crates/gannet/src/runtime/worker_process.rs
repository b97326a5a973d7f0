//! Forking the worker process: the master, which stays root, forks a child per config
//! generation after it has loaded the config (certificates and keys read, log files
//! opened) and bound the sockets. The child inherits all of it as memory and descriptors,
//! with no second parse and no file it would have to read as an unprivileged user.
//!
//! Between fork and its first thread the child is single-threaded (the master is: its
//! only thread runs the signal loop), so it may change its environment and credentials:
//! it closes the master's descriptors it must not hold (other generations' sockets, other
//! workers' channels), puts signals back to their defaults, applies `runtime::privileges`
//! (env, limits, `user`, `working_directory`) and only then starts the worker threads
//! (`runtime::threads`). It never returns into the master's code: it exits when drained.

use super::channel::{self, Channel, MAX_FDS};
use super::listener::WorkerSockets;
use super::threads::{MSG_DRAIN, MSG_REOPEN};
use crate::config::Config;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

/// The master's handle on a worker process.
pub struct WorkerProcess {
    pub pid: libc::pid_t,
    chan: Channel,
}

/// Exit code of a worker process that cannot run (user, directory): not started again.
pub const EXIT_FATAL: i32 = 2;

/// The name of the worker process (its main thread), as `ps` and /proc show it.
const PROCESS_NAME: &std::ffi::CStr = c"gannet: worker";

impl WorkerProcess {
    /// The master's end of the channel (a descriptor other workers must not inherit).
    pub fn channel_fd(&self) -> RawFd {
        self.chan.as_raw_fd()
    }

    /// Ask for a graceful stop: stop accepting, finish in-flight requests, exit.
    pub fn drain(&self) {
        if let Err(e) = self.chan.send(&[MSG_DRAIN], &[]) {
            crate::errlog::error(format_args!(
                "telling worker process {} to stop failed ({e})",
                self.pid
            ));
        }
    }

    /// Hand over the master's (just reopened) log descriptors of `config`.
    pub fn reopen_logs(&self, config: &Config) {
        for batch in super::log_reopen::descriptors(config).chunks(MAX_FDS) {
            let mut msg = vec![MSG_REOPEN];
            let mut fds = Vec::with_capacity(batch.len());
            for (index, fd) in batch {
                msg.extend_from_slice(&index.to_le_bytes());
                fds.push(*fd);
            }
            if let Err(e) = self.chan.send(&msg, &fds) {
                crate::errlog::error(format_args!(
                    "passing reopened logs to worker process {} failed ({e})",
                    self.pid
                ));
            }
        }
    }

    /// Stop at once (SIGTERM: the worker process keeps its default action and dies).
    pub fn terminate(&self) {
        // SAFETY: kill takes plain integers; `pid` is our child, not yet reaped.
        unsafe { libc::kill(self.pid, libc::SIGTERM) };
    }
}

/// Fork a worker process running `config` on `sockets`. `foreign`: descriptors of the
/// master's the child must close (sockets and channels of other generations).
pub fn spawn(
    config: &Arc<Config>,
    sockets: &[WorkerSockets],
    foreign: &[RawFd],
) -> Result<WorkerProcess, String> {
    let (master_end, worker_end) =
        channel::pair().map_err(|e| format!("socketpair() failed ({e})"))?;
    // SAFETY: the master is single-threaded (its one thread waits for signals; worker
    // threads live only in worker processes), so the child is a complete copy of it. The
    // child runs `child`, which never returns into the caller's frames.
    match unsafe { libc::fork() } {
        -1 => Err(format!(
            "fork() failed ({})",
            std::io::Error::last_os_error()
        )),
        0 => {
            drop(master_end);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                child(config.clone(), sockets, foreign, worker_end)
            }));
            // A panic must not unwind into the master's frames: they own descriptors
            // `child` closed by number.
            let code = r.unwrap_or(EXIT_FATAL);
            // SAFETY: _exit ends the process at once; nothing of it is used after.
            unsafe { libc::_exit(code) }
        }
        pid => Ok(WorkerProcess {
            pid,
            chan: master_end,
        }),
    }
}

/// The worker process, from fork to its exit code.
fn child(config: Arc<Config>, sockets: &[WorkerSockets], foreign: &[RawFd], chan: Channel) -> i32 {
    for &fd in foreign {
        // SAFETY: these descriptors belong to master objects this process never uses nor
        // drops (it exits without returning); closing them here only lets go of this
        // process's copies, so an address the master stops listening on is not kept bound.
        unsafe { libc::close(fd) };
    }
    reset_signals();
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, PROCESS_NAME.as_ptr(), 0, 0, 0) };
    if let Err(super::privileges::Fatal(e)) = super::privileges::apply(&config) {
        crate::errlog::log(crate::errlog::Level::Emerg, format_args!("{e}"));
        return EXIT_FATAL;
    }
    let mine = sockets
        .iter()
        .map(|set| {
            set.iter()
                .map(|(s, group)| s.try_clone().map(|s| (s, *group)))
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<Vec<_>, _>>();
    match mine {
        Ok(mine) => super::threads::run(config, mine, chan),
        Err(e) => {
            crate::errlog::error(format_args!("socket dup failed: {e}"));
            EXIT_FATAL
        }
    }
}

/// The master blocks its signals (it takes them with sigwaitinfo) and the child inherits
/// that mask: unblock them. SIGTERM and SIGINT keep their default action (stop at once);
/// the rest of the master's signals are the master's business (a terminal's Ctrl-\ or a
/// hang-up reaches the whole process group): it tells the worker what to do over the
/// channel.
fn reset_signals() {
    for (sig, action) in [
        (libc::SIGTERM, libc::SIG_DFL),
        (libc::SIGINT, libc::SIG_DFL),
        (libc::SIGCHLD, libc::SIG_DFL),
        (libc::SIGQUIT, libc::SIG_IGN),
        (libc::SIGHUP, libc::SIG_IGN),
        (libc::SIGUSR1, libc::SIG_IGN),
        (libc::SIGUSR2, libc::SIG_IGN),
        (libc::SIGWINCH, libc::SIG_IGN),
    ] {
        // SAFETY: SIG_DFL and SIG_IGN are valid dispositions for these catchable signals.
        unsafe { libc::signal(sig, action) };
    }
    // SAFETY: sigset_t is plain data; sigemptyset initialises it; an empty mask unblocks.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
}

/// How a reaped child ended, in nginx's words, and whether it asked not to be restarted.
pub fn describe(status: libc::c_int) -> (String, bool) {
    if libc::WIFSIGNALED(status) {
        let core = if libc::WCOREDUMP(status) {
            " (core dumped)"
        } else {
            ""
        };
        (
            format!("exited on signal {}{core}", libc::WTERMSIG(status)),
            false,
        )
    } else {
        let code = libc::WEXITSTATUS(status);
        (format!("exited with code {code}"), code == EXIT_FATAL)
    }
}

/// Reap one exited child without waiting: (pid, status).
pub fn reap() -> Option<(libc::pid_t, libc::c_int)> {
    let mut status = 0;
    // SAFETY: waitpid writes the status into `status`, valid for the call.
    let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
    (pid > 0).then_some((pid, status))
}

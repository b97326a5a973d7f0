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
//!
//! With `master_process off` (nginx's development mode, decided once at start) nothing is
//! forked: `spawn` runs the worker threads of a generation in the master's own process,
//! under a thread of their own, with the same channel and the same `threads::run`, so the
//! master's signal loop drives them exactly as it drives a worker process. Nothing of
//! `runtime::privileges` is applied then (see `master`, "Single process").

use super::channel::{self, Channel, MAX_FDS};
use super::listener::WorkerSockets;
use super::threads::{MSG_DRAIN, MSG_REOPEN};
use crate::config::Config;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{mpsc, Arc, OnceLock};

/// The master's handle on a worker process.
pub struct WorkerProcess {
    /// The child's pid; in single-process mode the id of the thread that runs the worker
    /// threads (unique among this process's threads and children, so it names the
    /// generation in the master's bookkeeping and logs as a pid does).
    pub pid: libc::pid_t,
    chan: Channel,
    /// Single-process mode: where that thread leaves its exit code when it ends.
    here: Option<mpsc::Receiver<i32>>,
}

/// How the logs name it: "worker process PID", or in single-process mode "worker threads
/// (thread TID)", so that no one looks for a process that never existed.
impl std::fmt::Display for WorkerProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.here {
            None => write!(f, "worker process {}", self.pid),
            Some(_) => write!(f, "worker threads (thread {})", self.pid),
        }
    }
}

/// `master_process off`: set once by the master before its first generation. nginx too
/// reads `master_process` only at start: a reload does not switch modes (and forking from
/// a process that already runs worker threads would not be sound).
static SINGLE: OnceLock<bool> = OnceLock::new();

/// Choose, once, whether worker threads run in this process (`master_process off`).
pub fn set_single_process(single: bool) {
    let _ = SINGLE.set(single);
}

/// Whether the worker threads run in the master's process (`master_process off`).
pub fn single_process() -> bool {
    SINGLE.get().copied().unwrap_or(false)
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
        if self.here.is_some() {
            // Worker threads in this process write to the very descriptors the master
            // just reopened in place: nothing to hand over.
            return;
        }
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

    /// Stop at once (SIGTERM: the worker process keeps its default action and dies); the
    /// pid to wait for. Worker threads in this process need nothing: they end with it.
    pub fn terminate(&self) -> Option<libc::pid_t> {
        if self.here.is_some() {
            return None;
        }
        // SAFETY: kill takes plain integers; `pid` is our child, not yet reaped.
        unsafe { libc::kill(self.pid, libc::SIGTERM) };
        Some(self.pid)
    }

    /// Single-process mode: (id, wait status) once the worker threads have ended, as
    /// `reap` reports a process, so that the master handles both alike.
    pub fn finished(&self) -> Option<(libc::pid_t, libc::c_int)> {
        let code = match self.here.as_ref()?.try_recv() {
            Ok(code) => code,
            Err(mpsc::TryRecvError::Empty) => return None,
            // Gone without a code: cannot happen (the code is sent even after a panic).
            Err(mpsc::TryRecvError::Disconnected) => EXIT_FATAL,
        };
        Some((self.pid, libc::W_EXITCODE(code, 0)))
    }
}

/// Fork a worker process running `config` on `sockets`. `foreign`: descriptors of the
/// master's the child must close (sockets and channels of other generations). In
/// single-process mode, run the worker threads here instead (`foreign` stays open).
pub fn spawn(
    config: &Arc<Config>,
    sockets: &[WorkerSockets],
    foreign: &[RawFd],
) -> Result<WorkerProcess, String> {
    let (master_end, worker_end) =
        channel::pair().map_err(|e| format!("socketpair() failed ({e})"))?;
    if single_process() {
        return start_here(config, sockets, master_end, worker_end);
    }
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
        pid => {
            crate::errlog::notice(format_args!("start worker process {pid}"));
            Ok(WorkerProcess {
                pid,
                chan: master_end,
                here: None,
            })
        }
    }
}

/// Single-process mode: run `threads::run` on a thread of this process. It inherits the
/// master's mask (every signal the master takes is blocked), and so do the worker threads
/// it starts: the master's `sigwaitinfo` gets every signal. When the worker threads are
/// done, it leaves its exit code and raises SIGCHLD, which is what wakes the master when a
/// worker process ends.
fn start_here(
    config: &Arc<Config>,
    sockets: &[WorkerSockets],
    master_end: Channel,
    worker_end: Channel,
) -> Result<WorkerProcess, String> {
    let mine = dup_sockets(sockets).map_err(|e| format!("socket dup failed: {e}"))?;
    let config = config.clone();
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("gannet-workers".into())
        .spawn(move || {
            // SAFETY: gettid has no preconditions.
            let _ = tx.send(unsafe { libc::gettid() });
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                super::threads::run(config, mine, worker_end)
            }));
            let _ = tx.send(r.unwrap_or(EXIT_FATAL));
            // SAFETY: kill takes plain integers; the signal goes to this very process.
            unsafe { libc::kill(libc::getpid(), libc::SIGCHLD) };
        })
        .map_err(|e| format!("worker thread failed to start: {e}"))?;
    // The thread's first message is its id.
    let pid = rx
        .recv()
        .map_err(|_| "worker thread failed to start".to_string())?;
    Ok(WorkerProcess {
        pid,
        chan: master_end,
        here: Some(rx),
    })
}

/// Each worker thread's sockets, duplicated (the master keeps its own to start workers
/// again).
fn dup_sockets(sockets: &[WorkerSockets]) -> std::io::Result<Vec<WorkerSockets>> {
    sockets
        .iter()
        .map(|set| {
            set.iter()
                .map(|(s, group, steer)| s.try_clone().map(|s| (s, *group, *steer)))
                .collect()
        })
        .collect()
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
    match dup_sockets(sockets) {
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

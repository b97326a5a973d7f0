//! The master: binds every listening socket, optionally becomes a daemon, writes the pid
//! file, starts the worker process and then only waits for signals and for workers that
//! die.
//!
//! # Processes
//!
//! gannet runs as two kinds of process, as nginx does:
//!
//! - the **master** (the process started, whose pid is in the `pid` file) keeps the
//!   privileges it was started with (root, typically). It loads the config - reading
//!   certificates and keys, opening log files - binds the listening sockets, handles the
//!   signals and reloads. It has a single thread and never reads a byte from a client or
//!   an upstream.
//! - a **worker process** per config generation, forked by the master once the config is
//!   loaded (`worker_process`): it inherits the parsed config and the sockets, drops to
//!   `user` when started as root (`privileges`), then runs the worker threads
//!   (`worker_processes` of them, `threads`) that accept and serve connections. Every
//!   thread that parses client or upstream input runs in it, unprivileged.
//!
//! The master talks to a worker process over a socketpair (`channel`): "drain" for a
//! graceful stop, and log descriptors it reopened for SIGUSR1 (the worker, not root, may
//! not open them itself).
//!
//! Signals, as nginx: SIGTERM / SIGINT stop at once; SIGQUIT stops gracefully (workers stop
//! accepting, finish what is in flight, close idle connections; `worker_shutdown_timeout`
//! caps the wait); SIGUSR1 reopens the log files; SIGHUP reloads; SIGUSR2 and SIGWINCH
//! upgrade the binary (below).
//!
//! A reload reads the config again (as root, so a new port below 1024 and a root-only key
//! are fine); a bad one is logged with its file:line and the running one keeps serving.
//! Otherwise a new worker process starts on the new config and the old one drains (stops
//! accepting, finishes its in-flight requests, exits).
//! The listening sockets outlive generations (`listener::Bound`): the new workers accept
//! on the very sockets the old ones stop accepting on, so a connection arriving during the
//! switch waits in the backlog instead of being refused.
//!
//! A draining worker answers the requests it has with `Connection: close`, and closes a
//! kept-alive connection only between requests, after a short grace time for one already
//! on its way, with a lingering close (`runtime::read_timers`, `conn::h1`): a busy
//! keep-alive client sees no error across a reload.
//!
//! # Binary upgrade
//!
//! nginx's sequence, with no connection refused or reset (`runtime::upgrade`):
//!
//! 1. SIGUSR2 to the master: it renames the pid file to `PID.oldbin` and starts the
//!    executable it was started from, with the same arguments and its listening sockets
//!    (`GANNET_INHERIT`). The new master loads the config, takes the inherited sockets,
//!    writes the pid file and starts its workers: both generations accept now.
//! 2. SIGWINCH to the old master: its workers drain and exit; the master stays, so that
//!    SIGHUP starts them again (same config, no reread) if the new binary misbehaves.
//! 3. SIGQUIT to the old master: it exits. (Or, to go back, SIGQUIT to the new master:
//!    the old one renames `PID.oldbin` back and, after SIGWINCH, starts its workers again.)
//!
//! A new binary that fails (bad config, crash) is reaped by the old master, which renames
//! its pid file back, as nginx does. SIGWINCH is honoured, as nginx does, by a daemon or
//! a master started by an upgrade, and also during an upgrade: a terminal's resize sends
//! it to a foreground process group. A master ignores SIGUSR2 while a new binary of its
//! own runs, or while the old master that started it does.
//!
//! A worker thread that panics is logged and started again on the same sockets by its
//! worker process. A worker process that dies (killed, crashed) is logged and the master
//! forks a new one on the same config and sockets, unless its generation is being replaced
//! or it exited with code 2 (it cannot run: `user` or `working_directory` failed).
//!
//! # Single process
//!
//! `master_process off`, as nginx's development mode: nothing is forked. The process
//! started loads the config, binds, becomes a daemon if `daemon on`, and runs each
//! generation's worker threads itself (`worker_process::spawn`), still driving them from
//! this signal loop and over the same channel: SIGTERM / SIGINT, SIGQUIT (a graceful stop,
//! where nginx's single process exits at once), SIGHUP and SIGUSR1 behave as above. As in
//! nginx, `user`, `working_directory` and `worker_rlimit_core` are not applied, silently.
//! Nor is `env`, unlike nginx: the master reads its own environment later (systemd's
//! `NOTIFY_SOCKET`, what a reload of the embedded config listens on). There is no binary
//! upgrade (SIGUSR2 is ignored with a notice, SIGWINCH silently). The mode is read at
//! start only: a reload does not change it.
//!
//! Under systemd, `notify` reports the master's state (`Type=notify`) and `activation`
//! hands over the sockets a `.socket` unit bound.

use super::listener::{self, Bound, WorkerSockets};
use super::notify;
use super::pid_file::PidFile;
use super::upgrade::{self, Exec};
use super::worker_process::{self, WorkerProcess};
use crate::config::Config;
use crate::errlog::Level;
use gannet_conf::ConfError;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Run `config`; `reload` reads the config again for SIGHUP.
pub fn run(config: Config, reload: impl Fn() -> Result<Config, ConfError>) -> Result<(), String> {
    let config = Arc::new(config);
    let main = &config.main;
    crate::errlog::init(&main.error_logs)?;
    for w in config.process.warnings.iter().chain(&config.warnings) {
        crate::errlog::warn(format_args!("{w}"));
    }
    if let Some(n) = main.rlimit_nofile {
        set_nofile(n)?;
    }
    startup_notices();
    worker_process::set_single_process(!main.master_process);
    // Blocked before the first socket listens: a signal sent as soon as the port answers
    // (SIGHUP, SIGUSR2: deadly by default) waits for the signal loop instead.
    let set = signal_set();
    // SAFETY: `set` is initialised; the master is single-threaded, so the mask is its own
    // (worker processes unblock these again after fork; in single-process mode the worker
    // threads inherit it, leaving every one of these signals to this thread).
    if unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) } != 0 {
        return Err("signal setup failed".into());
    }
    // Before any fork: every worker process shares the counters (`stub_status`).
    super::conn_stats::init();
    super::metrics::init();
    let exec = Exec::at_start();
    // Started by an upgrade: the old master's sockets for the addresses still listened on
    // (the others close with `old`); else the sockets systemd passed (socket activation)
    // stand for binding their addresses.
    let (old, parent) = match upgrade::inherited() {
        Some(i) => {
            crate::errlog::notice(format_args!(
                "using the listening sockets of master process {}",
                i.parent
            ));
            (i.bound, Some(i.parent))
        }
        None => (super::activation::take(&config), None),
    };
    let bound = listener::bind_for(&config, &old)?;
    drop(old);
    // A new binary stays in the old master's session, as nginx's: the old one is a daemon
    // already (or runs in the foreground on purpose).
    if main.daemon && parent.is_none() {
        daemonize()?;
    }
    let up = Upgrade {
        exec,
        parent,
        daemon: main.daemon,
        new_binary: None,
        no_accept: false,
    };
    supervise(config.clone(), bound, main.pid.as_deref(), up, reload)
}

/// What nginx's master says at `notice` level as it starts (the event method, the version,
/// the OS and the open-files limit): admins and tools (nginx's own tests) look for them.
fn startup_notices() {
    crate::errlog::notice(format_args!("using the \"epoll\" event method"));
    crate::errlog::notice(format_args!(
        "{}",
        crate::cli::version_line().trim_start_matches("nginx version: ")
    ));
    // SAFETY: utsname is plain old data, zero-initialised; uname fills it in.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is valid and writable for the call.
    if unsafe { libc::uname(&mut u) } == 0 {
        let field = |f: &[libc::c_char]| {
            let bytes: Vec<u8> = f
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        crate::errlog::notice(format_args!(
            "OS: {} {}",
            field(&u.sysname),
            field(&u.release)
        ));
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is valid and writable for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        crate::errlog::notice(format_args!(
            "getrlimit(RLIMIT_NOFILE): {}:{}",
            lim.rlim_cur, lim.rlim_max
        ));
    }
}

fn set_nofile(n: u64) -> Result<(), String> {
    let lim = libc::rlimit {
        rlim_cur: n as libc::rlim_t,
        rlim_max: n as libc::rlim_t,
    };
    // SAFETY: `lim` is a valid rlimit that outlives the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(format!(
            "setrlimit(RLIMIT_NOFILE, {n}) failed ({})",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// `daemon on`: fork, let the parent exit, start a new session. Called before any thread
/// is started, so the child is a complete copy of a single-threaded process.
fn daemonize() -> Result<(), String> {
    // SAFETY: the process is single-threaded here (no runtime or worker exists yet), so
    // fork() duplicates it fully; the child only continues the Rust code it was running.
    match unsafe { libc::fork() } {
        -1 => Err(format!(
            "fork() failed ({})",
            std::io::Error::last_os_error()
        )),
        0 => {
            // SAFETY: setsid has no memory-safety preconditions.
            unsafe { libc::setsid() };
            // As nginx's ngx_daemon: a daemon's files get exactly the modes it asks for
            // (`dav_access`, a DAV COPY keeping the source's mode), not the starter's umask.
            // SAFETY: umask has no memory-safety preconditions.
            unsafe { libc::umask(0) };
            // Let go of the terminal or pipes the starter gave us, as nginx does: whoever
            // started gannet must not wait on a daemon's stdout.
            let null = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")
                .map_err(|e| format!("open /dev/null: {e}"))?;
            for fd in 0..=2 {
                // SAFETY: both fds are open (`null` lives until the end of this block) and
                // dup2 only replaces the descriptor table entry `fd`.
                unsafe { libc::dup2(null.as_raw_fd(), fd) };
            }
            Ok(())
        }
        _ => std::process::exit(0),
    }
}

/// The worker process started on one config, and what it was given.
struct Generation {
    id: u64,
    config: Arc<Config>,
    /// Each worker thread's sockets, kept to start the process again if it dies.
    sockets: Vec<WorkerSockets>,
    process: WorkerProcess,
    /// Told to drain: its exit is expected, not a death to repair.
    draining: bool,
}

impl Generation {
    fn start(
        id: u64,
        config: Arc<Config>,
        sockets: Vec<WorkerSockets>,
        foreign: &[RawFd],
    ) -> Result<Generation, String> {
        let process = worker_process::spawn(&config, &sockets, foreign)?;
        Ok(Generation {
            id,
            config,
            sockets,
            process,
            draining: false,
        })
    }

    fn drain(&mut self) {
        if !self.draining {
            self.draining = true;
            self.process.drain();
        }
    }
}

/// The master's descriptors a new worker process must not keep: every bound socket and
/// every generation's channel, and the sockets of generations other than `own`.
fn foreign_fds(bound: &[&Bound], gens: &[Generation], own: Option<u64>) -> Vec<RawFd> {
    let mut fds: Vec<RawFd> = bound
        .iter()
        .flat_map(|b| b.values().flatten())
        .map(|s| s.as_raw_fd())
        .collect();
    for g in gens {
        fds.push(g.process.channel_fd());
        if Some(g.id) != own {
            fds.extend(g.sockets.iter().flatten().map(|(s, _, _)| s.as_raw_fd()));
        }
    }
    fds
}

/// SIGHUP: read the config again and, if it loads and its sockets bind, start a worker
/// process on it and drain the others. On any failure the running config stays.
fn reload(
    gens: &mut Vec<Generation>,
    bound: &mut Bound,
    next_id: &mut u64,
    load: &impl Fn() -> Result<Config, ConfError>,
) {
    crate::errlog::notice(format_args!("reconfiguring (SIGHUP)"));
    let kept = "; the running configuration is kept";
    let config = match load() {
        Ok(c) => Arc::new(c),
        Err(e) => return crate::errlog::log(Level::Emerg, format_args!("{e}{kept}")),
    };
    for w in config.process.warnings.iter().chain(&config.warnings) {
        crate::errlog::warn(format_args!("{w}"));
    }
    if config.main.master_process == worker_process::single_process() {
        // Switching needs a restart: forking worker processes from a process that runs
        // worker threads would not be sound. nginx ignores the change silently; say it.
        crate::errlog::warn(format_args!(
            "changing \"master_process\" takes a restart; it stays {}",
            if worker_process::single_process() {
                "off"
            } else {
                "on"
            }
        ));
    }
    let id = *next_id;
    *next_id += 1;
    let started = listener::bind_for(&config, bound).and_then(|new_bound| {
        let sockets = listener::assign(&config, &new_bound)?;
        let foreign = foreign_fds(&[bound, &new_bound], gens, None);
        let g = Generation::start(id, config, sockets, &foreign)?;
        Ok((g, new_bound))
    });
    match started {
        Ok((g, new_bound)) => {
            for old in gens.iter_mut() {
                old.drain();
            }
            gens.push(g);
            // Sockets of addresses no longer listened on close once the old workers,
            // which hold copies, are gone; a unix socket's file goes now, as nginx's.
            for gone in bound.keys().filter(|e| !new_bound.contains_key(*e)) {
                listener::delete_unix(gone);
            }
            *bound = new_bound;
        }
        Err(e) => crate::errlog::log(Level::Emerg, format_args!("{e}{kept}")),
    }
}

/// A worker process ended: start it again if it should be serving, else forget its
/// generation. `Err` when the last generation is gone for good after a failure.
fn exited(
    gens: &mut Vec<Generation>,
    bound: &Bound,
    stopping: bool,
    pid: libc::pid_t,
    status: libc::c_int,
) -> Result<(), String> {
    let Some(pos) = gens.iter().position(|g| g.process.pid == pid) else {
        return Ok(());
    };
    let (how, fatal) = worker_process::describe(status);
    let who = gens[pos].process.to_string();
    let current = pos + 1 == gens.len();
    let expected = gens[pos].draining || stopping;
    if expected {
        crate::errlog::notice(format_args!("{who} {how}"));
    } else if fatal {
        crate::errlog::log(
            Level::Alert,
            format_args!("{who} {how} and cannot be started again"),
        );
    } else if current {
        crate::errlog::log(Level::Alert, format_args!("{who} {how}; starting it again"));
        let g = &gens[pos];
        let foreign = foreign_fds(&[bound], gens, Some(g.id));
        match worker_process::spawn(&g.config, &g.sockets, &foreign) {
            Ok(p) => {
                gens[pos].process = p;
                return Ok(());
            }
            Err(e) => crate::errlog::log(Level::Alert, format_args!("{e}")),
        }
    }
    gens.remove(pos);
    if gens.is_empty() && !expected {
        return Err(format!("{who} {how}; no worker left"));
    }
    Ok(())
}

/// SIGTERM / SIGINT: the worker processes stop at once; wait for them (a few seconds, then
/// SIGKILL) so that their sockets are closed when the master is gone.
fn terminate(gens: &[Generation]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut left: Vec<libc::pid_t> = gens.iter().filter_map(|g| g.process.terminate()).collect();
    while !left.is_empty() {
        left.retain(|&pid| {
            let mut status = 0;
            // SAFETY: waitpid writes the status into `status`, valid for the call.
            unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) == 0 }
        });
        if Instant::now() >= deadline {
            // SIGKILL once; a worker it cannot reach (no CAP_KILL over another user) is
            // left with an alert rather than waited for forever.
            left.retain(|&pid| {
                // SAFETY: kill takes plain integers; `pid` is our unreaped child.
                if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                    return true;
                }
                let e = std::io::Error::last_os_error();
                crate::errlog::log(
                    Level::Alert,
                    format_args!("kill({pid}, 9) failed ({e}); not waiting for it"),
                );
                false
            });
        }
        if !left.is_empty() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The signals the master handles, blocked and taken one at a time with sigwaitinfo: no
/// handler, no event loop (a tokio runtime here would share its wake-up pipe and epoll set
/// with every worker process forked from it).
const SIGNALS: [libc::c_int; 8] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGHUP,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
    libc::SIGCHLD,
];

fn signal_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it and sigaddset is given
    // valid signal numbers.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in SIGNALS {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Wait for the next of the master's signals.
fn next_signal(set: &libc::sigset_t) -> libc::c_int {
    loop {
        // SAFETY: `set` is an initialised signal set; a null siginfo is allowed.
        let s = unsafe { libc::sigwaitinfo(set, std::ptr::null_mut()) };
        if s > 0 {
            return s;
        }
        // EINTR (a signal outside the set, e.g. SIGSTOP/SIGCONT): wait again.
    }
}

/// The binary upgrade's state in a master (see the module docs).
struct Upgrade {
    /// What SIGUSR2 starts.
    exec: Exec,
    /// The old master that started this one, while it may still run.
    parent: Option<libc::pid_t>,
    daemon: bool,
    /// The new binary this master started, until it exits.
    new_binary: Option<libc::pid_t>,
    /// SIGWINCH stopped the workers; the master stays for SIGHUP or SIGQUIT.
    no_accept: bool,
}

impl Upgrade {
    /// SIGUSR2: start the new binary, unless an upgrade is under way already.
    fn start(&mut self, bound: &Bound, pid_file: &mut Option<PidFile>) {
        let ignored = "the changing binary signal is ignored";
        if worker_process::single_process() {
            // A new binary forked from a process running worker threads would not be a
            // sound copy; nginx's single process does not upgrade either.
            return crate::errlog::notice(format_args!("{ignored}: master_process is off"));
        }
        if let Some(pid) = self.new_binary {
            return crate::errlog::warn(format_args!(
                "{ignored}: new binary process {pid} is running; stop it or this one first"
            ));
        }
        // SAFETY: getppid has no preconditions.
        if self.parent == Some(unsafe { libc::getppid() }) {
            return crate::errlog::warn(format_args!(
                "{ignored}: the old binary's master is still running"
            ));
        }
        crate::errlog::notice(format_args!("changing binary"));
        if let Some(f) = pid_file {
            if let Err(e) = f.rename_oldbin() {
                return crate::errlog::log(Level::Alert, format_args!("{e}; {ignored}"));
            }
        }
        match upgrade::start_new_binary(&self.exec, bound) {
            Ok(pid) => {
                crate::errlog::notice(format_args!("started new binary process {pid}"));
                self.new_binary = Some(pid);
            }
            Err(e) => {
                crate::errlog::log(Level::Alert, format_args!("{e}"));
                if let Some(f) = pid_file {
                    f.back();
                }
            }
        }
    }

    /// Whether SIGWINCH is meant for the master (see the module docs).
    fn winch_honoured(&self) -> bool {
        // A single process has no worker process to stop while it stays.
        !worker_process::single_process()
            && (self.daemon || self.parent.is_some() || self.new_binary.is_some())
    }
}

/// Start a worker process on `config` again, after SIGWINCH stopped them all.
fn restart(gens: &mut Vec<Generation>, bound: &Bound, next_id: &mut u64, config: &Arc<Config>) {
    crate::errlog::notice(format_args!("starting the worker processes again"));
    let started = listener::assign(config, bound).and_then(|sockets| {
        let foreign = foreign_fds(&[bound], gens, None);
        Generation::start(*next_id, config.clone(), sockets, &foreign)
    });
    *next_id += 1;
    match started {
        Ok(g) => gens.push(g),
        Err(e) => crate::errlog::log(Level::Alert, format_args!("{e}")),
    }
}

/// Block the master's signals (so none is lost, and none kills the master, before it
/// waits for them), then write the pid file (a signal sent as soon as the pid file
/// exists is always handled), start the worker process and wait. The pid file this master
/// owns at the end is removed.
fn supervise(
    config: Arc<Config>,
    mut bound: Bound,
    pid_path: Option<&Path>,
    mut up: Upgrade,
    load: impl Fn() -> Result<Config, ConfError>,
) -> Result<(), String> {
    let set = signal_set();
    let mut pid_file = pid_path.map(PidFile::write).transpose()?;
    let result = serve(config, &mut bound, &mut pid_file, &mut up, &set, load);
    // The unix sockets' files, unless another master serves on them: the new binary this
    // one started, or the old master that started this one (nginx's condition).
    // SAFETY: getppid has no preconditions.
    let parent_lives = up.parent == Some(unsafe { libc::getppid() });
    if up.new_binary.is_none() && !parent_lives {
        listener::remove_unix_files(&bound);
    }
    if let Some(f) = pid_file {
        f.remove();
    }
    result
}

/// The master's signal loop.
fn serve(
    config: Arc<Config>,
    bound: &mut Bound,
    pid_file: &mut Option<PidFile>,
    up: &mut Upgrade,
    set: &libc::sigset_t,
    load: impl Fn() -> Result<Config, ConfError>,
) -> Result<(), String> {
    let sockets = listener::assign(&config, bound)?;
    let foreign = foreign_fds(&[bound], &[], None);
    // The config workers run on (the last one loaded), to start them again after SIGWINCH.
    let mut current = config.clone();
    let mut gens = vec![Generation::start(0, config, sockets, &foreign)?];
    notify::ready(&notify::serving(bound));
    let mut next_id = 1;
    let mut draining = false;
    loop {
        if let Some(g) = gens.last() {
            current = g.config.clone();
        }
        match next_signal(set) {
            libc::SIGTERM | libc::SIGINT => {
                notify::stopping("stopping", up.new_binary);
                break;
            }
            libc::SIGQUIT if !draining => {
                notify::stopping("gracefully shutting down", up.new_binary);
                crate::errlog::notice(format_args!("gracefully shutting down"));
                draining = true;
                for g in gens.iter_mut() {
                    g.drain();
                }
                if gens.is_empty() {
                    return Ok(());
                }
            }
            libc::SIGHUP if !draining && up.no_accept => {
                // After SIGWINCH, as nginx: the same config again, not reread.
                up.no_accept = false;
                restart(&mut gens, bound, &mut next_id, &current);
            }
            libc::SIGHUP if !draining => {
                notify::reloading();
                let before = gens.last().map(|g| g.id);
                reload(&mut gens, bound, &mut next_id, &load);
                notify::reloaded(gens.last().map(|g| g.id) != before, bound);
            }
            libc::SIGUSR1 => {
                super::log_reopen::reopen_all(gens.iter().map(|g| &*g.config));
                for g in &gens {
                    g.process.reopen_logs(&g.config);
                }
            }
            libc::SIGUSR2 if !draining => up.start(bound, pid_file),
            libc::SIGWINCH if !draining && !up.no_accept && up.winch_honoured() => {
                crate::errlog::notice(format_args!(
                    "stopping the worker processes (SIGWINCH); the master stays"
                ));
                up.no_accept = true;
                for g in gens.iter_mut() {
                    g.drain();
                }
            }
            libc::SIGCHLD => {
                // Worker processes, or in single-process mode worker threads, that ended.
                let ended = |gens: &[Generation]| {
                    worker_process::reap()
                        .or_else(|| gens.iter().find_map(|g| g.process.finished()))
                };
                while let Some((pid, status)) = ended(&gens) {
                    // What it held in the cache keys zones is freed first.
                    crate::cache::shm::child_died(pid);
                    if up.new_binary == Some(pid) {
                        let (how, _) = worker_process::describe(status);
                        crate::errlog::notice(format_args!("new binary process {pid} {how}"));
                        up.new_binary = None;
                        if let Some(f) = pid_file.as_mut() {
                            f.back();
                        }
                        // nginx too: the old binary serves again if its workers were stopped.
                        if up.no_accept && !draining {
                            up.no_accept = false;
                            restart(&mut gens, bound, &mut next_id, &current);
                        }
                        continue;
                    }
                    exited(&mut gens, bound, draining, pid, status)?;
                }
                // After SIGWINCH the master stays with no worker, until SIGQUIT.
                if gens.is_empty() && (draining || !up.no_accept) {
                    return Ok(());
                }
            }
            _ => {}
        }
    }
    terminate(&gens);
    Ok(())
}

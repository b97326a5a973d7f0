//! The master: binds every listening socket, optionally becomes a daemon, writes the pid
//! file, starts the workers and then only waits for signals and for workers that die.
//!
//! Signals, as nginx: SIGTERM / SIGINT stop at once; SIGQUIT stops gracefully (workers stop
//! accepting, finish what is in flight, close idle connections; `worker_shutdown_timeout`
//! caps the wait); SIGUSR1 reopens the log files; SIGHUP reloads.
//!
//! A reload reads the config again; a bad one is logged with its file:line and the running
//! one keeps serving. Otherwise a new generation of workers starts on the new config and
//! the old generation drains (stops accepting, finishes its in-flight requests, exits).
//! The listening sockets outlive generations (`listener::Bound`): the new workers accept
//! on the very sockets the old ones stop accepting on, so a connection arriving during the
//! switch waits in the backlog instead of being refused.
//!
//! A worker thread that panics is logged and started again on the same sockets (unless its
//! generation is already being replaced).

use super::listener::{self, Bound, WorkerSockets};
use super::placement;
use super::worker::{self, Command};
use crate::config::Config;
use crate::errlog::Level;
use gannet_conf::ConfError;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, watch};

/// Run `config`; `reload` reads the config again for SIGHUP.
pub fn run(config: Config, reload: impl Fn() -> Result<Config, ConfError>) -> Result<(), String> {
    let config = Arc::new(config);
    let main = &config.main;
    crate::errlog::init(&main.error_logs)?;
    if let Some(n) = main.rlimit_nofile {
        set_nofile(n)?;
    }
    let bound = listener::bind_for(&config, &Bound::new())?;
    if main.daemon {
        daemonize()?;
    }
    let pid_file = main.pid.clone();
    let result = supervise(config.clone(), bound, pid_file.as_deref(), reload);
    if let Some(p) = &pid_file {
        let _ = std::fs::remove_file(p);
    }
    result
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

/// A worker's end: its generation, its id and whether it panicked.
type Exit = (u64, usize, bool);

/// The workers started on one config.
struct Generation {
    id: u64,
    config: Arc<Config>,
    sockets: Vec<WorkerSockets>,
    cmd: watch::Sender<Command>,
    running: usize,
}

impl Generation {
    /// Start a worker for each socket set.
    fn start(
        id: u64,
        config: Arc<Config>,
        sockets: Vec<WorkerSockets>,
        exited: &mpsc::UnboundedSender<Exit>,
    ) -> Result<Generation, String> {
        let (cmd, _) = watch::channel(Command::Run);
        let mut g = Generation {
            id,
            config,
            sockets,
            cmd,
            running: 0,
        };
        for w in 0..g.sockets.len() {
            if let Err(e) = g.spawn(w, exited) {
                g.drain();
                return Err(e);
            }
            g.running += 1;
        }
        Ok(g)
    }

    fn spawn(&self, w: usize, exited: &mpsc::UnboundedSender<Exit>) -> Result<(), String> {
        let mine = self.sockets[w]
            .iter()
            .map(|(s, group)| s.try_clone().map(|s| (s, *group)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("socket dup failed: {e}"))?;
        let (config, cmd, exited, gen) = (
            self.config.clone(),
            self.cmd.subscribe(),
            exited.clone(),
            self.id,
        );
        std::thread::Builder::new()
            .name(format!("gannet-worker-{w}"))
            .spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    placement::apply(&config.main, w);
                    // The first worker of a generation runs its health checks.
                    worker::run(config, mine, cmd, w == 0)
                }));
                let _ = exited.send((gen, w, r.is_err()));
            })
            .map(|_| ())
            .map_err(|e| format!("worker thread failed to start: {e}"))
    }

    fn drain(&self) {
        self.cmd.send_replace(Command::Drain);
    }
}

/// SIGHUP: read the config again and, if it loads and its sockets bind, start a new
/// generation on it and drain the others. On any failure the running config stays.
fn reload(
    gens: &mut Vec<Generation>,
    bound: &mut Bound,
    next_id: &mut u64,
    exited: &mpsc::UnboundedSender<Exit>,
    load: &impl Fn() -> Result<Config, ConfError>,
) {
    crate::errlog::notice(format_args!("reconfiguring (SIGHUP)"));
    let kept = "; the running configuration is kept";
    let config = match load() {
        Ok(c) => Arc::new(c),
        Err(e) => return crate::errlog::log(Level::Emerg, format_args!("{e}{kept}")),
    };
    // A fresh id even if this start fails, so late exits of its workers match nothing.
    let id = *next_id;
    *next_id += 1;
    let started = listener::bind_for(&config, bound).and_then(|new_bound| {
        let sockets = listener::assign(&config, &new_bound)?;
        let g = Generation::start(id, config, sockets, exited)?;
        Ok((g, new_bound))
    });
    match started {
        Ok((g, new_bound)) => {
            for old in gens.iter() {
                old.drain();
            }
            gens.push(g);
            // Sockets of addresses no longer listened on close once the old workers,
            // which hold copies, are gone.
            *bound = new_bound;
        }
        Err(e) => crate::errlog::log(Level::Emerg, format_args!("{e}{kept}")),
    }
}

/// Set up signal handling, then write the pid file (so a signal sent as soon as the pid
/// file exists is always handled), start the workers and wait.
fn supervise(
    config: Arc<Config>,
    mut bound: Bound,
    pid_file: Option<&Path>,
    load: impl Fn() -> Result<Config, ConfError>,
) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let sig = |k| signal(k).map_err(|e| format!("signal setup failed: {e}"));
        let (mut term, mut int, mut quit, mut hup, mut usr1) = (
            sig(SignalKind::terminate())?,
            sig(SignalKind::interrupt())?,
            sig(SignalKind::quit())?,
            sig(SignalKind::hangup())?,
            sig(SignalKind::user_defined1())?,
        );
        if let Some(p) = pid_file {
            std::fs::write(p, format!("{}\n", std::process::id())).map_err(|e| format!("open() \"{}\" failed ({e})", p.display()))?;
        }
        let (exit_tx, mut exit_rx) = mpsc::unbounded_channel::<Exit>();
        let sockets = listener::assign(&config, &bound)?;
        let mut gens = vec![Generation::start(0, config, sockets, &exit_tx)?];
        let mut next_id = 1;
        let mut draining = false;
        loop {
            tokio::select! {
                _ = term.recv() => return Ok(()),
                _ = int.recv() => return Ok(()),
                _ = quit.recv(), if !draining => {
                    crate::errlog::notice(format_args!("gracefully shutting down"));
                    draining = true;
                    for g in &gens {
                        g.drain();
                    }
                }
                _ = hup.recv(), if !draining => reload(&mut gens, &mut bound, &mut next_id, &exit_tx, &load),
                _ = usr1.recv() => super::log_reopen::reopen_all(gens.iter().map(|g| &*g.config)),
                Some((gen, w, panicked)) = exit_rx.recv() => {
                    let Some(pos) = gens.iter().position(|g| g.id == gen) else { continue };
                    let current = pos + 1 == gens.len();
                    if panicked && current && !draining {
                        crate::errlog::error(format_args!("worker {w} exited on a panic; starting it again"));
                        gens[pos].spawn(w, &exit_tx)?;
                        continue;
                    }
                    gens[pos].running -= 1;
                    if gens[pos].running == 0 {
                        gens.remove(pos);
                        if gens.is_empty() {
                            return Ok(());
                        }
                    }
                }
            }
        }
    })
}

//! The master: binds every listening socket, optionally becomes a daemon, writes the pid
//! file, starts the workers and then only waits for signals and for workers that die.
//!
//! Signals, as nginx: SIGTERM / SIGINT stop at once; SIGQUIT stops gracefully (workers stop
//! accepting, finish what is in flight, close idle connections; `worker_shutdown_timeout`
//! caps the wait); SIGHUP and SIGUSR1 are logged as not supported yet.
//! A worker thread that panics is logged and started again on the same sockets.

use super::listener;
use super::worker::{self, Command};
use crate::config::Config;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, watch};

pub fn run(config: Config) -> Result<(), String> {
    let config = Arc::new(config);
    let main = &config.main;
    crate::errlog::init(main.error_log.as_deref(), main.error_level).map_err(|e| {
        format!(
            "could not open error log {}: {e}",
            main.error_log
                .as_ref()
                .map_or(String::new(), |p| p.display().to_string())
        )
    })?;
    if let Some(n) = main.rlimit_nofile {
        set_nofile(n)?;
    }
    let listens: Vec<_> = config.listens.iter().map(|g| &g.listen).collect();
    let sockets = listener::bind_all(&listens, main.worker_processes)?;
    if main.daemon {
        daemonize()?;
    }
    let pid_file = main.pid.clone();
    let result = supervise(config.clone(), sockets, pid_file.as_deref());
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

/// A worker's end: its id and whether it panicked.
type Exit = (usize, bool);

fn spawn_worker(
    id: usize,
    config: Arc<Config>,
    sockets: &[TcpListener],
    cmd: watch::Receiver<Command>,
    exited: mpsc::UnboundedSender<Exit>,
) -> Result<(), String> {
    let mine = sockets
        .iter()
        .map(|s| s.try_clone())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("socket dup failed: {e}"))?;
    std::thread::Builder::new()
        .name(format!("gannet-worker-{id}"))
        .spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                worker::run(config, mine, cmd)
            }));
            let _ = exited.send((id, r.is_err()));
        })
        .map(|_| ())
        .map_err(|e| format!("worker thread failed to start: {e}"))
}

/// Set up signal handling, then write the pid file (so a signal sent as soon as the pid
/// file exists is always handled), start the workers and wait.
fn supervise(
    config: Arc<Config>,
    sockets: Vec<Vec<TcpListener>>,
    pid_file: Option<&Path>,
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
        let (tx, rx) = watch::channel(Command::Run);
        let (exit_tx, mut exit_rx) = mpsc::unbounded_channel::<Exit>();
        for (id, s) in sockets.iter().enumerate() {
            spawn_worker(id, config.clone(), s, rx.clone(), exit_tx.clone())?;
        }
        let mut running = sockets.len();
        let mut draining = false;
        loop {
            tokio::select! {
                _ = term.recv() => return Ok(()),
                _ = int.recv() => return Ok(()),
                _ = quit.recv(), if !draining => {
                    crate::errlog::notice(format_args!("gracefully shutting down"));
                    draining = true;
                    let _ = tx.send(Command::Drain);
                }
                _ = hup.recv() => crate::errlog::warn(format_args!("reload (SIGHUP) is not supported yet; restart gannet to apply a new config")),
                _ = usr1.recv() => crate::errlog::warn(format_args!("log reopening (SIGUSR1) is not supported yet")),
                Some((id, panicked)) = exit_rx.recv() => {
                    if panicked && !draining {
                        crate::errlog::error(format_args!("worker {id} exited on a panic; starting it again"));
                        spawn_worker(id, config.clone(), &sockets[id], rx.clone(), exit_tx.clone())?;
                        continue;
                    }
                    running -= 1;
                    if running == 0 {
                        return Ok(());
                    }
                }
            }
        }
    })
}

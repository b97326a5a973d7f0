//! The worker threads of one worker process, and the process's main thread that looks
//! after them: it starts one thread per `worker_processes` (each a `worker::run` event
//! loop on its own sockets), starts a panicked one again on the same sockets, and carries
//! out what the master asks over the channel (drain, adopt reopened log files). The
//! process ends when its last worker thread has drained.

use super::channel::{Channel, MAX_MSG};
use super::listener::WorkerSockets;
use super::placement;
use super::worker::{self, Command};
use crate::config::Config;
use std::os::fd::OwnedFd;
use std::sync::mpsc;
use std::sync::Arc;
use tokio::sync::watch;

/// What the main thread of the worker process waits for.
enum Event {
    /// Worker thread `w` ended (`true`: on a panic).
    Exited(usize, bool),
    /// The master asked for a graceful stop, or is gone.
    Drain,
    /// Log files the master reopened: (log index, descriptor), see `worker_process`.
    Reopen(Vec<(u32, OwnedFd)>),
}

/// Messages on the channel, master to worker process.
pub const MSG_DRAIN: u8 = b'Q';
/// `R` then a little-endian u32 log index per descriptor passed with it.
pub const MSG_REOPEN: u8 = b'R';

/// Run the worker threads until they have drained; the process's exit code.
pub fn run(config: Arc<Config>, sockets: Vec<WorkerSockets>, chan: Channel) -> i32 {
    super::malloc::tune();
    let (tx, rx) = mpsc::channel::<Event>();
    let reader = {
        let tx = tx.clone();
        std::thread::Builder::new()
            .name("gannet-channel".into())
            .spawn(move || read_channel(&chan, &tx))
    };
    if let Err(e) = reader {
        crate::errlog::error(format_args!("channel thread failed to start: {e}"));
        return 2;
    }
    let (cmd, _) = watch::channel(Command::Run);
    let mut running = 0;
    for w in 0..sockets.len() {
        if let Err(e) = spawn(&config, &sockets, w, &cmd, &tx) {
            crate::errlog::error(format_args!("{e}"));
            if running == 0 {
                return 2;
            }
            cmd.send_replace(Command::Drain);
            break;
        }
        running += 1;
    }
    let mut draining = false;
    while running > 0 {
        let Ok(event) = rx.recv() else { break };
        match event {
            Event::Exited(w, panicked) => {
                if panicked && !draining {
                    crate::errlog::error(format_args!(
                        "worker {w} exited on a panic; starting it again"
                    ));
                    match spawn(&config, &sockets, w, &cmd, &tx) {
                        Ok(()) => continue,
                        Err(e) => crate::errlog::error(format_args!("{e}")),
                    }
                }
                running -= 1;
            }
            Event::Drain => {
                draining = true;
                cmd.send_replace(Command::Drain);
            }
            Event::Reopen(fds) => super::log_reopen::adopt(&config, fds),
        }
    }
    crate::modules::otel::flush_at_exit();
    0
}

fn spawn(
    config: &Arc<Config>,
    sockets: &[WorkerSockets],
    w: usize,
    cmd: &watch::Sender<Command>,
    exited: &mpsc::Sender<Event>,
) -> Result<(), String> {
    let mine = sockets[w]
        .iter()
        .map(|(s, group, steer)| s.try_clone().map(|s| (s, *group, *steer)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("socket dup failed: {e}"))?;
    let (config, cmd, exited) = (config.clone(), cmd.subscribe(), exited.clone());
    std::thread::Builder::new()
        .name(format!("gannet-worker-{w}"))
        // A main thread's 8 MiB rather than a thread's 2: a page's SSI includes nest 50
        // deep (nginx's limit), each level polling the next one's subrequest (only the
        // pages touched are ever mapped in).
        .stack_size(8 << 20)
        .spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                placement::apply(&config.main, w);
                // The first worker runs the config's health checks.
                worker::run(config, mine, cmd, w == 0)
            }));
            let _ = exited.send(Event::Exited(w, r.is_err()));
        })
        .map(|_| ())
        .map_err(|e| format!("worker thread failed to start: {e}"))
}

/// Turn the master's messages into events. The channel closing means the master is gone
/// (killed): the worker drains rather than serve on unsupervised.
fn read_channel(chan: &Channel, tx: &mpsc::Sender<Event>) {
    let mut buf = vec![0u8; MAX_MSG];
    loop {
        let mut fds = Vec::new();
        let n = match chan.recv(&mut buf, &mut fds) {
            Ok(0) => {
                // Only news while the worker threads run: in single-process mode this thread
                // outlives them, and the master drops its end once they are done.
                if tx.send(Event::Drain).is_ok() {
                    crate::errlog::notice(format_args!("the master process is gone; draining"));
                }
                return;
            }
            Ok(n) => n,
            Err(e) => {
                crate::errlog::error(format_args!("reading the master's channel failed ({e})"));
                let _ = tx.send(Event::Drain);
                return;
            }
        };
        let event = match buf[0] {
            MSG_DRAIN => Event::Drain,
            MSG_REOPEN => {
                let indices = buf[1..n]
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                Event::Reopen(indices.zip(fds).collect())
            }
            other => {
                crate::errlog::error(format_args!("unknown message {other} from the master"));
                continue;
            }
        };
        if tx.send(event).is_err() {
            return;
        }
    }
}

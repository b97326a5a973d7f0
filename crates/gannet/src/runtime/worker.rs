//! A worker: one OS thread running a single-threaded tokio runtime. It accepts on its own
//! SO_REUSEPORT sockets and serves each connection as a local task; its caches (open files,
//! access-log buffers) are its own, so the request path takes no lock.

use super::parking::ParkingLot;
use super::read_timers::{ReadTimers, TICK};
use crate::config::Config;
use crate::modules::access_log::LogFile;
use crate::modules::file_cache::FileCache;
use crate::upstream::Upstreams;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::sync::{watch, Notify};

/// What the master asks of the workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Run,
    /// SIGQUIT, or a reload replacing this worker: stop accepting, finish in-flight
    /// requests, close idle connections, exit.
    Drain,
    /// SIGTERM / SIGINT: exit at once, the buffered access log lines written first (nginx
    /// flushes its `buffer=` logs as a worker exits, fast or graceful).
    Stop,
}

/// Connection serial numbers are process-wide, as nginx's are.
static CONN_SEQ: AtomicU64 = AtomicU64::new(1);

/// How long a kept-alive connection of a draining worker may still bring a request (it is
/// answered with `Connection: close`) before it is closed. A busy client's next request is
/// at most a round trip away; one idle that long is closed while its client is unlikely to
/// be sending (`PARK_AFTER`: as long as an idle connection waits before it parks).
pub const DRAIN_GRACE: Duration = super::parking::PARK_AFTER;

/// The least time between two hand-backs of freed memory to the system.
const TRIM_INTERVAL: Duration = Duration::from_secs(1);

/// A log file, its pending lines and when they were last written.
type LogBuffer = (Arc<LogFile>, Vec<u8>, Instant);

pub struct Worker {
    pub config: Arc<Config>,
    pub files: FileCache,
    /// Round-robin position, failures and idle connections of each upstream group.
    pub upstreams: Upstreams,
    /// TLS client configs for `https://` upstreams, with this worker's session caches.
    pub tls_sessions: crate::tls::client::Sessions,
    /// Per log file: buffered lines and when they were last written.
    logs: RefCell<HashMap<usize, LogBuffer>>,
    pub active: Cell<usize>,
    /// This thread's share of the server's counters (`stub_status`).
    pub stats: super::conn_stats::Counter,
    /// This thread's slot of the `metrics` counters.
    _metrics: super::metrics::Claim,
    pub draining: Cell<bool>,
    /// Deadlines of connections waiting for their client.
    pub timers: Rc<ReadTimers>,
    /// Woken when a connection ends (a draining worker waits for the last one).
    pub conn_closed: Notify,
    /// A read and an output buffer that kept connections hand on between requests.
    pub spare: crate::conn::reuse::Spare,
    /// Woken when the worker starts draining: connections that wait on their clients
    /// (HTTP/2's and HTTP/3's, between streams) begin their graceful end at once.
    pub drain_started: Notify,
    /// Where idle keep-alive connections wait without a task (`None` if the worker's
    /// epoll set could not be made: connections then simply stay in their tasks).
    pub parking: Option<ParkingLot>,
    last_trim: Cell<Instant>,
    /// Idle connections that gave their buffers back without parking (TLS) since the
    /// last trim.
    shed: Cell<usize>,
    emfile_logged: Cell<bool>,
    /// The second the worker last said it is reusing connections (said once a second).
    reuse_logged: Cell<Option<Instant>>,
}

impl Worker {
    /// A connection (in a task or parked) has closed.
    pub fn connection_closed(&self) {
        self.active.set(self.active.get() - 1);
        self.stats.closed();
        self.conn_closed.notify_waiters();
    }

    /// Count a new connection in, if `worker_connections` has room for it (idle kept
    /// connections are closed first to make some); false when it is to be refused.
    pub fn admit(&self) -> bool {
        self.reuse_connections();
        if self.in_use() >= self.config.main.worker_connections {
            crate::errlog::warn(format_args!(
                "{} worker_connections are not enough",
                self.config.main.worker_connections
            ));
            self.stats.dropped();
            return false;
        }
        self.active.set(self.active.get() + 1);
        self.stats.accepted();
        true
    }

    pub fn next_conn_id() -> u64 {
        CONN_SEQ.fetch_add(1, Ordering::Relaxed)
    }

    /// An idle connection that cannot park gave its buffers back: the memory is returned
    /// to the system with the parked connections' (see `expire_parked`).
    pub fn buffers_shed(&self) {
        self.shed.set(self.shed.get() + 1);
    }

    /// Close parked connections past their keep-alive deadline (all when `all`).
    pub fn expire_parked(&self, now: Instant, all: bool) {
        if let Some(lot) = &self.parking {
            for _ in 0..lot.expire(now, all) {
                self.connection_closed();
            }
            // Connections left their tasks: hand the freed memory back to the system (at
            // most once a second), or the allocator keeps the peak of a burst for good.
            if (lot.parked_since_trim() > 0 || self.shed.get() > 0)
                && now.duration_since(self.last_trim.get()) >= TRIM_INTERVAL
            {
                // SAFETY: malloc_trim only releases free heap pages; it has no preconditions.
                unsafe { libc::malloc_trim(0) };
                self.last_trim.set(now);
                lot.trimmed();
                self.shed.set(0);
            }
        }
    }

    /// A worker close to `worker_connections` makes room before it takes a new connection,
    /// as nginx's `ngx_drain_connections`: it closes the connections that have waited
    /// longest with no request in hand (kept alive, or new and silent), a few at a time
    /// (an eighth of them, between 1 and 32). Connections in the middle of a request are
    /// left to their timeouts. So a flood of idle connections cannot lock real clients
    /// out, and a flood of slow ones only for as long as `client_header_timeout` (or the
    /// body's and send timeouts) lets them stay.
    fn reuse_connections(&self) {
        let limit = self.config.main.worker_connections;
        let free = limit.saturating_sub(self.in_use());
        // nginx starts when a sixteenth of the connections are left.
        if free > limit / 16 {
            return;
        }
        // (waiting since, parked?, key)
        let mut waiting: Vec<(Instant, bool, usize)> = Vec::new();
        let mut found = Vec::new();
        if let Some(lot) = &self.parking {
            lot.waiting(&mut found);
            waiting.extend(found.drain(..).map(|(t, k)| (t, true, k)));
        }
        self.timers.reusable(&mut found);
        waiting.extend(found.drain(..).map(|(t, k)| (t, false, k)));
        if waiting.is_empty() {
            return;
        }
        let now = Instant::now();
        let said = self.reuse_logged.get();
        if said.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1)) {
            self.reuse_logged.set(Some(now));
            crate::errlog::warn(format_args!(
                "{limit} worker_connections are not enough, reusing connections"
            ));
        }
        let n = (waiting.len() / 8).clamp(1, 32);
        if waiting.len() > n {
            waiting.select_nth_unstable(n - 1);
            waiting.truncate(n);
        }
        for (_, parked, key) in waiting {
            if parked {
                if self.parking.as_ref().is_some_and(|lot| lot.close(key)) {
                    self.connection_closed();
                }
            } else {
                // Its task closes it when it next runs; until then it counts as free.
                self.timers.reuse(key);
            }
        }
    }

    /// Connections open, less those told to close for room that have not yet.
    fn in_use(&self) -> usize {
        self.active.get().saturating_sub(self.timers.reusing())
    }

    /// Append a finished log line; written at once without `buffer=`, else when full.
    pub fn log_line(&self, log: &Arc<LogFile>, line: &[u8]) {
        if log.buffer == 0 {
            let _ = log.write(line);
            return;
        }
        let mut logs = self.logs.borrow_mut();
        let entry = logs
            .entry(log.id)
            .or_insert_with(|| (log.clone(), Vec::with_capacity(log.buffer), Instant::now()));
        if entry.1.len() + line.len() > log.buffer {
            let _ = log.write(&entry.1);
            entry.1.clear();
            entry.2 = Instant::now();
        }
        entry.1.extend_from_slice(line);
    }

    /// Write buffers older than their `flush=` time (all of them with `all`).
    pub fn flush_logs(&self, all: bool) {
        let now = Instant::now();
        for (log, buf, since) in self.logs.borrow_mut().values_mut() {
            if !buf.is_empty()
                && (all || log.flush.is_some_and(|f| now.duration_since(*since) >= f))
            {
                let _ = log.write(buf);
                buf.clear();
                *since = now;
            }
        }
    }
}

thread_local! {
    /// This thread's worker, for a task a request starts that outlives it (a cache's
    /// background update).
    static CURRENT: RefCell<std::rc::Weak<Worker>> = const { RefCell::new(std::rc::Weak::new()) };
}

/// This thread's worker (`None` outside worker threads).
pub fn current() -> Option<Rc<Worker>> {
    CURRENT.with(|c| c.borrow().upgrade())
}

/// Run one worker until it is told to drain and its connections are done, or the process
/// exits. Each socket comes with the index of the `config.listens` group it serves (a
/// worker may have several for one group after a reload that lowered `worker_processes`)
/// and, for a QUIC address, how its connections' packets find it.
/// `probe`: this worker runs the config's health checks (`conn::health`).
pub fn run(
    config: Arc<Config>,
    sockets: super::listener::WorkerSockets,
    mut cmd: watch::Receiver<Command>,
    probe: bool,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            crate::errlog::error(format_args!("worker runtime failed to start: {e}"));
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let w = Rc::new(Worker {
            config,
            files: FileCache::default(),
            upstreams: Upstreams::default(),
            tls_sessions: Default::default(),
            logs: RefCell::new(HashMap::new()),
            active: Cell::new(0),
            stats: super::conn_stats::Counter::claim(),
            _metrics: super::metrics::Claim::new(),
            draining: Cell::new(false),
            timers: Rc::default(),
            conn_closed: Notify::new(),
            drain_started: Notify::new(),
            emfile_logged: Cell::new(false),
            reuse_logged: Cell::new(None),
            last_trim: Cell::new(Instant::now()),
            shed: Cell::new(0),
            spare: Default::default(),
            parking: ParkingLot::new()
                .map_err(|e| {
                    crate::errlog::warn(format_args!("idle connections will not be parked: {e}"))
                })
                .ok(),
        });
        CURRENT.with(|c| *c.borrow_mut() = Rc::downgrade(&w));
        if w.parking.is_some() {
            tokio::task::spawn_local(unpark_loop(w.clone()));
        }
        if let (true, Some(acme)) = (probe, &w.config.acme) {
            crate::acme::spawn(acme);
        }
        let probes = if probe {
            let mut t = crate::conn::health::spawn_all(&w.config.probes);
            t.extend(crate::tls::stapling::spawn_all(&w.config.staplers));
            t.extend(w.config.resolving.iter().map(|(up, i)| {
                tokio::task::spawn_local(crate::upstream::keep_resolved(up.clone(), *i))
            }));
            t.extend(crate::cache::fanout::spawn_all(&w.config.purge_zones));
            t
        } else {
            Vec::new()
        };
        let mut accepts = Vec::new();
        let http_groups = w.config.listens.len();
        for (s, i, steering) in sockets {
            let udp = i
                .checked_sub(http_groups)
                .and_then(|k| w.config.stream.as_ref()?.listens.get(k))
                .is_some_and(|l| l.udp);
            if w.config.listens.get(i).is_some_and(|g| g.listen.quic) {
                // `listen ... quic`: this worker's QUIC endpoint on the address.
                let sock = std::net::UdpSocket::from(std::os::fd::OwnedFd::from(s));
                accepts.push(tokio::task::spawn_local(crate::conn::quic::serve(
                    w.clone(),
                    sock,
                    i,
                    steering,
                )));
                continue;
            }
            if udp {
                // A datagram socket held as a listener (`listener::bind`).
                let sock = std::net::UdpSocket::from(std::os::fd::OwnedFd::from(s));
                let run = crate::stream::proxy::udp_listener(w.clone(), sock, i - http_groups);
                accepts.push(tokio::task::spawn_local(run));
                continue;
            }
            // SAFETY: the AsyncFd owns the std listener, which owns its descriptor: it stays
            // open, and the listener's as_raw_fd() stays the same, until the AsyncFd drops.
            let registered =
                unsafe { AsyncFd::register_with_interest(s, tokio::io::Interest::READABLE) };
            match registered {
                Ok(l) => accepts.push(tokio::task::spawn_local(accept_loop(w.clone(), l, i))),
                Err(e) => crate::errlog::error(format_args!("listener setup failed: {e}")),
            }
        }
        // One ticker for the worker's housekeeping: read deadlines and log flushes.
        let ticker = tokio::task::spawn_local({
            let w = w.clone();
            async move {
                let mut tick = tokio::time::interval(TICK);
                loop {
                    tick.tick().await;
                    let now = Instant::now();
                    w.timers.sweep(now);
                    w.expire_parked(now, false);
                    w.upstreams.expire_idle(now);
                    w.flush_logs(false);
                }
            }
        });
        while *cmd.borrow_and_update() == Command::Run {
            if cmd.changed().await.is_err() {
                break;
            }
        }
        // No new connections either way; a fast stop leaves the open ones to be dropped
        // with the runtime.
        for a in accepts.iter().chain(&probes) {
            a.abort();
        }
        if *cmd.borrow() != Command::Stop {
            drain(&w, &mut cmd).await;
        }
        ticker.abort();
        w.flush_logs(true);
    });
}

/// A graceful stop: busy connections close after their response (said with `Connection:
/// close`); kept ones waiting for a request close if none came within `DRAIN_GRACE` (see
/// `read_timers`). Parked ones get a task again for that, and to be closed the careful way
/// (`conn::h1`). Returns when all are done, at `shutdown_timeout`, or at a fast stop that
/// comes meanwhile.
async fn drain(w: &Rc<Worker>, cmd: &mut watch::Receiver<Command>) {
    w.draining.set(true);
    w.drain_started.notify_waiters();
    w.timers.drain(Instant::now() + DRAIN_GRACE);
    w.upstreams.close_idle();
    if let Some(lot) = &w.parking {
        for p in lot.take_all() {
            tokio::task::spawn_local(crate::conn::h1::resume(w.clone(), p));
        }
    }
    let deadline = w.config.main.shutdown_timeout;
    let wait_idle = async {
        while w.active.get() > 0 {
            w.conn_closed.notified().await;
        }
    };
    let stopped = async {
        while *cmd.borrow_and_update() != Command::Stop {
            if cmd.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    };
    let wait = async {
        tokio::select! {
            () = wait_idle => {}
            () = stopped => {}
        }
    };
    match deadline {
        Some(d) => {
            let _ = tokio::time::timeout(d, wait).await;
        }
        None => wait.await,
    }
}

/// Give parked connections that turned readable a task again.
async fn unpark_loop(w: Rc<Worker>) {
    let Some(lot) = &w.parking else { return };
    loop {
        for p in lot.ready().await {
            tokio::task::spawn_local(crate::conn::h1::resume(w.clone(), p));
        }
    }
}

/// Connections accepted before the worker's other tasks get a turn.
const ACCEPTS_PER_TURN: usize = 8;

/// Accepted connections, not served yet.
type Batch = Vec<(std::net::TcpStream, SocketAddr)>;

async fn accept_loop(w: Rc<Worker>, listener: AsyncFd<StdListener>, group: usize) {
    let mut batch = Batch::with_capacity(ACCEPTS_PER_TURN);
    loop {
        // The connections waiting are taken off the queue first (a few per turn), then
        // served: an HTTP one here until it has to wait (`conn::reuse::run_or_spawn`).
        // Served between two accepts, an answer's client could close one connection and
        // open the next before the event loop heard of the close (a `limit_conn` count
        // still held then refuses the new one); taken in order, what happened meanwhile is
        // heard of before the next accept, as nginx hears of it.
        let r = accept_some(&listener, &mut batch).await;
        // A few connections per turn, then the connections already in hand go first: a
        // flood of new connections accepted all at once (up to tokio's budget of 128) would
        // each want an upstream connection before any answer frees a kept one, and the
        // keepalive pool would churn (a proxy in front of nginx lost 10% of a 6,000 req/s
        // replay that way, with 75% of requests opening a new upstream connection).
        let full = batch.len() == ACCEPTS_PER_TURN;
        for (stream, peer) in batch.drain(..) {
            if w.admit() {
                serve(&w, stream, peer, group);
            }
        }
        match r {
            Ok(()) if full => tokio::task::yield_now().await,
            Ok(()) => {}
            Err(e) => {
                // EMFILE / ENFILE: keep serving the connections we have; retry accepting
                // shortly (the backlog keeps the waiting clients) and log once.
                if !w.emfile_logged.replace(true) {
                    crate::errlog::error(format_args!("accept() failed ({e})"));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Serve an accepted connection by its listener's kind.
fn serve(w: &Rc<Worker>, stream: std::net::TcpStream, peer: SocketAddr, group: usize) {
    match group.checked_sub(w.config.listens.len()) {
        None => {
            let w = w.clone();
            crate::conn::reuse::run_or_spawn(move || {
                crate::conn::h1::serve(w, stream, peer, group)
            });
        }
        Some(k) => {
            let streams = w.config.stream.as_ref().map_or(0, |s| s.listens.len());
            match k.checked_sub(streams) {
                None => {
                    tokio::task::spawn_local(crate::stream::core::serve_tcp(
                        w.clone(),
                        stream,
                        peer,
                        k,
                    ));
                }
                Some(m) => {
                    tokio::task::spawn_local(crate::mail::handler::serve_tcp(
                        w.clone(),
                        stream,
                        peer,
                        m,
                    ));
                }
            }
        }
    }
}

/// Wait for connections, then take them off the listener's queue until it is empty (its
/// readiness cleared: the next wait is the event loop's) or `batch` holds
/// [`ACCEPTS_PER_TURN`]. Each is a non-blocking socket that is not in the event loop yet
/// (`conn::transport::Plain` adds it when it has to wait; tokio's `accept` would add every
/// one at once). An error comes back only with nothing accepted (it recurs on the next
/// call otherwise).
async fn accept_some(listener: &AsyncFd<StdListener>, batch: &mut Batch) -> io::Result<()> {
    loop {
        let mut ready = listener.readable().await?;
        while batch.len() < ACCEPTS_PER_TURN {
            let r = ready.try_io(|l| {
                socket2::SockRef::from(l.get_ref())
                    .accept4(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
            });
            let Ok(r) = r else {
                // Drained (the readiness is cleared): serve what came, or wait again.
                break;
            };
            let (sock, addr) = match r {
                Ok(a) => a,
                Err(e) if batch.is_empty() => return Err(e),
                Err(_) => return Ok(()),
            };
            // A unix socket's client has no address: 0.0.0.0:0 stands for it, and the
            // connection knows it is a unix one from its listener (`ConnInfo::unix`).
            let peer = match addr.as_socket() {
                Some(a) => a,
                None if addr.is_unix() => SocketAddr::from(([0, 0, 0, 0], 0)),
                None if batch.is_empty() => return Err(io::ErrorKind::InvalidInput.into()),
                None => return Ok(()),
            };
            batch.push((sock.into(), peer));
        }
        if !batch.is_empty() {
            return Ok(());
        }
    }
}

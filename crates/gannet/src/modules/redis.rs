//! `redis_server name { server host:port | sentinel host:port...; master_name NAME;
//! password secret; db N; timeout T; tls on; tls_trusted_certificate file.pem; }` (http
//! level):
//! a Redis (or Valkey) server that state shared by many gannet nodes is kept in. nginx has
//! no such directive (its open-source edition shares nothing between machines); zones name
//! a server with `redis=name` (`limit_req_zone`, see limit_req/shared.rs).
//!
//! Each worker thread keeps one multiplexed connection per server, made when a request
//! first needs it (the master, which reads the config, never connects), so the request
//! path pays one round trip and no connection set-up. A failed call drops the thread's
//! connection and marks the server down for [`RETRY`]: calls in that time fail at once,
//! without waiting on a dead server, and the first call after it tries again, so sharing
//! resumes by itself when the server is back.

use super::{LoadCtx, LocConf};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo,
    TlsCertificates,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "redis_server",
    ctx: Ctx::HTTP,
    args: Args::Exactly(1),
    block: true,
}];

/// How long a server that failed is left alone before it is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// The connect and response timeout when `timeout` is not given.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// One `redis_server` block.
pub struct Server {
    pub name: String,
    /// `host:port`, for the log.
    pub addr: String,
    source: Source,
    timeout: Duration,
    /// Each worker thread's connection (a connection's driver runs on the runtime that made
    /// it, and each worker thread has its own runtime).
    conns: Mutex<HashMap<ThreadId, MultiplexedConnection>>,
    /// Until when calls fail without trying (the server failed last time).
    down_until: Mutex<Option<Instant>>,
}

/// Where the server is: given, or asked of Sentinels (the current master, asked again for
/// each new connection, so a failover is followed once the old master's connection fails).
enum Source {
    Direct(Client),
    Sentinel(tokio::sync::Mutex<SentinelClient>),
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "redis_server {} ({})", self.name, self.addr)
    }
}

pub fn set(d: &Directive, _lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let name = d.args[0].clone();
    if ctx.redis.contains_key(&name) {
        return Err(d.error(format!("duplicate redis_server \"{name}\"")));
    }
    let mut addr = None;
    let mut settings = RedisConnectionInfo::default();
    let mut timeout = DEFAULT_TIMEOUT;
    let mut tls = false;
    let mut trusted = None;
    let mut sentinels = Vec::new();
    let mut master = None;
    for e in d.block.as_deref().unwrap_or_default() {
        if e.block.is_some() {
            return Err(e.error("unexpected \"{\""));
        }
        let [value] = e.args.as_slice() else {
            return Err(e.error(format!(
                "invalid number of arguments in \"{}\" directive",
                e.name
            )));
        };
        match e.name.as_str() {
            "server" => addr = Some((host_port(value).ok_or_else(|| bad(e, value))?, e)),
            "sentinel" => sentinels.push(host_port(value).ok_or_else(|| bad(e, value))?),
            "master_name" => master = Some(value.clone()),
            "password" => settings = settings.set_password(value),
            "db" => {
                let n = setters::num(value).ok_or_else(|| bad(e, value))?;
                settings = settings.set_db(i64::try_from(n).map_err(|_| bad(e, value))?);
            }
            "timeout" => {
                let ms = setters::msec(value)
                    .filter(|&ms| ms > 0)
                    .ok_or_else(|| bad(e, value))?;
                timeout = Duration::from_millis(ms);
            }
            "tls" => {
                tls = match value.as_str() {
                    "on" => true,
                    "off" => false,
                    _ => return Err(bad(e, value)),
                }
            }
            "tls_trusted_certificate" => {
                let path = ctx.prefix.join(value);
                let pem = std::fs::read(&path)
                    .map_err(|err| e.error(format!("cannot read \"{}\": {err}", path.display())))?;
                trusted = Some(pem);
            }
            other => return Err(e.error(format!("unknown directive \"{other}\""))),
        }
    }
    if trusted.is_some() && !tls {
        return Err(d.error("\"tls_trusted_certificate\" needs \"tls on\""));
    }
    let source = match (addr, sentinels.is_empty()) {
        (Some(((host, port), at)), true) => {
            let client = direct(host.clone(), port, settings, tls, trusted)
                .map_err(|err| at.error(format!("redis_server \"{name}\": {err}")))?;
            (Source::Direct(client), format!("{host}:{port}"))
        }
        (None, false) => {
            let Some(master) = master else {
                return Err(d.error(format!("no \"master_name\" in redis_server \"{name}\"")));
            };
            if trusted.is_some() {
                return Err(
                    d.error("\"tls_trusted_certificate\" is not supported with \"sentinel\"")
                );
            }
            let at = sentinels.iter().map(|(h, p)| format!("{h}:{p}"));
            let shown = format!(
                "sentinel {}, master {master}",
                at.collect::<Vec<_>>().join(" ")
            );
            let mut node =
                SentinelNodeConnectionInfo::default().set_redis_connection_info(settings);
            if tls {
                node = node.set_tls_mode(redis::TlsMode::Secure);
            }
            let addrs = sentinels
                .into_iter()
                .map(|(h, p)| ConnectionAddr::Tcp(h, p));
            let client = SentinelClient::build(
                addrs.collect(),
                master,
                Some(node),
                SentinelServerType::Master,
            )
            .map_err(|err| d.error(format!("redis_server \"{name}\": {err}")))?;
            (Source::Sentinel(tokio::sync::Mutex::new(client)), shown)
        }
        (Some((_, at)), false) => {
            return Err(at.error("\"server\" and \"sentinel\" cannot both be given"));
        }
        (None, true) => {
            return Err(d.error(format!("no \"server\" in redis_server \"{name}\"")));
        }
    };
    let (source, addr) = source;
    let server = Server {
        name: name.clone(),
        addr,
        source,
        timeout,
        conns: Mutex::default(),
        down_until: Mutex::default(),
    };
    ctx.redis.insert(name, Arc::new(server));
    Ok(())
}

/// A client for one server (`server host:port`), over TLS with `tls on`.
fn direct(
    host: String,
    port: u16,
    settings: RedisConnectionInfo,
    tls: bool,
    trusted: Option<Vec<u8>>,
) -> redis::RedisResult<Client> {
    let addr = if tls {
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(host, port)
    };
    let info = addr.into_connection_info()?.set_redis_settings(settings);
    if !tls {
        return Client::open(info);
    }
    // The system's roots unless the block names its own (a PEM file).
    let certs = TlsCertificates {
        client_tls: None,
        root_cert: trusted,
    };
    Client::build_with_tls(info, certs)
}

fn bad(e: &Directive, value: &str) -> ConfError {
    e.error(format!("invalid value \"{value}\" in \"{}\"", e.name))
}

/// `host:port` (`[::1]:6379` for IPv6); the port is Redis's 6379 when left out.
fn host_port(s: &str) -> Option<(String, u16)> {
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && !p.contains(']') => (h, p.parse().ok()?),
        _ => (s, 6379),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty() && port > 0).then(|| (host.to_string(), port))
}

/// This process's id among the nodes (random per process): what a node's counts in Redis are
/// filed under, and how a node knows its own purge messages.
pub static NODE: std::sync::LazyLock<u64> = std::sync::LazyLock::new(|| fastrand::u64(1..));

impl Server {
    /// This thread's connection, made if it has none; the error says why not, for the log.
    async fn conn(&self) -> Result<(ThreadId, MultiplexedConnection), String> {
        if super::limit_zone::lock(&self.down_until).is_some_and(|t| Instant::now() < t) {
            return Err("not answering (waiting to retry)".into());
        }
        let thread = std::thread::current().id();
        let known = super::limit_zone::lock(&self.conns).get(&thread).cloned();
        if let Some(c) = known {
            return Ok((thread, c));
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let made = match self.client().await {
            Ok(client) => {
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
            }
            Err(e) => Err(e),
        };
        match made {
            Ok(c) => {
                super::limit_zone::lock(&self.conns).insert(thread, c.clone());
                Ok((thread, c))
            }
            Err(e) => Err(self.failed(thread, e)),
        }
    }

    /// The client of the server, or of the master the Sentinels name now.
    async fn client(&self) -> redis::RedisResult<Client> {
        match &self.source {
            Source::Direct(c) => Ok(c.clone()),
            Source::Sentinel(s) => s.lock().await.async_get_client().await,
        }
    }

    /// Note how a call ended: the server answers, or it is left alone for a while.
    fn ended<T>(&self, thread: ThreadId, r: redis::RedisResult<T>) -> Result<T, String> {
        match r {
            Ok(v) => {
                *super::limit_zone::lock(&self.down_until) = None;
                Ok(v)
            }
            Err(e) => Err(self.failed(thread, e)),
        }
    }

    /// Run `script` with `keys` and `args` on the server; the error says why not, for the
    /// log.
    pub async fn eval(
        &self,
        script: &redis::Script,
        keys: &[String],
        args: &[u64],
    ) -> Result<Vec<i64>, String> {
        let (thread, mut conn) = self.conn().await?;
        let mut call = script.prepare_invoke();
        for k in keys {
            call.key(k);
        }
        for a in args {
            call.arg(*a);
        }
        let r = call.invoke_async(&mut conn).await;
        self.ended(thread, r)
    }

    /// Run one command (ACME's storage: GET, MSET, SET NX); the error says why not.
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, String> {
        let (thread, mut conn) = self.conn().await?;
        let r = cmd.query_async::<T>(&mut conn).await;
        self.ended(thread, r)
    }

    /// Send `message` to the nodes listening on `channel` (PUBLISH); how many got it.
    pub async fn publish(&self, channel: &str, message: &[u8]) -> Result<i64, String> {
        let (thread, mut conn) = self.conn().await?;
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(channel).arg(message);
        let r = cmd.query_async::<i64>(&mut conn).await;
        self.ended(thread, r)
    }

    /// Call `on` with each message on `channel`, for ever: a lost connection is made again
    /// a [`RETRY`] later (the error logged once until it works again).
    pub async fn subscribe(&self, channel: &str, mut on: impl FnMut(Vec<u8>)) {
        let mut logged = false;
        loop {
            let sub = async {
                let mut ps = self.client().await?.get_async_pubsub().await?;
                ps.subscribe(channel).await?;
                Ok::<_, redis::RedisError>(ps)
            };
            match tokio::time::timeout(self.timeout, sub).await {
                Ok(Ok(ps)) => {
                    if std::mem::take(&mut logged) {
                        crate::errlog::notice(format_args!(
                            "redis_server \"{}\" ({}): listening on \"{channel}\" again",
                            self.name, self.addr
                        ));
                    }
                    let mut stream = std::pin::pin!(ps.into_on_message());
                    while let Some(msg) = std::future::poll_fn(|cx| {
                        futures_core::Stream::poll_next(stream.as_mut(), cx)
                    })
                    .await
                    {
                        on(msg.get_payload_bytes().to_vec());
                    }
                }
                Ok(Err(e)) if !logged => {
                    logged = true;
                    crate::errlog::error(format_args!(
                        "redis_server \"{}\" ({}): cannot listen on \"{channel}\": {e}",
                        self.name, self.addr
                    ));
                }
                _ => {}
            }
            // Not too often: the server is down, or the connection was just lost.
            tokio::time::sleep(RETRY).await;
        }
    }

    /// Forget this thread's connection and leave the server alone for a while.
    fn failed(&self, thread: ThreadId, e: redis::RedisError) -> String {
        super::limit_zone::lock(&self.conns).remove(&thread);
        *super::limit_zone::lock(&self.down_until) = Some(Instant::now() + RETRY);
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::host_port;

    #[test]
    fn addresses() {
        assert_eq!(
            host_port("127.0.0.1:6380"),
            Some(("127.0.0.1".into(), 6380))
        );
        assert_eq!(host_port("redis.local"), Some(("redis.local".into(), 6379)));
        assert_eq!(host_port("[::1]:7000"), Some(("::1".into(), 7000)));
        assert_eq!(host_port("h:0"), None);
        assert_eq!(host_port("h:x"), None);
    }
}

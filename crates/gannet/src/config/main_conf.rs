//! Main- and events-context settings: `worker_processes`, `worker_connections`, `pid`,
//! `daemon`, `master_process`, `error_log`, `worker_rlimit_nofile`, `worker_shutdown_timeout`,
//! `worker_cpu_affinity`, `worker_priority`; and `quic_bpf` (nginx's ngx_quic_bpf_module,
//! a core module too: `conn::quic_bpf` does the steering it turns on).
//!
//! As in nginx, each of them but `error_log` may be set once: a second one, in the file or
//! after the same directive given with `-g`, is a "directive is duplicate" error.

use crate::errlog;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use std::path::PathBuf;
use std::time::Duration;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "worker_processes",
        ctx: Ctx::MAIN,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "pid",
        ctx: Ctx::MAIN,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "daemon",
        ctx: Ctx::MAIN,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "master_process",
        ctx: Ctx::MAIN,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "error_log",
        ctx: Ctx::MAIN.or(Ctx::HSL),
        args: Args::Between(1, 2),
        block: false,
    },
    Spec {
        name: "worker_rlimit_nofile",
        ctx: Ctx::MAIN,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "worker_shutdown_timeout",
        ctx: Ctx::MAIN,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "worker_cpu_affinity",
        ctx: Ctx::MAIN,
        args: Args::AtLeast(1),
        block: false,
    },
    Spec {
        name: "worker_priority",
        ctx: Ctx::MAIN,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "quic_bpf",
        ctx: Ctx::MAIN,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "worker_connections",
        ctx: Ctx::EVENTS,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "debug_connection",
        ctx: Ctx::EVENTS,
        args: Args::Exactly(1),
        block: false,
    },
];

/// `debug_connection`: a client whose requests are logged at the debug level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DebugPeer {
    Net(crate::http::cidr::Cidr),
    /// `unix:`: every connection to a UNIX-domain socket.
    Unix,
}

/// Whether a client at `peer` (None: over a UNIX-domain socket) is one to debug.
pub fn debugged(peers: &[DebugPeer], peer: Option<std::net::IpAddr>) -> bool {
    peers.iter().any(|p| match (p, peer) {
        (DebugPeer::Unix, None) => true,
        (DebugPeer::Net(c), Some(ip)) => c.contains(crate::http::cidr::unmapped(ip)),
        _ => false,
    })
}

#[derive(Debug, Clone)]
pub struct MainConf {
    pub worker_processes: usize,
    pub worker_connections: usize,
    pub pid: Option<PathBuf>,
    pub daemon: bool,
    /// `master_process`: `off` runs the worker threads in the process started, with no
    /// worker process and no `user` (`runtime::master`, "Single process").
    pub master_process: bool,
    /// The main context's `error_log`s (none: stderr, or `-e`'s log).
    pub error_logs: Vec<errlog::Spec>,
    pub rlimit_nofile: Option<u64>,
    /// How long a graceful stop (SIGQUIT) waits for in-flight requests.
    pub shutdown_timeout: Option<Duration>,
    /// `worker_cpu_affinity`: the CPUs each worker thread may run on.
    pub cpu_affinity: Option<CpuAffinity>,
    /// `worker_priority`: the workers' nice value.
    pub priority: Option<i32>,
    /// `debug_connection`s (several may be given).
    pub debug_connection: Vec<DebugPeer>,
    /// `quic_bpf`: a QUIC address's packets are steered to the worker whose connection they
    /// are for, by connection ID (`conn::quic_bpf`); nginx's default off.
    pub quic_bpf: bool,
    /// The single-valued directives already set, for the "duplicate" error.
    seen: Vec<&'static str>,
}

/// `worker_cpu_affinity auto [mask]` or `worker_cpu_affinity mask...`; a mask is binary
/// digits, the rightmost for CPU 0 (`0101` = CPUs 0 and 2), kept as the CPU numbers it sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuAffinity {
    /// Worker N on the Nth CPU of the mask (without one, of the CPUs the process may use),
    /// round robin.
    Auto(Option<Vec<usize>>),
    /// Worker N on the Nth mask; workers beyond the last mask share it, as in nginx.
    Masks(Vec<Vec<usize>>),
}

/// The most CPUs a mask may name: CPU_SETSIZE, nginx's limit too.
const MAX_CPUS: usize = libc::CPU_SETSIZE as usize;

fn cpu_mask(d: &Directive, mask: &str) -> Result<Vec<usize>, ConfError> {
    if mask.len() > MAX_CPUS {
        return Err(d.error(format!(
            "\"worker_cpu_affinity\" supports up to {MAX_CPUS} CPUs only"
        )));
    }
    let mut cpus = Vec::new();
    for (cpu, c) in mask.bytes().rev().enumerate() {
        match c {
            b'1' => cpus.push(cpu),
            b'0' | b' ' => {}
            _ => {
                return Err(d.error(format!(
                    "invalid character \"{}\" in \"worker_cpu_affinity\"",
                    c as char
                )))
            }
        }
    }
    Ok(cpus)
}

impl Default for MainConf {
    fn default() -> Self {
        MainConf {
            worker_processes: 1,
            worker_connections: 512,
            pid: None,
            daemon: false,
            master_process: true,
            error_logs: Vec::new(),
            rlimit_nofile: None,
            shutdown_timeout: None,
            cpu_affinity: None,
            priority: None,
            debug_connection: Vec::new(),
            quic_bpf: false,
            seen: Vec::new(),
        }
    }
}

impl MainConf {
    /// Apply one main/events directive. `prefix` resolves relative paths as nginx's `-p` does.
    /// Returns Ok(false) when the directive is not one of ours.
    pub fn set(&mut self, d: &Directive, prefix: &std::path::Path) -> Result<bool, ConfError> {
        if d.name != "error_log" && d.name != "debug_connection" {
            if let Some(spec) = DIRECTIVES.iter().find(|s| s.name == d.name) {
                if self.seen.contains(&spec.name) {
                    return Err(d.error(format!("\"{}\" directive is duplicate", d.name)));
                }
                self.seen.push(spec.name);
            }
        }
        match d.name.as_str() {
            "worker_processes" => {
                self.worker_processes = if d.args[0] == "auto" {
                    std::thread::available_parallelism()
                        .map(|n| n.get())
                        .unwrap_or(1)
                } else {
                    match d.args[0].parse::<usize>() {
                        Ok(n) if n > 0 && n <= 1024 => n,
                        _ => {
                            return Err(d.error(format!(
                                "invalid value \"{}\" in \"worker_processes\" directive",
                                d.args[0]
                            )))
                        }
                    }
                }
            }
            "debug_connection" => {
                let a = d.args[0].as_str();
                if a == "unix:" {
                    self.debug_connection.push(DebugPeer::Unix);
                } else if let Some((c, _)) = crate::http::cidr::Cidr::parse(a) {
                    self.debug_connection.push(DebugPeer::Net(c));
                } else {
                    // A name: each of its addresses, as nginx resolves it at start.
                    use std::net::ToSocketAddrs;
                    let found: Vec<_> = (a, 0)
                        .to_socket_addrs()
                        .map(Iterator::collect)
                        .unwrap_or_default();
                    if found.is_empty() {
                        return Err(d.error(format!("host not found in debug_connection \"{a}\"")));
                    }
                    for sa in found {
                        let ip = crate::http::cidr::unmapped(sa.ip());
                        if let Some((c, _)) = crate::http::cidr::Cidr::parse(&ip.to_string()) {
                            self.debug_connection.push(DebugPeer::Net(c));
                        }
                    }
                }
            }
            "worker_connections" => {
                self.worker_connections = match d.args[0].parse::<usize>() {
                    Ok(n) if n > 0 => n,
                    _ => {
                        return Err(d.error(format!(
                            "invalid value \"{}\" in \"worker_connections\" directive",
                            d.args[0]
                        )))
                    }
                }
            }
            "pid" => {
                self.pid = if d.args[0] == "off" {
                    None
                } else {
                    Some(prefix.join(&d.args[0]))
                }
            }
            "daemon" => self.daemon = setters::flag(d)?,
            "master_process" => self.master_process = setters::flag(d)?,
            "quic_bpf" => self.quic_bpf = setters::flag(d)?,
            "worker_rlimit_nofile" => {
                self.rlimit_nofile = Some(d.args[0].parse::<u64>().map_err(|_| {
                    d.error(format!(
                        "invalid value \"{}\" in \"worker_rlimit_nofile\" directive",
                        d.args[0]
                    ))
                })?)
            }
            "worker_cpu_affinity" => {
                self.cpu_affinity = Some(if d.args[0] == "auto" {
                    if d.args.len() > 2 {
                        return Err(d.error(
                            "invalid number of arguments in \"worker_cpu_affinity\" directive",
                        ));
                    }
                    CpuAffinity::Auto(d.args.get(1).map(|m| cpu_mask(d, m)).transpose()?)
                } else {
                    CpuAffinity::Masks(
                        d.args
                            .iter()
                            .map(|m| cpu_mask(d, m))
                            .collect::<Result<_, _>>()?,
                    )
                })
            }
            "worker_priority" => {
                // As nginx: any integer, which the kernel clamps to -20..19.
                self.priority = Some(
                    d.args[0]
                        .parse::<i32>()
                        .map_err(|_| d.error("\"worker_priority\" directive invalid number"))?,
                )
            }
            "worker_shutdown_timeout" => {
                let ms = setters::msec(&d.args[0]).ok_or_else(|| {
                    d.error(format!(
                        "invalid value \"{}\" in \"worker_shutdown_timeout\" directive",
                        d.args[0]
                    ))
                })?;
                self.shutdown_timeout = Some(Duration::from_millis(ms));
            }
            // http/server/location `error_log`s are the load step's (`errlog::set_nested`).
            "error_log" => self.error_logs.push(errlog::Spec::parse(d, prefix)?),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

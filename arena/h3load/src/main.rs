//! h3load: an HTTP/3 load client for the arena (arena/README.md, "The HTTP/3 variant"), with
//! h2load's options for a fixed number of requests: `-n` requests over `-c` connections with
//! `-m` streams in flight on each. Debian's h2load is built without QUIC, so the arena's
//! `--h3` runs use this instead. One thread (a current-thread tokio runtime), so pinned to
//! one CPU it takes one CPU, as `h2load -t 1` does.

mod load;
mod report;
mod tls;

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use clap::{value_parser, Arg, ArgAction, ArgMatches, Command};

fn cli() -> Command {
    Command::new("h3load")
        .version(env!("CARGO_PKG_VERSION"))
        .about("HTTP/3 load client: -n requests over -c QUIC connections, -m streams on each")
        .arg(
            Arg::new("requests")
                .short('n')
                .long("requests")
                .value_parser(value_parser!(u64).range(1..))
                .default_value("1")
                .help("requests in all"),
        )
        .arg(
            Arg::new("clients")
                .short('c')
                .long("clients")
                .value_parser(value_parser!(u64).range(1..=100_000))
                .default_value("1")
                .help("QUIC connections, each from its own UDP socket"),
        )
        .arg(
            Arg::new("streams")
                .short('m')
                .long("max-concurrent-streams")
                .value_parser(value_parser!(u64).range(1..=10_000))
                .default_value("1")
                .help("requests in flight on each connection"),
        )
        .arg(
            Arg::new("header")
                .short('H')
                .long("header")
                .action(ArgAction::Append)
                .help("a request field, `name: value` (repeatable)"),
        )
        .arg(
            Arg::new("cacert").long("cacert").help(
                "verify the server's certificate against this PEM file (default: not verified)",
            ),
        )
        .arg(
            Arg::new("timeout")
                .long("timeout")
                .value_parser(value_parser!(u64).range(1..=3600))
                .default_value("30")
                .help("seconds: the handshake deadline and the QUIC idle timeout"),
        )
        .arg(
            Arg::new("url")
                .required(true)
                .help("https://host:port/path"),
        )
}

fn headers(args: &ArgMatches) -> Result<http::HeaderMap, String> {
    let mut map = http::HeaderMap::new();
    for line in args.get_many::<String>("header").into_iter().flatten() {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| format!("-H {line:?}: expected `name: value`"))?;
        let name =
            http::HeaderName::try_from(name.trim()).map_err(|e| format!("-H {line:?}: {e}"))?;
        let value =
            http::HeaderValue::try_from(value.trim()).map_err(|e| format!("-H {line:?}: {e}"))?;
        map.append(name, value);
    }
    Ok(map)
}

/// The URL's address and the name the handshake offers (SNI; none is sent for an address).
fn target(uri: &http::Uri) -> Result<(SocketAddr, String), String> {
    if uri.scheme_str() != Some("https") {
        return Err(format!("{uri}: HTTP/3 needs an https:// URL"));
    }
    let host = uri.host().ok_or_else(|| format!("{uri}: no host"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(443);
    let addr = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host}: no address"))?;
    Ok((addr, host.to_string()))
}

/// Up to the hard limit of open files: each connection has its own UDP socket.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read or write the struct passed, which lives on
    // this stack frame for both calls.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

fn run(args: &ArgMatches) -> Result<bool, String> {
    let url: &String = args.get_one("url").ok_or("no URL")?;
    let uri: http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
    let (addr, server_name) = target(&uri)?;
    let number = |name: &str| args.get_one::<u64>(name).copied().unwrap_or(1);
    let (requests, connections, streams) = (
        number("requests"),
        number("clients") as usize,
        number("streams") as usize,
    );
    let timeout = Duration::from_secs(number("timeout"));
    let cacert = args.get_one::<String>("cacert").map(String::as_str);
    let plan = load::Plan {
        uri,
        headers: headers(args)?,
        addr,
        server_name,
        streams,
        timeout,
        client: tls::client_config(cacert, timeout)?,
    };
    raise_open_files_limit();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let local = tokio::task::LocalSet::new();
    let (mut tally, elapsed) = local.block_on(&runtime, load::run(plan, requests, connections));
    let setup = report::Setup {
        url,
        requests,
        connections,
        streams,
        verified: cacert.is_some(),
    };
    print!("{}", report::render(&setup, &mut tally, elapsed));
    if tally.done == 0 {
        let why = tally.first_error.as_deref().unwrap_or("no connection made");
        eprintln!("h3load: no request was answered: {why}");
        return Ok(false);
    }
    Ok(true)
}

fn main() -> ExitCode {
    let args = cli().get_matches();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("h3load: {e}");
            ExitCode::from(2)
        }
    }
}

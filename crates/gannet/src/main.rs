//! `gannet`: the command line, as nginx's.
//!
//! - `gannet` serves the current directory on 127.0.0.1:8080 from an embedded config.
//! - `gannet -c FILE [-p PREFIX]` runs a config; `-t` only checks it; `-s stop|quit` signals
//!   the running instance named by the config's `pid`; `-V` / `-v` print the version.

mod config;
mod conn;
mod errlog;
mod http;
mod log_open;
mod modules;
mod runtime;
mod tls;
mod upstream;

use clap::{Arg, ArgAction, Command};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const DEFAULT_CONF: &str = include_str!("default.conf");
const MIME_TYPES: &str = include_str!("../../../conf/mime.types");
/// Where the embedded default listens unless `GANNET_LISTEN` says otherwise.
const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

fn cli() -> Command {
    Command::new("gannet")
        .about("An event-driven HTTP server configured with nginx's syntax")
        .disable_version_flag(true)
        .arg(
            Arg::new("conf")
                .short('c')
                .value_name("FILE")
                .help("use this configuration file"),
        )
        .arg(
            Arg::new("prefix").short('p').value_name("PREFIX").help(
                "resolve relative paths against PREFIX (default: the config file's directory)",
            ),
        )
        .arg(
            Arg::new("test")
                .short('t')
                .action(ArgAction::SetTrue)
                .help("check the configuration and exit"),
        )
        .arg(
            Arg::new("quiet")
                .short('q')
                .action(ArgAction::SetTrue)
                .help("with -t, print errors only"),
        )
        .arg(
            Arg::new("signal")
                .short('s')
                .value_name("SIGNAL")
                .value_parser(["stop", "quit", "reload", "reopen"])
                .help("send a signal to the running gannet (pid from the config)"),
        )
        .arg(
            Arg::new("version")
                .short('v')
                .action(ArgAction::SetTrue)
                .help("print the version and exit"),
        )
        .arg(
            Arg::new("Version")
                .short('V')
                .action(ArgAction::SetTrue)
                .help("print the version and build details and exit"),
        )
}

fn main() -> ExitCode {
    let m = cli().get_matches();
    let version = concat!("gannet version: gannet/", env!("CARGO_PKG_VERSION"));
    if m.get_flag("version") {
        eprintln!("{version}");
        return ExitCode::SUCCESS;
    }
    if m.get_flag("Version") {
        eprintln!("{version}\nbuilt with rustc, tokio; HTTP/1.1, static files\nconfigure arguments: none (one binary, everything built in)");
        return ExitCode::SUCCESS;
    }
    let conf_path = m.get_one::<String>("conf").map(PathBuf::from);
    let prefix = match (m.get_one::<String>("prefix"), &conf_path) {
        (Some(p), _) => PathBuf::from(p),
        (None, Some(c)) => c
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
        (None, None) => std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
    };
    let prefix = std::fs::canonicalize(&prefix).unwrap_or(prefix);
    let shown = conf_path.as_ref().map_or_else(
        || "(embedded default)".to_string(),
        |p| p.display().to_string(),
    );
    let loaded = match &conf_path {
        Some(p) => config::load(p, &prefix),
        None => embedded(&prefix),
    };
    let cfg = match loaded {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gannet: [emerg] {e}");
            if m.get_flag("test") {
                eprintln!("gannet: configuration file {shown} test failed");
            }
            return ExitCode::FAILURE;
        }
    };
    if m.get_flag("test") {
        if !m.get_flag("quiet") {
            for n in &cfg.notices {
                eprintln!("gannet: [notice] {n}");
            }
            eprintln!("gannet: the configuration file {shown} syntax is ok");
            eprintln!("gannet: configuration file {shown} test is successful");
        }
        return ExitCode::SUCCESS;
    }
    if let Some(sig) = m.get_one::<String>("signal") {
        return send_signal(&cfg, sig);
    }
    if conf_path.is_none() {
        eprintln!(
            "gannet: serving {} on http://{}/ (Ctrl-C stops)",
            prefix.display(),
            listen_addr()
        );
    }
    // SIGHUP reads the same file (or the embedded default) again.
    let reload = move || match &conf_path {
        Some(p) => config::load(p, &prefix),
        None => embedded(&prefix),
    };
    match runtime::master::run(cfg, reload) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gannet: [emerg] {e}");
            ExitCode::FAILURE
        }
    }
}

fn listen_addr() -> String {
    std::env::var("GANNET_LISTEN").unwrap_or_else(|_| DEFAULT_LISTEN.to_string())
}

/// The embedded default config, serving `root`.
fn embedded(root: &Path) -> Result<config::Config, gannet_conf::ConfError> {
    let root = root
        .to_string_lossy()
        .replace('\\', "\\\\")
        .replace('"', "\\\"");
    let text = DEFAULT_CONF
        .replace("{{MIME}}", MIME_TYPES)
        .replace("{{ROOT}}", &root)
        .replace("{{LISTEN}}", &listen_addr());
    let tree = gannet_conf::parse_str(&text, "(embedded default)", root.as_ref())?;
    config::load::build(&tree, Path::new(&root))
}

fn send_signal(cfg: &config::Config, sig: &str) -> ExitCode {
    let Some(pid_file) = &cfg.main.pid else {
        eprintln!("gannet: [error] no \"pid\" file in the configuration, cannot signal");
        return ExitCode::FAILURE;
    };
    let pid = match std::fs::read_to_string(pid_file)
        .ok()
        .and_then(|s| s.trim().parse::<libc::pid_t>().ok())
    {
        Some(p) if p > 0 => p,
        _ => {
            eprintln!(
                "gannet: [error] invalid PID number in \"{}\"",
                pid_file.display()
            );
            return ExitCode::FAILURE;
        }
    };
    let signo = match sig {
        "stop" => libc::SIGTERM,
        "quit" => libc::SIGQUIT,
        "reload" => libc::SIGHUP,
        _ => libc::SIGUSR1,
    };
    // SAFETY: kill() takes plain integers and has no memory-safety preconditions.
    if unsafe { libc::kill(pid, signo) } != 0 {
        eprintln!(
            "gannet: [error] kill({pid}, {sig}) failed ({})",
            std::io::Error::last_os_error()
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

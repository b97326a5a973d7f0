//! `gannet`: the command line, as nginx's (the flags are in `cli`).
//!
//! - `gannet` runs `/etc/gannet/gannet.conf` if it exists, else serves the current directory
//!   on 127.0.0.1:8080 from an embedded config.
//! - `gannet -c FILE [-p PREFIX] [-g DIRECTIVES] [-e LOG]` runs a config; `-t` only checks it,
//!   `-T` also prints it; `-s stop|quit|reload|reopen` signals the running instance named by
//!   the config's `pid`; `-V` / `-v` print the version.
//! - `gannet --https NAME --root DIR | --proxy ADDR` serves NAME over HTTPS with an ACME
//!   certificate from a config generated from the options (`oneline`).

mod acme;
mod cache;
mod cli;
mod config;
mod conn;
mod errlog;
mod http;
mod log_open;
mod mail;
mod modules;
mod oneline;
mod resolver;
mod runtime;
mod stream;
mod syslog;
mod tls;
mod upstream;

use std::io::Write;
use std::process::ExitCode;

/// glibc's malloc, with tokio's 128-byte-aligned tasks carved by hand (`runtime::malloc`).
#[global_allocator]
static ALLOC: runtime::malloc::Malloc = runtime::malloc::Malloc;

fn main() -> ExitCode {
    let m = cli::command().get_matches();
    if m.get_flag("man") {
        return match cli::man_page(&mut std::io::stdout().lock()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::FAILURE,
        };
    }
    if m.get_flag("version") {
        eprintln!("{}", cli::version_line());
        return ExitCode::SUCCESS;
    }
    if m.get_flag("Version") {
        eprintln!("{}", cli::version_details());
        return ExitCode::SUCCESS;
    }
    let (test, dump) = (m.get_flag("test") || m.get_flag("dump"), m.get_flag("dump"));
    let early = |prefix: &std::path::Path| cli::error_log(&m, prefix);
    let mut files = gannet_conf::Dump::new();
    let source = cli::Source::new(&m);
    // The file as its path resolves (under `-p`), for "test failed", as nginx names it.
    let failed_name = source.as_ref().ok().map(cli::Source::shown);
    let loaded = source.and_then(|src| {
        // `-e`: where start-up errors go (as well as to stderr) until the config's logs open.
        if let Some(spec) = early(&src.prefix) {
            if let Err(e) = errlog::init(&[spec]) {
                eprintln!("gannet: [alert] {e}");
            }
        }
        let cfg = src.load(dump.then_some(&mut files))?;
        Ok((src, cfg))
    });
    let (src, mut cfg) = match loaded {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gannet: [emerg] {e}");
            if m.get_one::<String>("errlog").is_some_and(|e| e != "stderr") {
                errlog::log(errlog::Level::Emerg, format_args!("{e}"));
            }
            if test {
                let shown = failed_name.unwrap_or_else(|| {
                    m.get_one::<String>("conf")
                        .map_or("(embedded default)", |c| c)
                        .to_string()
                });
                eprintln!("gannet: configuration file {shown} test failed");
            }
            return ExitCode::FAILURE;
        }
    };
    let shown = src.shown();
    if test {
        if !m.get_flag("quiet") {
            for n in &cfg.notices {
                eprintln!("gannet: [notice] {n}");
            }
            eprintln!("gannet: the configuration file {shown} syntax is ok");
            eprintln!("gannet: configuration file {shown} test is successful");
        }
        // nginx -T: each file read, in order, after a header line and followed by an empty
        // line; a file included again is shown once, as nginx's dump keeps one per name.
        let mut out = std::io::stdout().lock();
        let mut shown_names = std::collections::HashSet::new();
        for (name, text) in &files {
            if !shown_names.insert(name) {
                continue;
            }
            let _ = writeln!(out, "# configuration file {name}:");
            let _ = out.write_all(text);
            let _ = out.write_all(b"\n");
        }
        return ExitCode::SUCCESS;
    }
    if let Some(sig) = m.get_one::<String>("signal") {
        return send_signal(&cfg, sig);
    }
    if cfg.main.error_logs.is_empty() {
        cfg.main.error_logs.extend(early(&src.prefix));
    }
    if let Some(b) = src.banner() {
        eprintln!("gannet: {b}");
    }
    // SIGHUP reads the same file (or the embedded default) and `-g` again.
    let reload = move || src.load(None);
    match runtime::master::run(cfg, reload) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gannet: [emerg] {e}");
            ExitCode::FAILURE
        }
    }
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

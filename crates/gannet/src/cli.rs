//! The command line, nginx's flags: `-c FILE`, `-p PREFIX`, `-g DIRECTIVES`, `-e LOG`,
//! `-t`, `-T`, `-q`, `-s SIGNAL`, `-v`, `-V`; and which config they select. The hidden
//! `--man` prints the manual page generated from the same definition (clap_mangen).
//!
//! Without `-c`, gannet runs `/etc/gannet/gannet.conf` (prefix `/etc/gannet/`) when that file
//! exists, as nginx runs its compiled-in path; otherwise the embedded default that serves the
//! current directory. `GANNET_DEFAULT_CONF` replaces that path; it exists for the tests, so
//! they need not write to `/etc`. `--https NAME ...` runs the config `oneline` generates.

use crate::config::{self, Config};
use crate::errlog;
use crate::log_open::Target;
use crate::oneline::OneLine;
use clap::{Arg, ArgAction, ArgMatches, Command};
use gannet_conf::{ConfError, Directive, Dump};
use std::path::{Path, PathBuf};

const DEFAULT_CONF: &str = include_str!("default.conf");
const MIME_TYPES: &str = include_str!("../../../conf/mime.types");
/// Where the embedded default listens unless `GANNET_LISTEN` says otherwise.
const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// The config run when `-c` is not given, if it exists.
const SYSTEM_CONF: &str = "/etc/gannet/gannet.conf";
/// Test-only: replaces [`SYSTEM_CONF`].
const SYSTEM_CONF_ENV: &str = "GANNET_DEFAULT_CONF";

/// The nginx release whose behaviour gannet follows (Debian 12's), printed by `-v` / `-V`
/// in nginx's form so tools that read `nginx -V` (nginx's own test suite among them) see
/// which nginx gannet stands in for.
pub const NGINX_VERSION: &str = "1.22.1";

/// `-V`'s `configure arguments:`: nginx's names for the modules gannet implements, and a
/// `--without-...` for each module nginx builds by default that gannet lacks, so a script
/// that reads them (nginx-tests' `has()`) selects what gannet can do. Modules nginx builds
/// only on request and gannet lacks (perl, xslt...) or that Debian's 1.22 lacks (http_v3, so both
/// servers of the differential run take the same files) are simply not named:
/// naming them at all would match nginx-tests' plain-substring checks.
const CONFIGURE_ARGS: &[&str] = &[
    "--with-debug",
    "--with-http_ssl_module",
    "--with-http_v2_module",
    "--with-http_realip_module",
    "--with-http_auth_request_module",
    "--with-http_secure_link_module",
    "--with-http_sub_module",
    "--with-http_gzip_static_module",
    "--with-http_stub_status_module",
    "--with-http_dav_module",
    "--with-http_addition_module",
    "--with-http_flv_module",
    "--with-http_gunzip_module",
    "--with-http_image_filter_module",
    "--with-http_mp4_module",
    "--with-http_random_index_module",
    "--with-http_slice_module",
    "--with-stream",
    "--with-stream_ssl_module",
    "--with-stream_ssl_preread_module",
    "--with-stream_realip_module",
    "--with-mail",
    "--with-mail_ssl_module",
    "--without-http_browser_module",
    "--without-http_upstream_sticky",
    "--without-http_upstream_least_time_module",
    "--without-http_tunnel_module",
];

/// `-v`: nginx's first line, naming gannet's own version too.
pub fn version_line() -> String {
    format!(
        "nginx version: nginx/{NGINX_VERSION} (gannet/{})",
        env!("CARGO_PKG_VERSION")
    )
}

/// `-V`: the version, the TLS library and the modules, in `nginx -V`'s layout.
pub fn version_details() -> String {
    format!(
        "{}\nbuilt with rustls 0.23 (aws-lc-rs)\nTLS SNI support enabled\nconfigure arguments: {}",
        version_line(),
        CONFIGURE_ARGS.join(" ")
    )
}

pub fn command() -> Command {
    let value = |id: &'static str, short: char, name: &'static str, help: &'static str| {
        Arg::new(id).short(short).value_name(name).help(help)
    };
    let flag = |id: &'static str, short: char, help: &'static str| {
        Arg::new(id)
            .short(short)
            .action(ArgAction::SetTrue)
            .help(help)
    };
    let cmd = Command::new("gannet")
        .about("An event-driven HTTP server configured with nginx's syntax")
        .disable_version_flag(true)
        .arg(value(
            "conf",
            'c',
            "FILE",
            "use this configuration file (default: /etc/gannet/gannet.conf if it exists)",
        ))
        .arg(value(
            "prefix",
            'p',
            "PREFIX",
            "resolve relative paths against PREFIX (default: the config file's directory)",
        ))
        .arg(value(
            "globals",
            'g',
            "DIRECTIVES",
            "main-context directives read before the file's, e.g. 'daemon on; master_process on;'",
        ))
        .arg(value(
            "errlog",
            'e',
            "LOG",
            "the error log until the config is read, and after it if the config names none \
             (a path or \"stderr\")",
        ))
        .arg(flag("test", 't', "check the configuration and exit"))
        .arg(flag(
            "dump",
            'T',
            "check the configuration, then print it with every included file",
        ))
        .arg(flag("quiet", 'q', "with -t or -T, print errors only"))
        .arg(
            value(
                "signal",
                's',
                "SIGNAL",
                "send a signal to the running gannet (pid from the config)",
            )
            .value_parser(["stop", "quit", "reload", "reopen"]),
        )
        .arg(flag("version", 'v', "print the version and exit"))
        .arg(flag(
            "Version",
            'V',
            "print the version and build details and exit",
        ))
        .arg(
            Arg::new("man")
                .long("man")
                .action(ArgAction::SetTrue)
                .hide(true)
                .help("print the gannet(8) manual page (roff) and exit"),
        );
    crate::oneline::args(cmd)
}

/// The sections of gannet(8) that are not in `--help`: troff source, after the options.
const MAN_EXTRA: &str = r#".SH SIGNALS
The master process (the one started; its pid is in the \fBpid\fR file) takes:
.TP
\fBTERM\fR, \fBINT\fR
stop at once
.TP
\fBQUIT\fR
stop gracefully: stop accepting, finish the requests in flight
.TP
\fBHUP\fR
reload the configuration; a bad one is logged and the running one kept
.TP
\fBUSR1\fR
reopen the log files (after logrotate moved them)
.SH SYSTEMD
Under a \fBType=notify\fR unit gannet reports READY=1 once it serves,
RELOADING=1 and READY=1 around a reload, and STOPPING=1, to \fBNOTIFY_SOCKET\fR.
Listening sockets passed by a socket unit (\fBLISTEN_FDS\fR, \fBLISTEN_PID\fR,
\fBLISTEN_FDNAMES\fR) are used for the \fBlisten\fR addresses they are bound to,
instead of binding them.
.SH FILES
.TP
\fI/etc/gannet/gannet.conf\fR
the configuration run when \fB\-c\fR is not given
.TP
\fI/etc/gannet/sites\-available/\fR, \fI/etc/gannet/sites\-enabled/\fR
server blocks, and the links to those enabled (the packaged configuration includes them)
.TP
\fI/var/log/gannet/\fR
access and error logs of the packaged configuration
.TP
\fI/run/gannet.pid\fR
the master's pid in the packaged configuration
.SH SEE ALSO
\fBnginx\fR(8), \fBsystemd.service\fR(5), \fBsd_notify\fR(3), \fBsd_listen_fds\fR(3)
"#;

/// `gannet --man`: the manual page, from the same definition as `--help` (the Debian
/// package ships it gzipped as gannet.8.gz).
pub fn man_page(out: &mut dyn std::io::Write) -> std::io::Result<()> {
    // clap_mangen's synopsis leaves out the options' values: spell it out.
    let cmd = command().version(env!("CARGO_PKG_VERSION")).override_usage(
        "gannet [-c FILE] [-p PREFIX] [-g DIRECTIVES] [-e LOG] [-t | -T [-q]] \
             [-s stop|quit|reload|reopen] [-v | -V]",
    );
    let man = clap_mangen::Man::new(cmd)
        .section("8")
        .manual("System Manager's Manual");
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    man.render_options_section(out)?;
    out.write_all(MAN_EXTRA.as_bytes())?;
    man.render_version_section(out)
}

/// What to load: the file (or the embedded default), the prefix and `-g`'s directives. Kept
/// for SIGHUP, which reads the same again.
pub struct Source {
    pub conf: Option<PathBuf>,
    pub prefix: PathBuf,
    params: Vec<Directive>,
    /// `--https NAME ...`: the config generated from the options.
    pub oneline: Option<OneLine>,
}

impl Source {
    /// From the parsed flags; `Err` when `-g` does not parse.
    pub fn new(m: &ArgMatches) -> Result<Source, ConfError> {
        let oneline = OneLine::from_matches(m).map_err(ConfError::bare)?;
        let conf = match m.get_one::<String>("conf") {
            Some(c) => Some(PathBuf::from(c)),
            None if oneline.is_some() => None,
            None => system_conf(),
        };
        let prefix = match (m.get_one::<String>("prefix"), &conf) {
            (Some(p), _) => PathBuf::from(p),
            (None, Some(c)) => c
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
            (None, None) => std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
        };
        let prefix = std::fs::canonicalize(&prefix).unwrap_or(prefix);
        // As nginx: with `-p`, a relative `-c` names a file under the prefix
        // (`-p /srv/site/ -c nginx.conf`, as nginx's test suite runs it).
        let conf = match conf {
            Some(c) if c.is_relative() && m.get_one::<String>("prefix").is_some() => {
                Some(prefix.join(c))
            }
            c => c,
        };
        let params = match m.get_one::<String>("globals") {
            Some(g) => gannet_conf::parse_params(g, &prefix)?,
            None => Vec::new(),
        };
        Ok(Source {
            conf,
            prefix,
            params,
            oneline,
        })
    }

    /// How messages name the config.
    pub fn shown(&self) -> String {
        match (&self.conf, &self.oneline) {
            (Some(p), _) => p.display().to_string(),
            (None, Some(_)) => "(command line --https)".to_string(),
            (None, None) => "(embedded default)".to_string(),
        }
    }

    /// The line printed at start when no config file runs.
    pub fn banner(&self) -> Option<String> {
        if self.conf.is_some() {
            return None;
        }
        Some(match &self.oneline {
            Some(o) => o.banner(),
            None => format!(
                "serving {} on http://{}/ (Ctrl-C stops)",
                self.prefix.display(),
                listen_addr()
            ),
        })
    }

    /// Read and build the config; with `dump`, keep the text of every file read.
    pub fn load(&self, dump: Option<&mut Dump>) -> Result<Config, ConfError> {
        let file = match &self.conf {
            Some(p) => gannet_conf::parse_file_dumped(p, dump)?,
            None => {
                let text = match &self.oneline {
                    Some(o) => o.text(MIME_TYPES),
                    None => embedded_text(&self.prefix),
                };
                if let Some(d) = dump {
                    d.push((self.shown().into(), text.clone().into_bytes()));
                }
                gannet_conf::parse_str(&text, &self.shown(), &self.prefix)?
            }
        };
        // `-g` first, as nginx: a directive there and in the file is a "duplicate".
        let mut tree = self.params.clone();
        tree.extend(file);
        let cfg = config::load::build(&tree, &self.prefix)?;
        if let Some(o) = &self.oneline {
            o.make_state_parent().map_err(ConfError::bare)?;
        }
        if self.conf.is_some() || self.oneline.is_some() {
            config::temp_dirs::create(&cfg).map_err(ConfError::bare)?;
        }
        Ok(cfg)
    }
}

/// `/etc/gannet/gannet.conf` (or the test override) when it exists.
fn system_conf() -> Option<PathBuf> {
    let path =
        std::env::var_os(SYSTEM_CONF_ENV).map_or_else(|| PathBuf::from(SYSTEM_CONF), PathBuf::from);
    path.is_file().then_some(path)
}

/// `-e`: `stderr`, or a path relative to the prefix.
pub fn error_log(m: &ArgMatches, prefix: &Path) -> Option<errlog::Spec> {
    m.get_one::<String>("errlog").map(|e| errlog::Spec {
        dest: errlog::Dest::Target(Target::parse(e, prefix, true)),
        level: errlog::Level::Error,
    })
}

pub fn listen_addr() -> String {
    std::env::var("GANNET_LISTEN").unwrap_or_else(|_| DEFAULT_LISTEN.to_string())
}

/// The embedded default config's text, serving `root`.
fn embedded_text(root: &Path) -> String {
    let root = root
        .to_string_lossy()
        .replace('\\', "\\\\")
        .replace('"', "\\\"");
    // Started as root it serves the current directory as root could read it: the folder is
    // the operator's choice of the moment, often their own home, where `nobody` (a written
    // config's default) would get 403 for everything.
    // SAFETY: geteuid has no preconditions and cannot fail.
    let user = if unsafe { libc::geteuid() } == 0 {
        "user root;"
    } else {
        ""
    };
    DEFAULT_CONF
        .replace("{{USER}}", user)
        .replace("{{MIME}}", MIME_TYPES)
        .replace("{{ROOT}}", &root)
        .replace("{{LISTEN}}", &listen_addr())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_man_page_has_every_option_of_help_and_not_the_hidden_one() {
        let mut out = Vec::new();
        man_page(&mut out).unwrap();
        let man = String::from_utf8(out).unwrap();
        assert!(man.contains(".TH gannet 8"), "{man}");
        // roff escapes dashes; compare text with them unescaped.
        let options = man[man.find(".SH OPTIONS").unwrap()..man.find(".SH SIGNALS").unwrap()]
            .replace("\\-", "-");
        for arg in command().get_arguments().filter(|a| !a.is_hide_set()) {
            let flag = match (arg.get_short(), arg.get_long()) {
                (Some(short), _) => format!("-{short}"),
                (None, Some(long)) => format!("--{long}"),
                (None, None) => unreachable!("an option without a flag"),
            };
            assert!(options.contains(&flag), "{flag} missing");
            let help = arg.get_help().unwrap().to_string();
            let words: Vec<&str> = help.split_whitespace().take(3).collect();
            assert!(options.contains(&words.join(" ")), "help of {flag} missing");
        }
        assert!(!man.contains("\\-\\-man"));
    }
}

//! The one-line HTTPS start, `gannet --https example.com [--https www.example.com]
//! --root /var/www` (or `--proxy 127.0.0.1:3000`): what `caddy file-server --domain` gives.
//! It writes no config anywhere: the options become the text of a config (`https.conf`, an
//! nginx-style config with `acme_issuer` and `acme_certificate`), run as any config is, so
//! the same code serves it. The certificate comes from Let's Encrypt unless
//! `--acme-server` names another CA; the ACME state (account key, certificates) goes to
//! `--state-dir`, by default `/var/lib/gannet/acme` as root, else under
//! `$XDG_DATA_HOME` (`~/.local/share/gannet/acme`).

use clap::{Arg, ArgAction, ArgGroup, ArgMatches, Command};
use std::path::{Path, PathBuf};

const TEMPLATE: &str = include_str!("https.conf");
pub const LETS_ENCRYPT: &str = "https://acme-v02.api.letsencrypt.org/directory";

/// What the options asked for.
#[derive(Debug, Clone)]
pub struct OneLine {
    names: Vec<String>,
    content: Content,
    acme_server: String,
    ca_root: Option<PathBuf>,
    state_dir: PathBuf,
    email: Option<String>,
    http_listen: String,
    https_listen: String,
}

#[derive(Debug, Clone)]
enum Content {
    Root(PathBuf),
    Proxy(String),
}

/// The options, added to the command line's.
pub fn args(cmd: Command) -> Command {
    let long = |id: &'static str, name: &'static str, help: &'static str| {
        Arg::new(id)
            .long(id)
            .value_name(name)
            .help(help)
            .requires("https")
    };
    cmd.arg(
        Arg::new("https")
            .long("https")
            .value_name("NAME")
            .action(ArgAction::Append)
            .conflicts_with("conf")
            .requires("content")
            .help(
                "serve NAME (repeatable) over HTTPS with a certificate from an ACME CA \
                 (Let's Encrypt by default), with --root or --proxy; writes no config",
            ),
    )
    .arg(long("root", "DIR", "with --https: serve the files of DIR").conflicts_with("proxy"))
    .arg(long(
        "proxy",
        "ADDR",
        "with --https: pass the requests to ADDR (host:port or http://host:port)",
    ))
    .group(ArgGroup::new("content").args(["root", "proxy"]))
    .arg(long(
        "acme-server",
        "URL",
        "with --https: the ACME directory URL (default: Let's Encrypt's)",
    ))
    .arg(long(
        "acme-ca-root",
        "FILE",
        "with --https: trust the ACME server's HTTPS certificate to these CAs (PEM)",
    ))
    .arg(long(
        "state-dir",
        "DIR",
        "with --https: where the ACME account and certificates are kept \
         (default: /var/lib/gannet/acme as root, else ~/.local/share/gannet/acme)",
    ))
    .arg(long(
        "email",
        "ADDR",
        "with --https: the contact address given to the CA",
    ))
    .arg(long(
        "http-listen",
        "ADDR",
        "with --https: the plain-HTTP listen address (default: 80)",
    ))
    .arg(long(
        "https-listen",
        "ADDR",
        "with --https: the HTTPS listen address (default: 443)",
    ))
}

impl OneLine {
    /// From the parsed flags; `None` without `--https`. `Err` for a missing `--root` /
    /// `--proxy`.
    pub fn from_matches(m: &ArgMatches) -> Result<Option<OneLine>, String> {
        let Some(names) = m.get_many::<String>("https") else {
            return Ok(None);
        };
        let names: Vec<String> = names.cloned().collect();
        let s = |id: &str| m.get_one::<String>(id).cloned();
        let abs = |p: String| {
            let p = PathBuf::from(p);
            std::fs::canonicalize(&p).unwrap_or(p)
        };
        let content = match (s("root"), s("proxy")) {
            (Some(r), _) => Content::Root(abs(r)),
            (None, Some(p)) => Content::Proxy(p),
            (None, None) => return Err("--https needs --root DIR or --proxy ADDR".to_string()),
        };
        let state_dir = match s("state-dir") {
            Some(d) => abs(d),
            None => default_state_dir(),
        };
        Ok(Some(OneLine {
            names,
            content,
            acme_server: s("acme-server").unwrap_or_else(|| LETS_ENCRYPT.to_string()),
            ca_root: s("acme-ca-root").map(abs),
            state_dir,
            email: s("email"),
            http_listen: s("http-listen").unwrap_or_else(|| "80".to_string()),
            https_listen: s("https-listen").unwrap_or_else(|| "443".to_string()),
        }))
    }

    /// The state folder's parents, made (0755) if missing: the master makes the folder
    /// itself as it makes `state_path`s (0700, owned by the workers' account).
    pub fn make_state_parent(&self) -> Result<(), String> {
        match self.state_dir.parent() {
            Some(p) => {
                std::fs::create_dir_all(p).map_err(|e| crate::errlog::failed("mkdir()", p, &e))
            }
            None => Ok(()),
        }
    }

    /// The config's text, with `mime` the types.
    pub fn text(&self, mime: &str) -> String {
        let names: Vec<String> = self.names.iter().map(|n| quote(n)).collect();
        let mut extra = String::new();
        if let Some(e) = &self.email {
            extra.push_str(&format!("contact {};", quote(e)));
        }
        if let Some(f) = &self.ca_root {
            extra.push_str(&format!(" ssl_trusted_certificate {};", quote_path(f)));
        }
        // The redirect names the HTTPS port when it is not the default one.
        let port = self
            .https_listen
            .rsplit_once(':')
            .map_or(self.https_listen.as_str(), |(_, p)| p);
        let target = if port == "443" {
            "https://$host$request_uri".to_string()
        } else {
            format!("https://$host:{port}$request_uri")
        };
        let content = match &self.content {
            Content::Root(r) => format!("root {}; index index.html index.htm;", quote_path(r)),
            Content::Proxy(p) => {
                let url = if p.contains("://") {
                    p.clone()
                } else {
                    format!("http://{p}")
                };
                format!(
                    "location / {{ proxy_pass {}; proxy_set_header Host $host; \
                     proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for; \
                     proxy_set_header X-Forwarded-Proto https; }}",
                    quote(&url)
                )
            }
        };
        TEMPLATE
            .replace("{{MIME}}", mime)
            .replace("{{ACME_SERVER}}", &quote(&self.acme_server))
            .replace("{{STATE_DIR}}", &quote_path(&self.state_dir))
            .replace("{{ACME_EXTRA}}", &extra)
            .replace("{{HTTP_LISTEN}}", &quote(&self.http_listen))
            .replace("{{HTTPS_LISTEN}}", &quote(&self.https_listen))
            .replace("{{NAMES}}", &names.join(" "))
            .replace("{{REDIRECT}}", &target)
            .replace("{{CONTENT}}", &content)
    }

    /// What the start-up line says is served.
    pub fn banner(&self) -> String {
        let what = match &self.content {
            Content::Root(r) => r.display().to_string(),
            Content::Proxy(p) => format!("a proxy to {p}"),
        };
        let urls: Vec<String> = self.names.iter().map(|n| format!("https://{n}/")).collect();
        format!(
            "serving {what} on {} (certificates from {}, kept in {})",
            urls.join(" "),
            self.acme_server,
            self.state_dir.display()
        )
    }
}

/// As root, the system's state folder; else the user's data folder (XDG), as Caddy keeps
/// its certificates.
fn default_state_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/var/lib/gannet/acme");
    }
    let data = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    data.join("gannet/acme")
}

/// A value as one quoted config token, whatever it holds (`;`, spaces, quotes).
fn quote(v: &str) -> String {
    format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""))
}

fn quote_path(p: &Path) -> String {
    quote(&p.to_string_lossy())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_become_one_quoted_token_each() {
        let o = OneLine {
            names: vec!["a.example".into(), "b.example".into()],
            content: Content::Proxy("127.0.0.1:3000".into()),
            acme_server: "https://ca/dir".into(),
            ca_root: None,
            state_dir: PathBuf::from("/st"),
            email: Some("me@x; evil".into()),
            http_listen: "80".into(),
            https_listen: "127.0.0.1:8443".into(),
        };
        let t = o.text("");
        assert!(
            t.contains("server_name \"a.example\" \"b.example\";"),
            "{t}"
        );
        assert!(t.contains("contact \"me@x; evil\";"), "{t}");
        assert!(t.contains("proxy_pass \"http://127.0.0.1:3000\";"), "{t}");
        assert!(
            t.contains("return 301 https://$host:8443$request_uri;"),
            "{t}"
        );
        assert!(!t.contains("{{"), "{t}");
    }
}

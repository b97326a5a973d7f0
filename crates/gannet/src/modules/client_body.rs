//! Where a request body waits before it goes to an application, with nginx's core
//! directives: `client_body_buffer_size` (16k, what nginx uses on 64-bit: two pages),
//! `client_body_temp_path path [level1 [level2 [level3]]]` (`client_body_temp` under the
//! prefix), `client_body_in_file_only on | clean | off` and
//! `client_body_in_single_buffer on | off`.
//!
//! A body up to the buffer size stays in memory; a bigger one goes to a temporary file in
//! the temp path (see `conn::temp_file`), unlinked as soon as it is made, so a crash leaves
//! nothing behind (nameless with `O_TMPFILE`, unless a loaded config reads
//! `$request_body_file`: then it is made under nginx's name, in the levels, and unlinked at
//! once, as nginx does). `client_body_in_file_only on` and `clean` put every body in a file
//! that keeps its name while the request runs, for `$request_body_file` (an application can
//! be handed the name, e.g. a FastCGI param): `on` leaves it after the request, `clean`
//! removes it then, as in nginx.
//!
//! `client_body_in_single_buffer` is accepted with no further effect: a body kept in
//! memory is always one buffer in gannet, which is what the directive asks nginx for.

use super::{invalid, LoadCtx, LocConf};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use std::path::PathBuf;
use std::sync::Arc;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "client_body_buffer_size",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "client_body_temp_path",
        ctx: Ctx::HSL,
        args: Args::Between(1, 4),
        block: false,
    },
    Spec {
        name: "client_body_in_file_only",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "client_body_in_single_buffer",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
];

/// nginx's default on 64-bit systems (two 8 KiB pages).
pub const BUFFER_SIZE: u64 = 16 * 1024;

/// The folder temporary body files go in, and nginx's hashing levels for their names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TempPath {
    pub dir: PathBuf,
    /// Digits per level of subfolder (each 1..=10, at most three levels).
    pub levels: Vec<u8>,
}

/// `client_body_in_file_only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFileOnly {
    Off,
    /// Every body goes to a named file, left after the request.
    On,
    /// Every body goes to a named file, removed after the request.
    Clean,
}

#[derive(Debug, Clone, Default)]
pub struct ClientBodyConf {
    pub buffer_size: Option<u64>,
    pub temp_path: Option<Arc<TempPath>>,
    pub in_file_only: Option<InFileOnly>,
    pub in_single_buffer: Option<bool>,
}

impl ClientBodyConf {
    pub fn merge(&mut self, parent: &ClientBodyConf) {
        super::inherit!(
            self,
            parent,
            buffer_size,
            temp_path,
            in_file_only,
            in_single_buffer
        );
    }

    /// The most of a body kept in memory.
    pub fn buffer_size(&self) -> u64 {
        self.buffer_size.unwrap_or(BUFFER_SIZE)
    }

    /// The loader sets the http level's (`client_body_temp` under the prefix), so every
    /// merged location has one; the fallback only serves a LocConf built outside it.
    pub fn temp_path(&self) -> Arc<TempPath> {
        self.temp_path.clone().unwrap_or_else(|| {
            Arc::new(TempPath {
                dir: PathBuf::from("client_body_temp"),
                levels: Vec::new(),
            })
        })
    }

    /// `client_body_in_file_only`: off unless set.
    pub fn in_file_only(&self) -> InFileOnly {
        self.in_file_only.unwrap_or(InFileOnly::Off)
    }
}

/// The default temp path: `client_body_temp` under the prefix, as nginx's compiled-in one.
pub fn default_temp_path(prefix: &std::path::Path) -> Arc<TempPath> {
    temp_path_in(prefix, "client_body_temp")
}

/// `name` under the prefix, without levels: the form of nginx's compiled-in temp paths.
pub fn temp_path_in(prefix: &std::path::Path, name: &str) -> Arc<TempPath> {
    Arc::new(TempPath {
        dir: prefix.join(name),
        levels: Vec::new(),
    })
}

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.client_body;
    let dup = || d.error(format!("\"{}\" directive is duplicate", d.name));
    match d.name.as_str() {
        "client_body_buffer_size" => {
            if c.buffer_size.is_some() {
                return Err(dup());
            }
            c.buffer_size = Some(setters::size_arg(d, 0)?);
        }
        "client_body_temp_path" => {
            if c.temp_path.is_some() {
                return Err(dup());
            }
            c.temp_path = Some(Arc::new(temp_path(d, ctx)?));
        }
        "client_body_in_file_only" => {
            c.in_file_only = Some(match d.args[0].as_str() {
                "on" => InFileOnly::On,
                "clean" => InFileOnly::Clean,
                "off" => InFileOnly::Off,
                v => return Err(d.error(format!("invalid value \"{v}\""))),
            });
        }
        "client_body_in_single_buffer" => c.in_single_buffer = Some(setters::flag(d)?),
        _ => unreachable!("not a client_body directive: {}", d.name),
    }
    Ok(())
}

/// `path [level1 [level2 [level3]]]`: a relative path is under the prefix; each level is
/// 1 to 10 digits, as nginx takes them.
pub fn temp_path(d: &Directive, ctx: &mut LoadCtx) -> Result<TempPath, ConfError> {
    let raw = d.args[0].as_str();
    if raw.is_empty() {
        return Err(invalid(d, raw));
    }
    let raw = if raw.len() > 1 {
        raw.trim_end_matches('/')
    } else {
        raw
    };
    let dir = ctx.prefix.join(raw);
    let mut levels = Vec::new();
    for a in &d.args[1..] {
        match a.parse::<u8>() {
            Ok(n @ 1..=10) => levels.push(n),
            _ => return Err(d.error(format!("\"{}\" directive invalid value", d.name))),
        }
    }
    ctx.temp_dirs.push(dir.clone());
    Ok(TempPath { dir, levels })
}

//! MIME types: `types { type ext...; }` and `default_type`.
//!
//! A `types` block at a level replaces the inherited table (as nginx does); with none at any
//! level, nginx's built-in three entries apply (html, gif, jpg).

use super::{inherit, LoadCtx, LocConf};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use std::sync::Arc;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "types",
        ctx: Ctx::HSL,
        args: Args::Exactly(0),
        block: true,
    },
    Spec {
        name: "default_type",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
];

/// Extension to type. Looked up for every file served, with the extension of a request's
/// path; hashed with foldhash rather than SipHash (a few ns against ~30): the table's keys
/// come from the configuration only, so a client can choose what is looked up but not what
/// is in it, and a lookup's cost depends on the table's entries, not on the key asked for.
type Map = std::collections::HashMap<String, Arc<str>, foldhash::fast::RandomState>;
type Table = Arc<Map>;

#[derive(Debug, Clone, Default)]
pub struct TypesConf {
    pub types: Option<Table>,
    pub default_type: Option<Arc<str>>,
}

impl TypesConf {
    pub fn merge(&mut self, p: &TypesConf) {
        inherit!(self, p, types, default_type);
    }

    /// The type for a file name by its extension (case-insensitive), else `default_type`.
    pub fn lookup(&self, name: &str) -> Arc<str> {
        // The text after the last dot of the last path segment, in one backward scan for
        // either byte (a char search then a second scan for `/` was ~150 instructions).
        let ext = match memchr::memrchr2(b'.', b'/', name.as_bytes()) {
            Some(i) if name.as_bytes()[i] == b'.' => name.get(i + 1..),
            _ => None,
        };
        if let Some(ext) = ext {
            let found = match &self.types {
                Some(t) => lookup_ext(t, ext),
                None => builtin(ext).map(Arc::from),
            };
            if let Some(t) = found {
                return t;
            }
        }
        self.default_type
            .clone()
            .unwrap_or_else(|| Arc::from("text/plain"))
    }
}

fn lookup_ext(t: &Map, ext: &str) -> Option<Arc<str>> {
    if let Some(v) = t.get(ext) {
        return Some(v.clone());
    }
    if ext.bytes().any(|b| b.is_ascii_uppercase()) {
        return t.get(&ext.to_ascii_lowercase()).cloned();
    }
    None
}

fn builtin(ext: &str) -> Option<&'static str> {
    match ext.to_ascii_lowercase().as_str() {
        "html" => Some("text/html"),
        "gif" => Some("image/gif"),
        "jpg" => Some("image/jpeg"),
        _ => None,
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    match d.name.as_str() {
        "default_type" => lc.types.default_type = Some(Arc::from(d.args[0].as_str())),
        _ => {
            let mut table: Map = match &lc.types.types {
                Some(t) => (**t).clone(),
                None => Map::default(),
            };
            for entry in d.block.as_deref().unwrap_or_default() {
                if entry.block.is_some() || entry.args.is_empty() {
                    return Err(
                        entry.error("invalid types entry: expected \"type extension ...;\"")
                    );
                }
                let mime: Arc<str> = Arc::from(entry.name.as_str());
                for ext in &entry.args {
                    table.insert(ext.to_ascii_lowercase(), mime.clone());
                }
            }
            lc.types.types = Some(Arc::new(table));
        }
    }
    Ok(())
}

//! nginx Plus's `*_cache_purge`: remove the entry of a key, or (a key ending with `*`)
//! every entry whose key starts with the rest. Entries are files any worker process may
//! have written, before a restart too, so both read the key from the files themselves: one
//! key's entry is its md5's file (and its `Vary` variant for this request), a prefix is
//! matched against the key in the header of every entry file in the folder (a walk of the
//! folder, as nginx Plus's `purger` does; nginx Plus first marks them in its shared index,
//! which gannet's per-process indexes could not do for the others). The removed entries'
//! sizes leave this process's index at once; another process's index learns it when its
//! manager next finds the file gone (its lookups find no file and fetch anew meanwhile).

use super::entry;
use super::key::{self, Hash};
use super::store;
use super::Zone;

/// Remove `key`'s entry and, if it has `Vary`, `variant`'s (the request's own variant's
/// hash, computed from the stored `Vary`); how many files were removed.
pub fn one(zone: &Zone, key: &str, variant: impl FnOnce(&Hash, &str) -> Hash) -> usize {
    let main = key::hash(key.as_bytes());
    let Some((_, meta)) = entry::open(&zone.file(&main), key) else {
        return 0;
    };
    let mut removed = remove(zone, &main);
    if !meta.vary.is_empty() {
        let v = variant(&main, &meta.vary);
        if v != main && entry::open(&zone.file(&v), key).is_some() {
            removed += remove(zone, &v);
        }
    }
    removed
}

/// Remove every entry whose key starts with `prefix` (a blocking walk of the folder: run
/// it off the event loop); how many were removed.
pub fn prefix(zone: &Zone, prefix: &[u8]) -> usize {
    store::on_disk(zone)
        .into_iter()
        .filter(|h| entry::key_of(&zone.file(h)).is_some_and(|k| k.starts_with(prefix)))
        .map(|h| remove(zone, &h))
        .sum()
}

fn remove(zone: &Zone, h: &Hash) -> usize {
    let gone = std::fs::remove_file(zone.file(h)).is_ok();
    store::forget(zone, h);
    usize::from(gone)
}

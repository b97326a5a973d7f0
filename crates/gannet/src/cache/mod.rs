//! The response cache (nginx's ngx_http_file_cache.c with the cache parts of
//! ngx_http_upstream.c): answers of `proxy_pass`, `fastcgi_pass`, `scgi_pass` and
//! `uwsgi_pass` kept as files under a `proxy_cache_path` folder and served from there.
//!
//! - [`path`]: `*_cache_path` and its keys zone ([`Zone`]), made by the master and shared by
//!   every worker process.
//! - [`shm`]: the keys zone's shared memory: per key its md5, size, last use, uses and the
//!   fetch under way; a process-shared lock.
//! - [`key`]: the md5 of `*_cache_key`, which names the entry's file in `levels` folders.
//! - [`entry`]: an entry file (a header with the key, validity and the answer's head, then
//!   the body), written to a temp file and renamed, never torn.
//! - [`hot`]: a worker thread's copies of the entries it serves (open file, parsed head),
//!   checked against the key's version in the keys zone.
//! - [`store`]: counting lookups, the one-fetch lock for concurrent misses (across
//!   processes), and the one manager that enforces `inactive` and `max_size`.
//! - [`purge`]: nginx Plus's `*_cache_purge`: one key's entry, or every entry whose key
//!   starts with a prefix.
//! - [`validity`]: how long an answer may be kept, from its headers (`X-Accel-Expires`,
//!   `Cache-Control`, `Expires`) or `*_cache_valid`, and whether it may be kept at all.
//!
//! The request side is in `conn::gateway_cache`, the directives in
//! `modules::gateway_cache`.

pub mod entry;
pub mod fanout;
pub mod hot;
pub mod key;
pub mod path;
pub mod purge;
pub mod shm;
pub mod store;
pub mod validity;

pub use path::Zone;

/// `$upstream_cache_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Miss = 0,
    Bypass,
    Expired,
    Stale,
    Updating,
    Revalidated,
    Hit,
}

impl Status {
    /// Every status, each at its index among the metrics' counters of its zone.
    pub const ALL: [Status; 7] = [
        Status::Miss,
        Status::Bypass,
        Status::Expired,
        Status::Stale,
        Status::Updating,
        Status::Revalidated,
        Status::Hit,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Miss => "MISS",
            Status::Bypass => "BYPASS",
            Status::Expired => "EXPIRED",
            Status::Stale => "STALE",
            Status::Updating => "UPDATING",
            Status::Revalidated => "REVALIDATED",
            Status::Hit => "HIT",
        }
    }
}

/// Seconds since the epoch, the clock entries' validity is kept in (as nginx's `valid_sec`):
/// the time of the event-loop turn under way, as nginx's `ngx_time()` (a hit read the clock
/// for it besides the turn's own read).
pub fn now_secs() -> i64 {
    crate::runtime::clock::wall()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::Status;

    #[test]
    fn each_status_is_its_metrics_counter() {
        for (i, s) in Status::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i);
        }
        assert_eq!(crate::runtime::metrics::cache::PURGED, Status::ALL.len());
    }
}

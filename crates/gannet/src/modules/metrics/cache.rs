//! The response caches' families on the `metrics` page: per keys zone, the lookups by
//! `$upstream_cache_status` and the purged entries (counters, per worker thread like the
//! others), and what the entries take (gauges, read from the scraping process's index of
//! the zone at scrape time: nothing is counted for them per request).

use super::{Encoder, Type};
use crate::cache::{Status, Zone};
use crate::modules::LoadCtx;
use crate::runtime::metrics::{self as m, cache, Key};
use std::sync::{Arc, Mutex, Weak};

/// This process's zones that are counted, for the gauges.
static ZONES: Mutex<Vec<Weak<Zone>>> = Mutex::new(Vec::new());

/// Give a zone its key when the config counts.
pub fn register(ctx: &LoadCtx, zone: &mut Zone) {
    zone.metrics = super::register(ctx, m::Kind::Cache, &zone.name);
}

/// Remember a counted zone for the gauges (the zones of an older config are let go).
pub fn loaded(zone: &Arc<Zone>) {
    if zone.metrics == 0 {
        return;
    }
    let mut l = ZONES.lock().unwrap_or_else(|e| e.into_inner());
    l.retain(|z| z.strong_count() > 0);
    l.push(Arc::downgrade(zone));
}

/// A lookup's verdict in its zone.
#[inline]
pub fn looked(zone: &Zone, s: Status) {
    if zone.metrics != 0 {
        m::add(zone.metrics, s as usize, 1);
    }
}

/// Entries a purge removed.
pub fn purged(zone: &Zone, n: usize) {
    if zone.metrics != 0 {
        m::add(zone.metrics, cache::PURGED, n as u64);
    }
}

/// The families, for the zones registered as `keys`.
pub fn scrape(e: &mut Encoder, keys: &[(Key, &str)]) {
    e.family(
        "gannet_cache_responses",
        Type::Counter,
        "Cache lookups by $upstream_cache_status, by keys zone.",
    );
    for &(k, name) in keys {
        for s in Status::ALL {
            let st = s.as_str().to_ascii_lowercase();
            e.sample(
                "gannet_cache_responses",
                &[("zone", name), ("status", &st)],
                m::total(k, s as usize),
            );
        }
    }
    e.family(
        "gannet_cache_purged",
        Type::Counter,
        "Entries removed by a cache purge, by keys zone.",
    );
    for &(k, name) in keys {
        e.sample(
            "gannet_cache_purged",
            &[("zone", name)],
            m::total(k, cache::PURGED),
        );
    }
    // The newest zone of each name this process has (a reload's replaces the older).
    let zones: Vec<Arc<Zone>> = ZONES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .rev()
        .filter_map(Weak::upgrade)
        .collect();
    let local = |name: &str| zones.iter().find(|z| z.name == name);
    let usage: Vec<(&str, &Arc<Zone>, (u64, usize))> = keys
        .iter()
        .filter_map(|&(_, name)| local(name).map(|z| (name, z, crate::cache::store::usage(z))))
        .collect();
    e.family(
        "gannet_cache_size_bytes",
        Type::Gauge,
        "What the cache's entries take on disk, by keys zone.",
    );
    for (name, _, (size, _)) in &usage {
        e.sample("gannet_cache_size_bytes", &[("zone", name)], size);
    }
    e.family(
        "gannet_cache_max_size_bytes",
        Type::Gauge,
        "The cache's max_size, by keys zone (zones without one are not shown).",
    );
    for (name, z, _) in &usage {
        if let Some(max) = z.max_size {
            e.sample("gannet_cache_max_size_bytes", &[("zone", name)], max);
        }
    }
    e.family(
        "gannet_cache_entries",
        Type::Gauge,
        "Entries in the cache, by keys zone.",
    );
    for (name, _, (_, n)) in &usage {
        e.sample("gannet_cache_entries", &[("zone", name)], n);
    }
}

//! `*_cache_path ... redis=name` (gannet's): a purge (`*_cache_purge`) on one node reaches
//! every node whose cache zone of the same name uses that `redis_server`.
//!
//! The node that purges publishes the key on the Redis channel `gannet:purge:<zone>`; the
//! first worker of every node listens on the channels of its zones and removes the entries
//! as its own purge would (a key ending with `*` is a prefix; an entry with `Vary` loses the
//! variant the purging request had, when that node had the entry to know it). A message is
//! `<node id> <variant hash or -> <key>`; a node skips its own. A node that is not
//! listening when a purge is sent (Redis or the node was down) misses it: the entry lives
//! until it expires, as purges are not stored.

use super::key::Hash;
use super::path::Zone;
use crate::modules::redis::NODE;
use std::sync::Arc;
use tokio::task::JoinHandle;

/// The zone's channel.
fn channel(zone: &Zone) -> String {
    format!("gannet:purge:{}", zone.name)
}

/// Tell the other nodes to purge `key` (and `variant`, its `Vary` variant here); the
/// error, logged, does not change this node's answer.
pub async fn publish(zone: &Zone, key: &str, variant: Option<Hash>) {
    let Some(server) = &zone.redis else {
        return;
    };
    let v = variant.map_or_else(|| "-".to_string(), |h| hex(&h));
    let message = format!("{} {v} {key}", *NODE);
    if let Err(e) = server.publish(&channel(zone), message.as_bytes()).await {
        crate::errlog::error(format_args!(
            "cache purge of \"{key}\" in zone \"{}\" not sent to the other nodes: redis_server \"{}\" ({}): {e}",
            zone.name, server.name, server.addr
        ));
    }
}

/// Listen on the channel of every zone that has one.
pub fn spawn_all(zones: &[Arc<Zone>]) -> Vec<JoinHandle<()>> {
    zones
        .iter()
        .filter(|z| z.redis.is_some())
        .map(|z| tokio::task::spawn_local(listen(z.clone())))
        .collect()
}

async fn listen(zone: Arc<Zone>) {
    let Some(server) = zone.redis.clone() else {
        return;
    };
    let ch = channel(&zone);
    server
        .subscribe(&ch, |message| {
            if let Some((key, variant)) = parse(&message) {
                purge(&zone, key, variant);
            }
        })
        .await;
}

/// A message from another node: its key and variant (`None` for this node's own, or one
/// not understood).
fn parse(message: &[u8]) -> Option<(String, Option<Hash>)> {
    let text = std::str::from_utf8(message).ok()?;
    let mut parts = text.splitn(3, ' ');
    let node: u64 = parts.next()?.parse().ok()?;
    let variant = parts.next()?;
    let key = parts.next()?;
    if node == *NODE {
        return None;
    }
    let variant = match variant {
        "-" => None,
        h => Some(unhex(h)?),
    };
    Some((key.to_string(), variant))
}

/// Remove what the message names (a prefix's walk of the folder off the event loop).
fn purge(zone: &Arc<Zone>, key: String, variant: Option<Hash>) {
    if let Some(prefix) = key.strip_suffix('*') {
        let (z, p) = (zone.clone(), prefix.as_bytes().to_vec());
        tokio::task::spawn_blocking(move || {
            let n = super::purge::prefix(&z, &p);
            crate::modules::metrics::cache::purged(&z, n);
        });
        return;
    }
    let n = super::purge::one(zone, &key, |main, _| variant.unwrap_or(*main));
    crate::modules::metrics::cache::purged(zone, n);
}

fn hex(h: &Hash) -> String {
    data_encoding::HEXLOWER.encode(h)
}

fn unhex(s: &str) -> Option<Hash> {
    data_encoding::HEXLOWER
        .decode(s.as_bytes())
        .ok()?
        .try_into()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages() {
        let h: Hash = *b"0123456789abcdef";
        assert_eq!(unhex(&hex(&h)), Some(h));
        let other = *NODE + 1;
        let m = format!("{other} {} http://a/b c", hex(&h));
        assert_eq!(parse(m.as_bytes()), Some(("http://a/b c".into(), Some(h))));
        assert_eq!(
            parse(format!("{other} - k*").as_bytes()),
            Some(("k*".into(), None))
        );
        // A node's own message, and broken ones.
        assert_eq!(parse(format!("{} - k", *NODE).as_bytes()), None);
        assert_eq!(parse(b"x - k"), None);
        assert_eq!(parse(format!("{other} zz k").as_bytes()), None);
    }
}

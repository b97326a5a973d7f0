//! `health_check ... redis=name` (gannet's): a node's verdicts on its group's servers reach
//! every node whose `health_check` uses that `redis_server`, so that all of them stop (and
//! start again) sending requests to a server together, whichever node saw it first.
//!
//! When a node's probes change a server's state it publishes `<node id> <1|0> <address>` on
//! the channel `gannet:health:<upstream>`; the first worker of every node listens there and
//! marks the server of that address healthy or not, as its own probes would. Each node goes
//! on probing: the last verdict, from whichever node, holds until a node's probes change
//! it. A node that was not listening (it started later, or Redis was down) learns a state
//! from the next change, or from its own probes.

use crate::config::Probe;
use crate::errlog;
use crate::modules::redis::NODE;

fn channel(p: &Probe) -> String {
    format!("gannet:health:{}", p.upstream.name)
}

/// Tell the other nodes that server `i` is now `healthy` or not (the error logged).
pub async fn publish(p: &Probe, i: usize, healthy: bool) {
    let Some(server) = &p.check.redis else {
        return;
    };
    let addr = &p.upstream.servers[i].addr;
    let message = format!("{} {} {addr}", *NODE, u8::from(healthy));
    if let Err(e) = server.publish(&channel(p), message.as_bytes()).await {
        errlog::error(format_args!(
            "health of upstream server {addr} of \"{}\" not sent to the other nodes: redis_server \"{}\" ({}): {e}",
            p.upstream.name, server.name, server.addr
        ));
    }
}

/// Apply the other nodes' verdicts, for ever.
pub async fn listen(p: Probe) {
    let Some(server) = p.check.redis.clone() else {
        return;
    };
    server
        .subscribe(&channel(&p), |message| {
            if let Some((healthy, addr)) = parse(&message) {
                apply(&p, healthy, addr);
            }
        })
        .await;
}

/// `(healthy, address)` from another node's message.
fn parse(message: &[u8]) -> Option<(bool, &str)> {
    let text = std::str::from_utf8(message).ok()?;
    let mut parts = text.splitn(3, ' ');
    let node: u64 = parts.next()?.parse().ok()?;
    let healthy = match parts.next()? {
        "1" => true,
        "0" => false,
        _ => return None,
    };
    (node != *NODE).then_some((healthy, parts.next()?))
}

fn apply(p: &Probe, healthy: bool, addr: &str) {
    for (i, server) in p.upstream.servers.iter().enumerate() {
        if server.addr.to_string() != addr || p.upstream.healthy(i) == healthy {
            continue;
        }
        p.upstream.set_healthy(i, healthy);
        crate::modules::metrics::peer_state(server.metrics, server.down, healthy);
        let state = if healthy {
            "healthy again"
        } else {
            "unhealthy"
        };
        errlog::warn(format_args!(
            "upstream server {addr} of \"{}\" is {state} (said by another node)",
            p.upstream.name
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages() {
        let other = *NODE + 1;
        let m = format!("{other} 0 127.0.0.1:8080");
        assert_eq!(parse(m.as_bytes()), Some((false, "127.0.0.1:8080")));
        let m = format!("{other} 1 unix:/run/a.sock");
        assert_eq!(parse(m.as_bytes()), Some((true, "unix:/run/a.sock")));
        assert_eq!(parse(format!("{} 1 a", *NODE).as_bytes()), None);
        assert_eq!(parse(format!("{other} x a").as_bytes()), None);
    }
}

//! Session resumption: `ssl_session_cache` (server-side session store), `ssl_session_tickets`
//! (tickets with rotating keys) and `ssl_session_timeout` (how long either is honoured).
//!
//! rustls does the cryptography: sessions are stored by its `ServerSessionMemoryCache`, and
//! tickets are sealed by its aws-lc-rs ticketer inside its `TicketRotator`. What is added here is
//! the timeout, which rustls leaves to the client: each stored session and each ticket's
//! sealed contents start with the time it expires, checked when the session comes back.

use rustls::crypto::GetRandomFailed;
use rustls::server::{ProducesTickets, ServerSessionMemoryCache, StoresServerSessions};
use rustls::TicketRotator;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

const STAMP: usize = 8;

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn stamped(timeout: u64, value: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(STAMP + value.len());
    v.extend_from_slice(&now().saturating_add(timeout).to_be_bytes());
    v.extend_from_slice(value);
    v
}

/// The value under its stamp, if it has not expired.
fn unstamped(mut v: Vec<u8>) -> Option<Vec<u8>> {
    let stamp: [u8; STAMP] = v.get(..STAMP)?.try_into().ok()?;
    if u64::from_be_bytes(stamp) < now() {
        return None;
    }
    v.drain(..STAMP);
    Some(v)
}

/// A session store whose entries expire after `ssl_session_timeout`. Several servers may
/// share one store (`shared:NAME:SIZE`) with timeouts of their own.
#[derive(Debug)]
pub struct TimedCache {
    inner: Arc<ServerSessionMemoryCache>,
    timeout: u64,
}

impl TimedCache {
    pub fn new(inner: Arc<ServerSessionMemoryCache>, timeout: u64) -> TimedCache {
        TimedCache { inner, timeout }
    }
}

impl StoresServerSessions for TimedCache {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.inner.put(key, stamped(self.timeout, &value))
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.inner.get(key).and_then(unstamped)
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.inner.take(key).and_then(unstamped)
    }

    fn can_cache(&self) -> bool {
        true
    }
}

/// One generation of ticket keys: rustls's aws-lc-rs ticketer (a fresh random key each time).
#[derive(Debug)]
struct Generation(Arc<dyn ProducesTickets>);

impl ProducesTickets for Generation {
    fn enabled(&self) -> bool {
        self.0.enabled()
    }
    fn lifetime(&self) -> u32 {
        self.0.lifetime()
    }
    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        self.0.encrypt(plain)
    }
    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        self.0.decrypt(cipher)
    }
}

fn generation() -> Result<Box<dyn ProducesTickets>, GetRandomFailed> {
    match rustls::crypto::aws_lc_rs::Ticketer::new() {
        Ok(t) => Ok(Box::new(Generation(t))),
        Err(_) => Err(GetRandomFailed),
    }
}

/// Ticket keys that rotate every `period` seconds (a ticket stays readable for one more
/// period after its key is retired, as rustls's rotator does), so a stolen key opens
/// little traffic.
pub fn rotating_keys(period: u64) -> Result<Arc<dyn ProducesTickets>, rustls::Error> {
    let period = u32::try_from(period.max(60)).unwrap_or(u32::MAX);
    Ok(Arc::new(TicketRotator::new(period, generation)?))
}

/// Tickets valid for `ssl_session_timeout`: the lifetime told to clients, and enforced
/// here when a ticket comes back, whatever the client does.
#[derive(Debug)]
pub struct TimedTickets {
    keys: Arc<dyn ProducesTickets>,
    timeout: u64,
}

impl TimedTickets {
    pub fn new(keys: Arc<dyn ProducesTickets>, timeout: u64) -> TimedTickets {
        TimedTickets { keys, timeout }
    }
}

impl ProducesTickets for TimedTickets {
    fn enabled(&self) -> bool {
        true
    }
    fn lifetime(&self) -> u32 {
        u32::try_from(self.timeout).unwrap_or(u32::MAX)
    }
    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        self.keys.encrypt(&stamped(self.timeout, plain))
    }
    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        self.keys.decrypt(cipher).and_then(unstamped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_entries_expire() {
        let fresh = TimedCache::new(ServerSessionMemoryCache::new(4), 300);
        assert!(fresh.put(b"k".to_vec(), b"v".to_vec()));
        assert_eq!(fresh.get(b"k").as_deref(), Some(&b"v"[..]));
        // A timeout of zero has expired by the next second at the latest; a stamp in the
        // past is what matters, so write one directly.
        let mut old = (now() - 1).to_be_bytes().to_vec();
        old.extend_from_slice(b"v");
        assert_eq!(unstamped(old), None);
    }

    #[test]
    fn tickets_round_trip_and_expire() {
        let keys = rotating_keys(300).unwrap();
        let t = TimedTickets::new(keys.clone(), 300);
        let sealed = t.encrypt(b"session").unwrap();
        assert_eq!(t.decrypt(&sealed).as_deref(), Some(&b"session"[..]));
        assert_eq!(t.lifetime(), 300);
        // A ticket sealed with an expiry in the past is refused.
        let mut old = (now() - 1).to_be_bytes().to_vec();
        old.extend_from_slice(b"session");
        let stale = keys.encrypt(&old).unwrap();
        assert_eq!(t.decrypt(&stale), None);
        // Tampering is caught by the AEAD underneath.
        let mut bad = sealed.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert_eq!(t.decrypt(&bad), None);
    }
}

//! The request side of the response cache (nginx's `ngx_http_upstream_cache` and
//! `ngx_http_upstream_cache_send`, with ngx_http_file_cache.c's lookup), for every gateway
//! protocol: [`before`] the exchange, look the request's key up and serve a fresh entry
//! from its file (HIT), or let the exchange run (MISS, EXPIRED, BYPASS) as the one fetch
//! of the key, or wait for the fetch under way (`*_cache_lock`), or serve the expired entry
//! while another request updates it (`*_cache_use_stale updating`: UPDATING). The answer
//! is written to an entry as it goes to the client ([`store_whole`], [`tee`]); [`after`]
//! serves the expired entry in place of a failure `*_cache_use_stale` names (STALE).
//! With `*_cache_background_update` an expired entry is served at once (STALE) while a
//! copy of the request refreshes it in the background, as nginx's background subrequest.
//! A `*_cache_purge` request removes entries instead (`cache::purge`). Each lookup's final
//! status is counted in its zone for the `metrics` page.
//!
//! An entry is served through the answer-head code a fresh answer goes through
//! (`conn::gateway::answer`), so the hidden headers, `proxy_redirect` and the rest apply
//! the same; its body is a range of the entry file, sent like a static file's (sendfile,
//! byte ranges).
//!
//! Entry files are opened on the worker thread, as static files (`cache::entry::lookup`);
//! a small answer's entry is written there too, a larger one's off the event loop
//! (`cache::entry::Writer`). A lookup opens no file for a key the keys zone knows no entry
//! of (once the loader has counted the folder's entries), as nginx's
//! `ngx_http_file_cache_open`.

use super::gateway::answer;
use crate::cache::entry::{self, Meta, Writer};
use crate::cache::hot;
use crate::cache::key::{self, Hash};
use crate::cache::store::{self, Fetching};
use crate::cache::{now_secs, validity, Status, Zone};
use crate::errlog::{self, Level};
use crate::http::flow::Flow;
use crate::http::request::Request;
use crate::http::response::{Body, FileRange, Part, Response};
use crate::modules::gateway::{self, GatewayConf, Proto};
use crate::modules::gateway_cache::{self as conf, stale};
use bytes::BytesMut;
use gannet_proto::cgi::{self, CgiHead};
use gannet_proto::h1::Method;
use std::fs::File;
use std::rc::Rc;
use std::sync::Arc;

/// A request that fetches its key: where the answer is to be stored, and the expired
/// entry it may fall back to.
pub struct Pending {
    zone: Arc<Zone>,
    key: String,
    main: Hash,
    /// The main entry's `Vary` and variant, if there is one.
    main_vary: Option<(String, Hash)>,
    /// The expired entry's file (the key's, or its `Vary` variant's), then the one the
    /// answer went to.
    hash: Hash,
    /// `*_cache_min_uses` reached (a bypassed request stores too, as in nginx).
    store: bool,
    stale: Option<(File, Meta)>,
    /// `*_cache_revalidate` of an expired entry: its Last-Modified and ETag, sent as
    /// If-Modified-Since and If-None-Match.
    revalidate: Option<(Option<String>, Option<String>)>,
    /// The application answered the revalidation 304: the expired entry is served.
    revalidated: bool,
    /// Held until the entry is stored or given up: the lock's waiters go on then.
    _fetch: Option<Fetching>,
}

/// The client's conditional and range headers: not passed to an upstream whose answers
/// are cached (nginx's `proxy_cache_headers`), whose entry must be the whole answer.
pub fn withheld(name: &str) -> bool {
    const CONDITIONAL: &[&str] = &[
        "if-modified-since",
        "if-unmodified-since",
        "if-none-match",
        "if-match",
        "range",
        "if-range",
    ];
    CONDITIONAL.iter().any(|h| h.eq_ignore_ascii_case(name))
}

/// Whether the request's answer may be stored (nginx's `u->cacheable`): the cache's
/// conditional headers then replace the client's (`proxy_cache_headers`); a request below
/// `*_cache_min_uses`, or one that gave up waiting for the lock, passes the client's.
pub fn cacheable(req: &Request) -> bool {
    req.cache.borrow().as_ref().is_some_and(|p| p.store)
}

/// The validators a revalidation sends (nginx's `$upstream_cache_last_modified` and
/// `$upstream_cache_etag`).
pub fn revalidation(req: &Request) -> Option<(Option<String>, Option<String>)> {
    req.cache.borrow().as_ref()?.revalidate.clone()
}

/// An entry's validators, from its stored head: only a 200's or 206's, as nginx keeps
/// them.
fn validators(meta: &Meta) -> Option<(Option<String>, Option<String>)> {
    let text = String::from_utf8_lossy(&meta.head);
    if !(text.starts_with("Status: 200") || text.starts_with("Status: 206")) {
        return None;
    }
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    // Re-written as nginx does (`ngx_http_time` of the parsed time).
    let lm = field("last-modified")
        .and_then(|v| httpdate::parse_http_date(&v).ok())
        .map(httpdate::fmt_http_date);
    let etag = field("etag").filter(|e| !e.is_empty());
    (lm.is_some() || etag.is_some()).then_some((lm, etag))
}

fn set_status(req: &Request, s: Status) {
    req.cache_status.set(Some(s));
}

/// Whether any of the templates gives a value other than empty or "0" (nginx's
/// `ngx_http_test_predicates`).
fn any_set(list: &Option<Arc<Vec<crate::http::variables::Template>>>, req: &Request) -> bool {
    list.iter().flat_map(|l| l.iter()).any(|t| {
        let v = t.eval(req, None);
        !v.is_empty() && v != "0"
    })
}

/// What the lookup decided.
pub enum Looked {
    /// The answer to send: from the cache, a purge's, or an error.
    Answer(Flow),
    /// Let the exchange run (with a [`Pending`] in the request when its answer may be
    /// stored); the zone its status is counted in by [`after`].
    Fetch(Option<Arc<Zone>>),
}

/// Look the request up (see [`Looked`]).
pub async fn before(req: &Request, c: &GatewayConf) -> Looked {
    let zone = match c.cache.zone_for(req) {
        Ok(Some(z)) => z,
        Ok(None) => return Looked::Fetch(None),
        Err(why) => {
            errlog::request(Level::Error, req, format_args!("{why}"));
            return Looked::Answer(Flow::Status(500));
        }
    };
    match look_up(req, c, &zone).await {
        Some(flow) => {
            if let Some(s) = req.cache_status.get() {
                crate::modules::metrics::cache::looked(&zone, s);
            }
            Looked::Answer(flow)
        }
        None => Looked::Fetch(Some(zone)),
    }
}

async fn look_up(req: &Request, c: &GatewayConf, zone: &Arc<Zone>) -> Option<Flow> {
    let cc = &c.cache;
    if any_set(&cc.purge, req) {
        return Some(purge(req, c, zone).await);
    }
    let bit = match req.method() {
        Method::Get => conf::GET,
        Method::Head => conf::HEAD,
        Method::Post => conf::POST,
        _ => 0,
    };
    if cc.methods() & bit == 0 {
        return None;
    }
    let proto = gateway::active(&req.conf)?;
    let mut key = KeyText::of(
        cc.key
            .as_deref()
            .unwrap_or_else(|| conf::default_key(proto)),
        req,
    );
    // A key this thread keeps a copy of the entry of has its md5 there (the hit path).
    let mut kept = hot::find(zone, &key.0);
    let main = kept
        .as_ref()
        .map_or_else(|| key::hash(key.0.as_bytes()), |h| h.hash);
    if any_set(&cc.bypass, req) {
        set_status(req, Status::Bypass);
        let main_vary = entry::lookup(zone.file(&main), key.0.as_str().into())
            .await
            .map(|(_, m)| (m.vary, m.variant));
        pend(req, zone, key.take(), main, main_vary, true, None, None);
        return None;
    }
    // When waiting for the lock ends (`*_cache_lock_timeout`), from the first wait on.
    let mut lock_deadline = None;
    let mut first = true;
    let files = req.conf.files.policy();
    loop {
        let round_one = std::mem::take(&mut first);
        let Ok(seen) = store::look(zone, &main, round_one) else {
            return Some(Flow::Status(500));
        };
        // The hit path: this thread's copy of the entry, still the zone's (looked for
        // again only in a later round: the first has the one found above).
        let h = match kept.take() {
            None if round_one => None,
            h => h.or_else(|| hot::find(zone, &key.0)),
        };
        if let Some(h) = h.filter(|h| h.current(seen.version, files.valid)) {
            if h.meta.valid >= now_secs() {
                set_status(req, Status::Hit);
                return Some(serve_hot(req, c, &h));
            }
        }
        // A key the zone knows no entry file of has none (nginx opens no file then either).
        let mut found = match seen.on_disk {
            true => entry::lookup(zone.file(&main), key.0.as_str().into()).await,
            false => None,
        };
        let mut found_at = main;
        // The main entry's Vary, and its variant: where an answer goes (see `start`).
        let main_vary = found.as_ref().map(|(_, m)| (m.vary.clone(), m.variant));
        let variant_for =
            |vary: &str| key::variant(&main, &validity::variant_of(vary, || req.head.headers()));
        if let Some(v) = found
            .as_ref()
            .map(|(_, m)| m)
            .filter(|m| !m.vary.is_empty())
        {
            let want = variant_for(&v.vary);
            if want != v.variant {
                // Another variant: its own entry, if it is one for this request.
                found_at = want;
                found = entry::lookup(zone.file(&want), key.0.as_str().into())
                    .await
                    .filter(|(_, m)| m.vary.is_empty() || variant_for(&m.vary) == m.variant);
            }
        }
        if let Some((file, meta)) = found.take_if(|(_, m)| m.valid >= now_secs()) {
            set_status(req, Status::Hit);
            if found_at != main {
                return Some(serve(req, c, file, meta));
            }
            return Some(
                match hot::put(zone, &main, seen.version, &key.0, file, meta, &files) {
                    Ok(h) => serve_hot(req, c, &h),
                    Err((file, meta)) => serve(req, c, file, meta),
                },
            );
        }
        // The background update fetches even though its own request marked the key.
        let fetching = seen.fetching.filter(|_| !req.cache_background);
        // `*_cache_use_stale updating`, or the entry's own `stale-while-revalidate`.
        let serve_updating = found.as_ref().is_some_and(|(_, m)| {
            cc.use_stale() & stale::UPDATING != 0 || m.stale_updating(now_secs())
        });
        if let Some((token, age)) = fetching {
            if serve_updating {
                let (file, meta) = found?;
                set_status(req, Status::Updating);
                return Some(serve(req, c, file, meta));
            }
            if cc.lock() && age < cc.lock_age() {
                // As nginx's ngx_http_file_cache_lock_wait: until the fetch ends, or ages
                // past `*_cache_lock_age` (then this request fetches), or the timeout.
                let now = tokio::time::Instant::now();
                let deadline = *lock_deadline.get_or_insert(now + cc.lock_timeout());
                let left = deadline.saturating_duration_since(now);
                let aged = cc.lock_age() - age;
                if !store::wait(zone, &main, token, left.min(aged)).await
                    && tokio::time::Instant::now() >= deadline
                {
                    // nginx: the request goes to the upstream, and its answer is not
                    // cached.
                    set_status(req, Status::Miss);
                    return None;
                }
                continue;
            }
        }
        if serve_updating && cc.background_update() && !req.cache_background {
            // nginx: the expired entry is the answer (STALE) and a copy of the request
            // updates it; the key counts as being updated from now on.
            let Some(fetch) = store::begin_fetch(zone, &main, seen.fetching.map(|(t, _)| t)) else {
                continue;
            };
            if background_update(req, fetch) {
                let (file, meta) = found?;
                set_status(req, Status::Stale);
                return Some(serve(req, c, file, meta));
            }
        }
        set_status(
            req,
            if found.is_some() {
                Status::Expired
            } else {
                Status::Miss
            },
        );
        let Some(fetch) = store::begin_fetch(zone, &main, seen.fetching.map(|(t, _)| t)) else {
            // Another request began fetching since: wait for it (or not) as above.
            continue;
        };
        // A range from too far into the answer goes to the upstream as it is, not stored.
        let store = seen.uses >= cc.min_uses() && !cc.range_too_far(req);
        let revalidate = found
            .as_ref()
            .filter(|_| cc.revalidate())
            .and_then(|(_, m)| validators(m));
        pend(
            req,
            zone,
            key.take(),
            main,
            main_vary,
            store,
            found,
            Some(fetch),
        );
        if let Some(p) = req.cache.borrow_mut().as_mut() {
            p.revalidate = revalidate;
            // The expired entry's file, for a revalidation to refresh.
            p.hash = found_at;
        }
        return None;
    }
}

thread_local! {
    static KEY: std::cell::Cell<String> = const { std::cell::Cell::new(String::new()) };
}

/// A request's cache key, evaluated into the thread's reused buffer and given back to it
/// when dropped (a lookup that fetches keeps it: [`KeyText::take`]). A hit allocated the
/// key and grew it part by part (about 400 instructions of malloc, realloc and free).
struct KeyText(String);

impl KeyText {
    fn of(t: &crate::http::variables::Template, req: &Request) -> KeyText {
        // Taken out of its cell while in use: a lookup waiting for a lock holds it across an
        // await, and another request of the thread gets a fresh one meanwhile.
        let mut s = KEY.with(std::cell::Cell::take);
        s.clear();
        t.append_to(&mut s, req, None);
        KeyText(s)
    }

    /// The key for a request that fetches: a copy of its exact length, the buffer going
    /// back to the thread (taking the buffer made the next lookup allocate and grow a new
    /// one, about 500 instructions of a miss; docs/bench/cache-report.md).
    fn take(&mut self) -> String {
        self.0.as_str().to_owned()
    }
}

impl Drop for KeyText {
    fn drop(&mut self) {
        // A huge key's buffer is not kept.
        if self.0.capacity() > 0 && self.0.capacity() <= 4096 {
            KEY.with(|c| c.set(std::mem::take(&mut self.0)));
        }
    }
}

/// Start the copy of `req` that refreshes its expired entry, holding `fetch` until it has
/// marked the key itself; false if there is no worker to run it on.
fn background_update(req: &Request, fetch: Fetching) -> bool {
    let Some(w) = crate::runtime::worker::current() else {
        return false;
    };
    let mut copy = super::mirror::copy_of(req, req.uri.clone(), req.body.clone());
    copy.uri_changed = req.uri_changed;
    copy.cache_background = true;
    let update = tokio::task::spawn_local(async move {
        super::mirror::run(&w, copy, crate::http::flow::Flow::Next).await;
        drop(fetch);
    });
    *req.background.borrow_mut() = Some(update);
    true
}

/// A purge (`*_cache_purge`): 204 when an entry was removed, 404 when none matched.
async fn purge(req: &Request, c: &GatewayConf, zone: &Arc<Zone>) -> Flow {
    let Some(proto) = gateway::active(&req.conf) else {
        return Flow::Status(500);
    };
    let key = c
        .cache
        .key
        .as_deref()
        .unwrap_or_else(|| conf::default_key(proto))
        .eval(req, None);
    let mut variant = None;
    let removed = if let Some(prefix) = key.strip_suffix('*') {
        // Every entry file's header is read: off the event loop.
        let (z, p) = (zone.clone(), prefix.as_bytes().to_vec());
        tokio::task::spawn_blocking(move || crate::cache::purge::prefix(&z, &p))
            .await
            .unwrap_or(0)
    } else {
        crate::cache::purge::one(zone, &key, |main, vary| {
            let v = key::variant(main, &validity::variant_of(vary, || req.head.headers()));
            variant = Some(v);
            v
        })
    };
    crate::modules::metrics::cache::purged(zone, removed);
    // The other nodes' entries too, whether this node had one or not.
    crate::cache::fanout::publish(zone, &key, variant).await;
    Flow::Status(if removed > 0 { 204 } else { 404 })
}

#[allow(clippy::too_many_arguments)]
fn pend(
    req: &Request,
    zone: &Arc<Zone>,
    key: String,
    main: Hash,
    main_vary: Option<(String, Hash)>,
    store: bool,
    stale: Option<(File, Meta)>,
    fetch: Option<Fetching>,
) {
    *req.cache.borrow_mut() = Some(Box::new(Pending {
        zone: zone.clone(),
        key,
        main,
        main_vary,
        hash: main,
        store,
        stale,
        revalidate: None,
        revalidated: false,
        _fetch: fetch,
    }));
}

/// The proxy sends a HEAD it may cache as a GET, so that the entry has the body
/// (`proxy_cache_convert_head`, on by default); the other protocols pass the method as
/// it is (so does nginx: their entries for a HEAD have no body).
pub fn head_as_get(req: &Request) -> bool {
    req.is_head()
        && req.conf.proxy.convert_head.unwrap_or(true)
        && gateway::active(&req.conf) == Some(Proto::Http)
        && req.cache.borrow().is_some()
}

/// The answer is not to be stored after all (its entry is not written).
pub fn no_store(req: &Request) {
    if let Some(p) = req.cache.borrow_mut().as_mut() {
        p.store = false;
    }
}

/// An entry as the answer.
fn serve(req: &Request, c: &GatewayConf, file: File, meta: Meta) -> Flow {
    let mut buf = BytesMut::from(&meta.head[..]);
    let Ok(Some(head)) = cgi::parse_head(&mut buf, usize::MAX) else {
        return Flow::Status(500);
    };
    let body = Part::File(FileRange {
        file: Rc::new(file),
        offset: meta.body_start,
        len: meta.body_len,
    });
    serve_head(req, c, body, &meta, head)
}

/// A worker's copy of an entry as the answer: the body from memory if it is small. The
/// head is the one made for the location's last hit when there is one (see
/// [`same_for_every_request`]): a hit then parses no stored head, hides no fields and reads
/// no date again (about 3,500 instructions of a 20,000-instruction hit, callgrind,
/// docs/bench/cache-report.md).
fn serve_hot(req: &Request, c: &GatewayConf, h: &hot::Hot) -> Flow {
    let body = match &h.data {
        Some(b) => Part::Bytes(b.clone()),
        None => Part::File(FileRange {
            file: h.file.clone(),
            offset: h.meta.body_start,
            len: h.meta.body_len,
        }),
    };
    if let Some(ready) = h.ready.borrow().as_ref() {
        if std::ptr::eq(ready.conf.as_ptr(), Arc::as_ptr(&req.conf)) {
            if crate::http::variables::keeps_upstream_headers() {
                // As `answer` keeps them for `$upstream_http_NAME`.
                *req.upstream_headers.borrow_mut() = Some(h.fields.clone());
            }
            let mut resp = ready.resp.clone();
            with_body(&mut resp, &h.meta, body);
            return Flow::Done(resp);
        }
    }
    let flow = head_of(req, c, h.head());
    let Flow::Done(mut resp) = flow else {
        return flow;
    };
    if same_for_every_request(req, c, &h.fields) {
        *h.ready.borrow_mut() = Some(hot::Ready {
            conf: Arc::downgrade(&req.conf),
            resp: resp.clone(),
        });
    }
    with_body(&mut resp, &h.meta, body);
    Flow::Done(resp)
}

/// Whether [`head_of`] makes the same answer of a stored head for every request of the
/// location: it does but for the fields the proxy rewrites per request (a Location or
/// Refresh by `proxy_redirect`, a Set-Cookie it passes by `proxy_cookie_*`); all else it
/// does depends on the location's settings and the head alone.
fn same_for_every_request(req: &Request, c: &GatewayConf, fields: &cgi::Fields) -> bool {
    match gateway::active(&req.conf) {
        Some(Proto::Http) => !fields.iter().any(|(n, _)| {
            n.eq_ignore_ascii_case("location")
                || n.eq_ignore_ascii_case("refresh")
                || (n.eq_ignore_ascii_case("set-cookie") && gateway::passes(c, n))
        }),
        Some(Proto::Memcached) | None => false,
        Some(_) => true,
    }
}

/// An entry, whose stored head is `head` and body `body`, as the answer.
fn serve_head(req: &Request, c: &GatewayConf, body: Part, meta: &Meta, head: CgiHead) -> Flow {
    match head_of(req, c, head) {
        Flow::Done(mut resp) => {
            with_body(&mut resp, meta, body);
            Flow::Done(resp)
        }
        flow => flow,
    }
}

fn with_body(resp: &mut Response, meta: &Meta, body: Part) {
    if meta.body_len > 0 {
        resp.body = Body::Parts(vec![body]);
    }
}

/// An entry's stored head as the answer's, without its body.
fn head_of(req: &Request, c: &GatewayConf, head: CgiHead) -> Flow {
    match answer(req, c, head) {
        Flow::Done(mut resp) => {
            // The length is the body's (and a range's, once cut), as a static file's.
            resp.content_length = None;
            resp.length_unknown = false;
            // nginx cuts ranges (several too) from an entry whose answer said
            // `Accept-Ranges` (and sends its own header for it then), or any with
            // `*_force_ranges`.
            let before = resp.headers.len();
            resp.headers
                .retain(|(n, _)| !n.eq_ignore_ascii_case("accept-ranges"));
            resp.accept_ranges = resp.headers.len() != before || c.force_ranges();
            take_validators(&mut resp);
            Flow::Done(resp)
        }
        flow => flow,
    }
}

/// An entry's Last-Modified and ETag become the answer's validators, as nginx's for a
/// cacheable answer (its not_modified filter then answers a conditional request 304 or
/// 412, and its Last-Modified goes out as nginx writes dates); a date that does not parse
/// stays a plain header.
fn take_validators(resp: &mut Response) {
    let mut i = 0;
    while i < resp.headers.len() {
        let (name, value) = &resp.headers[i];
        if name.eq_ignore_ascii_case("last-modified") && resp.last_modified.is_none() {
            if let Some(t) = gannet_proto::h1::encode::parse_http_date(value.as_bytes()) {
                resp.last_modified = Some(t);
                resp.headers.remove(i);
                continue;
            }
        } else if name.eq_ignore_ascii_case("etag") && resp.etag.is_none() {
            resp.etag = Some(Arc::from(&value[..]));
            resp.headers.remove(i);
            continue;
        }
        i += 1;
    }
}

/// The entry for an answer with this head, if it is to be stored, with room for `body`
/// bytes of it: the request's [`Pending`] is taken then (else left for [`after`]).
fn start(
    req: &Request,
    c: &GatewayConf,
    head: &CgiHead,
    buffering: bool,
    body: usize,
) -> Option<(Box<Pending>, Writer)> {
    if head.status == Some(304) {
        revalidated(req, c, head);
        return None;
    }
    if !buffering {
        return None;
    }
    let pending = req.cache.borrow();
    let p = pending.as_ref().filter(|p| p.store)?;
    if head.get("x-accel-redirect").is_some() && !c.ignores("x-accel-redirect") {
        return None;
    }
    let status = match (head.status, head.get("location")) {
        (Some(s), _) => s,
        // A CGI local redirect is served from elsewhere; another Location is a 302.
        (None, Some(l)) if l.starts_with('/') && !l.starts_with("//") => return None,
        (None, Some(_)) => 302,
        (None, None) => 200,
    };
    // An answer the expired entry is served in place of is not stored over it.
    if p.stale.is_some() && c.cache.use_stale() & stale_for(status) != 0 {
        return None;
    }
    if any_set(&c.cache.no_cache, req) {
        return None;
    }
    let now = now_secs();
    let valid = c.cache.valid.as_deref().map_or(&[][..], Vec::as_slice);
    let verdict = validity::judge(head, status, valid, |h| c.ignores(h), now)?;
    let vary = verdict.vary.unwrap_or_default();
    let variant = if vary.is_empty() {
        [0; 16]
    } else {
        key::variant(&p.main, &validity::variant_of(&vary, || req.head.headers()))
    };
    // Where the answer goes: the key's own entry, unless that is another variant of the
    // same Vary, when it goes to its variant's (found from the main entry's Vary). An answer
    // without Vary, or with another Vary than the main entry's, replaces the main entry, so
    // that every request finds it (nginx's rule for a Vary that changed).
    let hash = match &p.main_vary {
        Some((v, mv)) if !vary.is_empty() && *v == vary && *mv != variant => variant,
        _ => p.main,
    };
    let meta = Meta {
        valid: verdict.valid,
        date: now,
        vary,
        variant,
        updating: verdict.updating,
        error: verdict.error,
        head: Vec::new(),
        body_start: 0,
        body_len: 0,
    };
    // The answer's head, CGI form, written straight into the entry's header.
    let header = entry::header_with(&p.key, &meta, body, |text| {
        text.extend_from_slice(b"Status: ");
        entry::push_decimal(text, u64::from(status), 1);
        text.extend_from_slice(b"\r\n");
        for (n, v) in head.headers.iter() {
            const HOP: &[&str] = &[
                "connection",
                "keep-alive",
                "transfer-encoding",
                "content-length",
            ];
            if HOP.iter().any(|h| n.eq_ignore_ascii_case(h)) {
                continue;
            }
            text.extend_from_slice(n.as_bytes());
            text.extend_from_slice(b": ");
            text.extend_from_slice(v.as_bytes());
            text.extend_from_slice(b"\r\n");
        }
        text.extend_from_slice(b"\r\n");
    });
    let temp;
    let tmp_dir = if p.zone.use_temp_path {
        temp = c.temp_path();
        &temp.dir
    } else {
        &p.zone.dir
    };
    let dest = p.zone.file(&hash);
    let w = Writer::create(tmp_dir, dest, header);
    drop(pending);
    let mut p = req.cache.borrow_mut().take()?;
    p.hash = hash;
    Some((p, w))
}

/// The application's 304 to a revalidation (nginx's "upstream not modified"): the expired
/// entry is to be served, valid again for what the 304's headers say, or
/// `*_cache_valid 304` (else it stays expired, as nginx leaves it).
fn revalidated(req: &Request, c: &GatewayConf, head: &CgiHead) {
    let mut pending = req.cache.borrow_mut();
    let Some(p) = pending
        .as_mut()
        .filter(|p| p.revalidate.is_some() && p.stale.is_some())
    else {
        return;
    };
    p.revalidated = true;
    let now = now_secs();
    let valid = c.cache.valid.as_deref().map_or(&[][..], Vec::as_slice);
    let Some((_, meta)) = &mut p.stale else {
        return;
    };
    let mut text = BytesMut::from(&meta.head[..]);
    let stored = cgi::parse_head(&mut text, usize::MAX)
        .ok()
        .flatten()
        .unwrap_or_default();
    let Some(until) = validity::revalidated(head, &stored, valid, |h| c.ignores(h), now) else {
        return;
    };
    let path = p.zone.file(&p.hash);
    meta.valid = until;
    // On the worker thread, as a hit's read of the header (a write of 16 bytes into a file
    // the page cache holds): the next request finds the entry fresh, as in nginx, which
    // updates the header before it answers.
    if let Err(e) = entry::refresh(&path, until, now) {
        errlog::log(
            Level::Crit,
            format_args!("{}", errlog::failed("pwrite()", &path, &e)),
        );
    }
    // The copies workers keep of the expired entry are to be read again.
    store::changed(&p.zone, &p.hash);
}

/// An answer that came whole: store it if it may be (not when it is not buffered:
/// `*_buffering off` or `X-Accel-Buffering: no`, as nginx).
pub async fn store_whole(
    req: &Request,
    c: &GatewayConf,
    head: &CgiHead,
    body: &[u8],
    buffering: bool,
) {
    if let Some(mut tee) = tee(req, c, head, buffering, body.len()) {
        tee.write(body);
        tee.finish(req).await;
    }
}

/// The entry an answer read in pieces is written to, piece by piece: a cache entry, or
/// (`p` is `None`) the file `*_store` keeps it in (`conn::gateway_store`).
pub struct Tee {
    p: Option<Box<Pending>>,
    w: Writer,
}

impl Tee {
    pub fn file(w: Writer) -> Tee {
        Tee { p: None, w }
    }
}

/// Start storing an answer read in pieces: each piece the client is given is written
/// ([`Tee::write`]), the bytes that came with the head too; `body`: how many bytes to make
/// room for at once (the whole answer's, when it came whole).
pub fn tee(
    req: &Request,
    c: &GatewayConf,
    head: &CgiHead,
    buffering: bool,
    body: usize,
) -> Option<Tee> {
    if c.store.is_some() {
        return super::gateway_store::start(req, c, head, buffering);
    }
    let (p, w) = start(req, c, head, buffering, body)?;
    Some(Tee { p: Some(p), w })
}

impl Tee {
    /// A piece of the answer, queued for the entry (a failure is logged by the writer).
    pub fn write(&mut self, b: &[u8]) {
        if !b.is_empty() {
            self.w.write(b);
        }
    }

    /// A piece of the answer no client waits for: queued once the entry's file has taken
    /// most of what came before (the memory held stays bounded whatever the disk's pace).
    pub async fn write_paced(&mut self, b: &[u8]) {
        self.w.room().await;
        self.write(b);
    }

    /// The answer ended whole: put the entry in place, or leave an entry held in memory to
    /// the connection that serves `req`, which puts it in place once the answer is sent
    /// (`conn::exchange::answer`) and before it reads on, so that its next request finds
    /// it. nginx too sends an answer before it renames its entry
    /// (`ngx_http_upstream_process_request`); the client does not wait for the file system.
    pub async fn finish(self, req: &Request) {
        if req.store_after_answer && self.w.is_held() {
            let mut after = req.store_after.borrow_mut();
            if after.is_none() {
                *after = Some(Box::new(self));
                return;
            }
        }
        self.commit().await;
    }

    /// The answer ended whole: put the entry in place. The fetch ends (its waiters go on)
    /// once the entry is there; the answer's end waits for it too, so that the client's
    /// next request finds the entry (nginx renames before it finishes the request). An
    /// entry held in memory is in place when this returns, without a wait.
    pub async fn commit(self) {
        let Tee { p, w } = self;
        // An entry held in memory is put in place here and now: no channel, no boxed
        // callback (about 400 instructions of a miss; docs/bench/cache-report.md).
        let w = match w.commit_held() {
            Ok(size) => {
                if let (Some(p), Some(size)) = (&p, size) {
                    store::stored(&p.zone, &p.hash, size);
                }
                return;
            }
            Err(w) => w,
        };
        let (done, placed) = tokio::sync::oneshot::channel();
        w.commit(Box::new(move |size| {
            if let (Some(p), Some(size)) = (&p, size) {
                store::stored(&p.zone, &p.hash, size);
            }
            drop(p);
            let _ = done.send(());
        }));
        let _ = placed.await;
    }
}

/// The `*_cache_use_stale` conditions a status meets: what `conn::gateway` answers for a
/// failed exchange, 502 (error, invalid header) and 504 (timeout), and the application's
/// own statuses.
fn stale_for(status: u16) -> u16 {
    match status {
        502 => stale::ERROR | stale::INVALID_HEADER | stale::HTTP_502,
        504 => stale::TIMEOUT | stale::HTTP_504,
        500 => stale::HTTP_500,
        503 => stale::HTTP_503,
        403 => stale::HTTP_403,
        404 => stale::HTTP_404,
        429 => stale::HTTP_429,
        _ => 0,
    }
}

/// After the exchange: a HEAD's answer read whole into its entry; an expired entry in
/// place of a failure `*_cache_use_stale` names; the lookup's final status counted.
pub async fn after(
    req: &Request,
    c: &GatewayConf,
    zone: Option<&Zone>,
    o: super::gateway::Outcome,
) -> super::gateway::Outcome {
    let o = finish(req, c, o).await;
    if let (Some(z), Some(s)) = (zone, req.cache_status.get()) {
        crate::modules::metrics::cache::looked(z, s);
    }
    o
}

async fn finish(
    req: &Request,
    c: &GatewayConf,
    o: super::gateway::Outcome,
) -> super::gateway::Outcome {
    use super::gateway::Outcome;
    let o = match o {
        Outcome::Stream(resp, mut s) if req.is_head() => {
            if s.cache_rest(req).await {
                return Outcome::Flow(Flow::Done(resp));
            }
            Outcome::Stream(resp, s)
        }
        o => o,
    };
    let Some(p) = req.cache.borrow_mut().take() else {
        return o;
    };
    let Some((file, meta)) = p.stale else {
        return o;
    };
    if p.revalidated {
        set_status(req, Status::Revalidated);
        return Outcome::Flow(serve(req, c, file, meta));
    }
    let status = match &o {
        Outcome::Flow(Flow::Status(s)) => Some(*s),
        Outcome::Flow(Flow::Done(r)) | Outcome::Stream(r, _) => Some(r.status),
        _ => None,
    };
    let bits = c.cache.use_stale();
    let wanted = status.map_or(0, stale_for);
    // The entry's `stale-if-error` covers the exchange's own failures (not an application's
    // 5xx answer), as nginx's `stale_error`.
    let failed = matches!(o, Outcome::Flow(Flow::Status(502 | 504)));
    if bits & wanted == 0 && !(failed && meta.stale_error(now_secs())) {
        return o;
    }
    set_status(req, Status::Stale);
    Outcome::Flow(serve(req, c, file, meta))
}

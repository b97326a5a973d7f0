//! The request as the phases see it: the parsed head, the current (possibly rewritten) URI,
//! the virtual host and location chosen for it, and what the connection knows.

use crate::config::ServerConf;
use crate::conn::ConnInfo;
use crate::http::router::Location;
use crate::http::user_vars;
use crate::modules::LocConf;
use gannet_proto::cgi::HeaderValue;
use gannet_proto::h1::{Method, RequestHead};
use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

pub struct Request {
    pub head: RequestHead,
    pub conn: ConnInfo,
    /// `$uri`: decoded, normalised path; changed by rewrites, index and internal redirects.
    pub uri: String,
    /// `$args`: the query string, raw.
    pub args: Option<String>,
    /// `$host`: from the absolute-form target, else Host, else the server name; lowercased,
    /// without port.
    pub host: String,
    pub server: Arc<ServerConf>,
    /// The matched location (`None` before matching or when the server has none that match).
    pub location: Option<Arc<Location>>,
    /// The settings in force: the location's, or the server's.
    pub conf: Arc<LocConf>,
    /// Regex captures of the last successful match (`$0`..`$9`).
    pub captures: Vec<Option<String>>,
    pub start: Instant,
    /// Bytes of request body read (for `$request_length`).
    pub body_length: u64,
    /// The head's length as it came when that is not `head.raw()`'s (HTTP/2: the header
    /// block, HPACK-coded), for `$request_length`.
    pub wire_head_len: Option<u32>,
    /// The body read whole for an application (memory or temporary file), shared with
    /// mirrored copies; `None` when there is none or it is passed on as it arrives.
    pub body: Option<std::rc::Rc<crate::conn::request_body::RequestBody>>,
    /// Set once an internal redirect (index, try_files, error_page, rewrite) happened.
    pub internal: bool,
    /// Internal redirects so far; a loop is cut at 10 with a 500, as nginx does.
    pub redirects: u8,
    /// The status an `error_page` redirect carries to the final response.
    pub error_status: Option<u16>,
    /// An `error_page` redirect happened (a second one needs `recursive_error_pages`).
    pub error_paged: bool,
    /// error_page fetches its page with GET whatever the request's method was.
    pub method_override: Option<Method>,
    /// Values of the variables the config defines (`set`, `map`, named captures).
    pub vars: user_vars::Values,
    /// A rewrite or internal redirect changed the URI: the client's raw one no longer
    /// applies (nginx's `valid_unparsed_uri` cleared).
    pub uri_changed: bool,
    /// The URI still starts with the matched location's prefix (a rewrite with `break`
    /// clears this; nginx's `valid_location`).
    pub location_valid: bool,
    /// Each upstream server tried, for `$upstream_addr`, `$upstream_status` and
    /// `$upstream_response_time` (filled in while the phases hold `&Request`).
    pub upstream: RefCell<Tries>,
    /// `$limit_req_status`; set once a `limit_req` key applied, which also means no later
    /// location limits the request again.
    pub limit_req_status: Option<&'static str>,
    /// `$limit_conn_status`, the same for `limit_conn`.
    pub limit_conn_status: Option<&'static str>,
    /// `$limit_rate`: set by `set $limit_rate`, or the rate the answer was sent at.
    pub limit_rate: Cell<Option<u64>>,
    /// `auth_basic`'s and `auth_request`'s `WWW-Authenticate` values, sent with the 401
    /// (and its error page).
    pub auth_challenge: Vec<String>,
    /// An `auth_request` subrequest (it skips the access phase, as nginx's subrequests do).
    pub subrequest: bool,
    /// An application's `X-Accel-Redirect` answer's headers that the redirected request's
    /// answer carries (nginx's list: Content-Type, Set-Cookie, Content-Disposition,
    /// Cache-Control, Expires, Accept-Ranges).
    pub carried: Vec<(Cow<'static, str>, HeaderValue)>,
    /// A redirect's Location when an `error_page` for its status answers instead: the page
    /// carries it (unless it has one of its own), as nginx keeps it in the answer's headers.
    pub moved_to: Option<String>,
    /// The `limit_conn` counts this request holds until it is dropped.
    pub limit_conns: Vec<crate::modules::limit_conn::Held>,
    /// The client's address from `real_ip_header` (see [`Request::client`]).
    pub real_peer: Option<SocketAddr>,
    /// `$request_id`, made the first time it is read and then kept for the request.
    pub request_id: Cell<Option<u128>>,
    /// The locations with `mirror` this request went through (nginx's precontent phase
    /// mirrors once per location it runs in: again after an internal redirect).
    pub mirrored: Vec<Arc<crate::modules::LocConf>>,
    /// The last upstream answer's header fields, for `$upstream_http_NAME`; kept only while
    /// a loaded config reads such a variable (see `http::variables::keeps_upstream_headers`).
    pub upstream_headers: RefCell<Option<gannet_proto::cgi::Fields>>,
    /// `$secure_link_expires`, known once `$secure_link` was evaluated (as in nginx).
    pub secure_link_expires: RefCell<Option<String>>,
    /// The userid filter's view of the request's cookie, made when first asked for.
    pub userid: RefCell<Option<Box<crate::modules::userid::Uid>>>,
    /// The request's OpenTelemetry trace (`modules::otel`), made when a location traces
    /// or an `$otel_*` variable is read.
    pub otel: std::cell::OnceCell<Box<crate::modules::otel::Trace>>,
    /// `$upstream_cache_status`, once the cache was looked at.
    pub cache_status: Cell<Option<crate::cache::Status>>,
    /// The cache entry this request's answer may be stored as (`conn::gateway_cache`).
    pub cache: RefCell<Option<Box<crate::conn::gateway_cache::Pending>>>,
    /// The cache entry of the answer, held in memory, that the connection puts in place
    /// once the answer is out (`gateway_cache::Tee::finish`).
    pub store_after: RefCell<Option<Box<crate::conn::gateway_cache::Tee>>>,
    /// A connection serves the request (`conn::exchange::answer`), and so stores its entry
    /// after the answer; other requests (mirrors, subrequests, background updates) store
    /// theirs at once.
    pub store_after_answer: bool,
    /// The background update of a STALE answer's entry (`*_cache_background_update`): as
    /// nginx's background subrequest, the connection goes on once it is done.
    pub background: RefCell<Option<tokio::task::JoinHandle<()>>>,
    /// An application's `X-Accel-Charset` (nginx's `override_charset` of the answer): the
    /// charset the charset filter recodes its answer into, whatever the location's
    /// `charset` says; taken by the filter. (Kept here, not in the `Response`, which every
    /// answer carries.)
    pub override_charset: RefCell<Option<Arc<str>>>,
    /// The slice module's state, made when `$slice_range` is read (`modules::slice`).
    pub slice: RefCell<Option<Box<crate::modules::slice::State>>>,
    /// A cache's background update (`*_cache_background_update`): it fetches even while
    /// its key is being updated, and serves no stale entry.
    pub cache_background: bool,
    /// The 401 an `auth_delay` holds back until its time has passed.
    pub auth_delayed: Option<u16>,
}

/// One upstream server a request was sent to.
#[derive(Debug, Clone)]
pub struct UpstreamTry {
    pub addr: crate::upstream::Addr,
    /// What it answered, or the status its failure maps to (502, 504).
    pub status: u16,
    pub time: std::time::Duration,
    /// From the attempt's start until the connection was there to send on
    /// (`$upstream_connect_time`; `None`: never connected).
    pub connect: Option<std::time::Duration>,
    /// Until the answer's head was read (`$upstream_header_time`; `None`: no head came).
    pub header: Option<std::time::Duration>,
    /// Bytes written to the server (`$upstream_bytes_sent`: the request's head, as sent).
    pub sent: u64,
    /// Bytes read from it (`$upstream_bytes_received`), and of them the answer's body
    /// (`$upstream_response_length`); both grow while the body is passed on.
    pub received: u64,
    pub body: u64,
    /// When the attempt began: `time` runs on to the end of a body read after the head.
    pub started: std::time::Instant,
}

/// The upstream servers a request was sent to, in order. The first is kept inline: nearly
/// every request has exactly one, and a Vec was an allocation per proxied request.
#[derive(Debug, Default)]
pub struct Tries {
    first: Option<UpstreamTry>,
    more: Vec<UpstreamTry>,
    /// When the attempt under way got its connection and its answer's head; taken by the
    /// [`UpstreamTry`] that records the attempt.
    pub connected: Option<Instant>,
    pub head_read: Option<Instant>,
    /// The attempt under way: its server and start, for a client that leaves before it
    /// is over (its line is logged with the times it got to, as nginx's).
    pub under_way: Option<(crate::upstream::Addr, Instant)>,
    /// Bytes the attempt under way sent and read so far, taken by its [`UpstreamTry`].
    pub sent: u64,
    pub received: u64,
    /// The trailer fields of a server's answer, kept for the client (`proxy_pass_trailers`,
    /// `conn::proxy_h2`).
    pub trailers: Option<crate::conn::proxy_h2::Trailers>,
    /// The last attempt's answer is being passed on: its `$upstream_response_time` is
    /// `-` until its body has been read (nginx sets it when the upstream part ends, so
    /// `add_header` sees `-` for it).
    pub pending: bool,
}

impl Tries {
    pub fn push(&mut self, t: UpstreamTry) {
        match self.first {
            None => self.first = Some(t),
            Some(_) => self.more.push(t),
        }
    }

    /// The attempt under way has a connection to send on (kept or new); the first mark
    /// counts, as nginx sets its connect time once per attempt.
    pub fn mark_connected(&mut self) {
        self.connected
            .get_or_insert_with(crate::runtime::clock::now);
    }

    /// The answer's body: `n` bytes came with its head (`read`: counted as received
    /// already) or after it.
    pub fn add_body(&mut self, n: usize, read: bool) {
        if let Some(t) = self.more.last_mut().or(self.first.as_mut()) {
            t.body += n as u64;
            if !read {
                t.received += n as u64;
            }
        }
    }

    /// The answer's body has been read to its end (or failed): `$upstream_response_time`
    /// is the whole exchange's, as nginx's.
    pub fn body_done(&mut self) {
        self.pending = false;
        if let Some(t) = self.more.last_mut().or(self.first.as_mut()) {
            t.time = t.started.elapsed();
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &UpstreamTry> {
        self.first.iter().chain(&self.more)
    }

    /// How many attempts there were.
    pub fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.more.len()
    }
}

thread_local! {
    /// The last request's `$uri` and `$host` buffers (emptied), for the next request's path
    /// and host on this thread: a kept connection's request then allocates neither (two
    /// `malloc`s and two `free`s, about 250 instructions a request, callgrind). Handed back
    /// by the connection that served it ([`Request::give_back_strings`]).
    static SPARE_STRINGS: std::cell::Cell<(String, String)> =
        const { std::cell::Cell::new((String::new(), String::new())) };
}

/// A buffer longer than this is not kept for the next request.
const STRING_KEEP: usize = 1024;

/// Buffers for the next request's path and host (`$uri`, `$host`): empty, with the room
/// the last request's had (or none).
pub fn spare_strings() -> (String, String) {
    SPARE_STRINGS.with(std::cell::Cell::take)
}

impl Request {
    /// Give `$uri`'s and `$host`'s buffers to the next request of this thread (see
    /// [`spare_strings`]); the request is over.
    pub fn give_back_strings(&mut self) {
        let keep = |s: &mut String| {
            let mut s = std::mem::take(s);
            if s.capacity() > STRING_KEEP {
                s = String::new();
            }
            s.clear();
            s
        };
        let spare = (keep(&mut self.uri), keep(&mut self.host));
        SPARE_STRINGS.with(|c| c.set(spare));
    }

    /// Open `path` through the worker's file cache with this location's policy, checking
    /// symbolic links as `disable_symlinks` says (nginx's `ngx_http_set_disable_symlinks`:
    /// a `from=` value that is a prefix of the path leaves that part unchecked, and the
    /// whole path unchecked when equal to it). Nothing is evaluated when it is off.
    pub fn open_file(
        &self,
        w: &crate::runtime::worker::Worker,
        path: &std::path::Path,
    ) -> Result<crate::modules::file_cache::OpenFile, std::io::ErrorKind> {
        use crate::modules::core::SymlinkMode;
        use crate::modules::file_cache::Symlinks;
        let mut policy = self.conf.files.policy();
        if let Some((mode, from)) = &self.conf.core.disable_symlinks {
            let p = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str());
            let from = match from.as_ref().map(|t| t.eval(self, None)) {
                Some(f) if !f.is_empty() && p.starts_with(f.as_bytes()) => {
                    let f = f.as_bytes();
                    if f.len() == p.len() {
                        None
                    } else if p[f.len()] == b'/' {
                        Some(f.len())
                    } else if f.ends_with(b"/") {
                        Some(f.len() - 1)
                    } else {
                        Some(0)
                    }
                }
                _ => Some(0),
            };
            policy.symlinks = match (mode, from) {
                (SymlinkMode::Off, _) | (_, None) => Symlinks::Off,
                (SymlinkMode::On, Some(from)) => Symlinks::On { from },
                (SymlinkMode::IfNotOwner, Some(from)) => Symlinks::IfNotOwner { from },
            };
        }
        w.files.open(path, &policy)
    }

    /// Logs the fields left out for their names (`ignore_invalid_headers`) at info, with
    /// nginx's words for each protocol.
    pub fn log_ignored_headers(&self) {
        for line in &self.head.ignored {
            let line = String::from_utf8_lossy(line);
            let what = match self.head.version {
                gannet_proto::h1::Version::Http2 | gannet_proto::h1::Version::Http3 => {
                    "invalid header"
                }
                _ => "invalid header line",
            };
            crate::errlog::request(
                crate::errlog::Level::Info,
                self,
                format_args!("client sent {what}: \"{line}\""),
            );
        }
    }

    pub fn new(
        head: RequestHead,
        conn: ConnInfo,
        server: Arc<ServerConf>,
        uri: String,
        args: Option<String>,
        host: String,
    ) -> Request {
        Request {
            conf: server.conf.clone(),
            server,
            head,
            conn,
            uri,
            args,
            host,
            location: None,
            captures: Vec::new(),
            // The turn's time (`runtime::clock`): the head was read in this turn.
            start: crate::runtime::clock::now(),
            body_length: 0,
            wire_head_len: None,
            body: None,
            internal: false,
            redirects: 0,
            error_status: None,
            error_paged: false,
            method_override: None,
            vars: user_vars::Values::default(),
            uri_changed: false,
            location_valid: true,
            upstream: RefCell::default(),
            limit_req_status: None,
            limit_conn_status: None,
            limit_rate: Cell::new(None),
            limit_conns: Vec::new(),
            real_peer: None,
            auth_challenge: Vec::new(),
            subrequest: false,
            carried: Vec::new(),
            moved_to: None,
            request_id: Cell::new(None),
            mirrored: Vec::new(),
            upstream_headers: RefCell::new(None),
            cache_status: Cell::new(None),
            cache: RefCell::new(None),
            store_after: RefCell::new(None),
            store_after_answer: false,
            background: RefCell::new(None),
            override_charset: RefCell::new(None),
            slice: RefCell::new(None),
            cache_background: false,
            auth_delayed: None,
            secure_link_expires: RefCell::new(None),
            userid: RefCell::new(None),
            otel: std::cell::OnceCell::new(),
        }
    }

    /// `$arg_NAME`: the first `NAME=value` in the query (raw, not decoded, as nginx).
    pub fn arg(&self, name: &str) -> Option<&str> {
        self.args.as_deref()?.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            k.eq_ignore_ascii_case(name).then_some(v)
        })
    }

    /// `$cookie_NAME`.
    pub fn cookie(&self, name: &str) -> Option<String> {
        self.head
            .headers()
            .filter(|(n, _)| n.eq_ignore_ascii_case("cookie"))
            .find_map(|(_, v)| {
                String::from_utf8_lossy(v).split(';').find_map(|kv| {
                    let (k, v) = kv.trim().split_once('=')?;
                    (k == name).then(|| v.to_string())
                })
            })
    }

    /// `$document_root`: the `root` (or `alias`) in force, variables expanded.
    pub fn document_root(&self) -> String {
        let mut root = String::new();
        self.append_document_root(&mut root);
        root
    }

    /// Append `$document_root` (FastCGI's params use it twice per request).
    pub fn append_document_root(&self, out: &mut String) {
        let core = &self.conf.core;
        match &core.alias {
            Some(a) => a.append_to(out, self, None),
            None => core.root().append_to(out, self, None),
        }
    }

    /// Map a URI to a file path by `root` or `alias`. The URI is normalised, so the result
    /// never leaves the root.
    pub fn filename_for(&self, uri: &str) -> PathBuf {
        let mut p = String::new();
        self.filename_into(uri, &mut p);
        PathBuf::from(p)
    }

    /// [`Request::filename_for`], appended to `p` (the static handler's buffer, reused
    /// from request to request: no allocation per file served).
    pub fn filename_into(&self, uri: &str, p: &mut String) {
        let core = &self.conf.core;
        if let Some(alias) = &core.alias {
            p.push_str(&alias.eval(self, None));
            // A regex location's alias holds the whole path (built from captures); a
            // prefix location's replaces its prefix, in the locations nested in it too.
            let prefix = core.alias_of.as_deref().unwrap_or("");
            if !(prefix.is_empty() && alias.has_vars()) {
                p.push_str(uri.strip_prefix(prefix).unwrap_or(uri));
            }
            return;
        }
        let start = p.len();
        match core.root().as_literal() {
            // A root without variables (the usual one) is copied once into room for the
            // URI too, rather than copied and then grown.
            Some(r) => {
                p.reserve(r.len() + uri.len());
                p.push_str(r);
            }
            None => p.push_str(&core.root().eval(self, None)),
        }
        if p.len() > start && p.ends_with('/') && uri.starts_with('/') {
            p.pop();
        }
        p.push_str(uri);
    }

    /// `$request_id`: 128 random bits, as nginx's (which reads them from OpenSSL's
    /// RAND_bytes, or its own random() without OpenSSL), a label for a request, not a
    /// secret; made the first time it is read, then kept.
    pub fn request_id(&self) -> u128 {
        self.request_id.get().unwrap_or_else(|| {
            let id = fastrand::u128(..);
            self.request_id.set(Some(id));
            id
        })
    }

    /// The method the phases act on (GET for an error_page fetch).
    pub fn method(&self) -> Method {
        self.method_override.unwrap_or(self.head.method)
    }

    pub fn is_head(&self) -> bool {
        self.head.method == Method::Head
    }
}

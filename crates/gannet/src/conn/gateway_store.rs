//! `*_store` (nginx's ngx_http_upstream_store): an application's 200 answer, read whole
//! through a buffered exchange, is kept as a file - at the path its URI maps to under
//! `root` / `alias` (`on`), or at the path a string makes - with `*_store_access`'s
//! permissions and the answer's Last-Modified as its time. The body goes to a temp file in
//! `*_temp_path` as it goes to the client (the cache's writer, `conn::gateway_cache::Tee`)
//! and is renamed into place once it came whole; an answer cut short (the application
//! failed, the client left) leaves no file, its temp file removed.

use super::gateway_cache::Tee;
use crate::cache::entry::Writer;
use crate::http::request::Request;
use crate::modules::gateway::{GatewayConf, Store};
use gannet_proto::cgi::CgiHead;
use std::path::PathBuf;

/// The file an answer is to be stored in, if it is to be: a 200 (a CGI answer without a
/// status is one) to a request that has a body to keep, buffered (nginx keeps none of
/// an answer passed on as it comes).
pub fn start(req: &Request, c: &GatewayConf, head: &CgiHead, buffering: bool) -> Option<Tee> {
    let store = c.store()?;
    let status = match head.status {
        Some(s) => s,
        None if head.get("location").is_some() => return None,
        None => 200,
    };
    if status != 200 || !buffering || req.is_head() {
        return None;
    }
    let dest = match store {
        Store::Root => req.filename_for(&req.uri),
        Store::Path(t) => PathBuf::from(t.eval(req, None)),
        Store::Off => return None,
    };
    if dest.as_os_str().is_empty() {
        return None;
    }
    let mtime = head
        .get("last-modified")
        .and_then(|v| httpdate::parse_http_date(v.trim()).ok());
    let tmp = c.temp_path();
    Some(Tee::file(Writer::plain(
        &tmp.dir,
        dest,
        c.store_access(),
        mtime,
    )))
}

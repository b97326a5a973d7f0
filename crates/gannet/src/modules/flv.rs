//! FLV pseudo-streaming (nginx's ngx_http_flv_module): `flv;` makes a location's files
//! answerable from a byte offset, `?start=N`: the answer is an FLV file header
//! (`FLV\x1\x5\0\0\0\x9\0\0\0\0`) and the file from byte N, so a player can seek to a tag
//! boundary it knows from the file's metadata. Without `start` (or with 0, a non-number, or
//! an offset past the end) the file is served whole, as a static file. Like nginx's, this is
//! the location's content handler: set in the location itself, not inherited.

use super::static_files;
use super::{LoadCtx, LocConf};
use crate::http::flow::Flow;
use crate::http::request::Request;
use crate::http::response::{Body, FileRange, Part};
use crate::runtime::worker::Worker;
use bytes::Bytes;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};

pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "flv",
    ctx: Ctx::LOCATION,
    args: Args::Exactly(0),
    block: false,
}];

/// The header that makes the file's tail an FLV file again.
const HEADER: &[u8] = b"FLV\x01\x05\0\0\0\x09\0\0\0\0";

pub fn set(_d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    lc.flv = true;
    Ok(())
}

/// nginx's `ngx_http_flv_handler`.
pub fn handle(req: &Request, w: &Worker) -> Flow {
    let f = match static_files::open_media(req, w) {
        Ok(f) => f,
        Err(flow) => return *flow,
    };
    let mut r = static_files::file_response(req, &f);
    // nginx's `ngx_atoof`: digits only; 0, anything else or past the end: the whole file.
    let start = req
        .arg("start")
        .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&n| n > 0 && n < f.size);
    if let Some(start) = start {
        let tail = match &f.data {
            Some(d) => Part::Bytes(d.slice(start as usize..)),
            None => Part::File(FileRange {
                file: f.file.clone(),
                offset: start,
                len: f.size - start,
            }),
        };
        r.body = Body::Parts(vec![Part::Bytes(Bytes::from_static(HEADER)), tail]);
        // Compressed copies are of the whole file.
        r.variants = None;
        // nginx makes the ETag from the answer's length, not the file's.
        if r.etag.is_some() {
            let len = HEADER.len() as u64 + f.size - start;
            r.etag = Some(static_files::etag(f.mtime_secs, len).into());
        }
    }
    Flow::Done(r)
}

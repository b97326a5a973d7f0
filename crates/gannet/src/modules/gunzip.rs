//! `gunzip on|off` and `gunzip_buffers` (accepted, checked): an answer with
//! `Content-Encoding: gzip` (an application's, or a `gzip_static always` file) is sent
//! decompressed to a client that does not take gzip, as nginx's
//! ngx_http_gunzip_filter_module: Content-Encoding, Content-Length and Accept-Ranges go,
//! the ETag turns weak, and the body is inflated piece by piece while it is sent (flate2;
//! concatenated gzip members are all inflated). Either way the answer varies by
//! Accept-Encoding (`Vary` when `gzip_vary` is on). It runs before `sub_filter`, `charset`
//! and compression, which see the plain body.

use super::{inherit, LoadCtx, LocConf};
use crate::http::compress::{accept_encoding, add_vary, client_refuses, negotiate};
use crate::http::request::Request;
use crate::http::response::Response;
use crate::modules::compress::Coding;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use std::io::Write;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "gunzip",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "gunzip_buffers",
        ctx: Ctx::HSL,
        args: Args::Exactly(2),
        block: false,
    },
];

#[derive(Debug, Clone, Default)]
pub struct GunzipConf {
    pub on: Option<bool>,
}

impl GunzipConf {
    pub fn merge(&mut self, p: &GunzipConf) {
        inherit!(self, p, on);
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    if d.name == "gunzip" {
        lc.gunzip.on = Some(setters::flag(d)?);
    } else {
        // Accepted: the inflater's buffers are flate2's and the pieces the source's.
        // Checked as nginx's ngx_conf_set_bufs_slot: a count and a size, neither 0.
        let ok = setters::num(&d.args[0]).is_some_and(|n| n > 0)
            && setters::size(&d.args[1]).is_some_and(|n| n > 0);
        if !ok {
            return Err(d.error(format!("\"{}\" directive invalid value", d.name)));
        }
    }
    Ok(())
}

/// Set `resp` up to be sent inflated if it is gzip-encoded and the client does not take
/// gzip (nginx's header filter). HTTP/1 and HTTP/2, whole and streamed answers all come
/// through here (`http::handler`).
pub fn start(req: &Request, resp: &mut Response) {
    if req.conf.gunzip.on != Some(true) {
        return;
    }
    let gzip = resp.headers.iter().any(|(n, v)| {
        n.eq_ignore_ascii_case("content-encoding") && v.as_bytes().eq_ignore_ascii_case(b"gzip")
    });
    if !gzip {
        return;
    }
    if req.conf.compress.vary() {
        add_vary(resp);
    }
    let mut only_gzip = [false; 3];
    only_gzip[Coding::Gzip as usize] = true;
    // A subrequest's answer goes into the main one as it is: always inflated (nginx's
    // gzip_ok never holds for a subrequest), whatever the client accepts.
    if !req.subrequest
        && !client_refuses(req, resp)
        && negotiate(accept_encoding(req), &only_gzip).is_some()
    {
        return;
    }
    resp.headers.retain(|(n, _)| {
        !n.eq_ignore_ascii_case("content-encoding")
            && !n.eq_ignore_ascii_case("content-length")
            && !n.eq_ignore_ascii_case("accept-ranges")
    });
    resp.content_length = None;
    resp.length_unknown = true;
    resp.accept_ranges = false;
    resp.weak_etag();
    resp.rewrites().gunzip = true;
}

/// The inflater of one answer's body.
pub struct Stream {
    dec: Option<flate2::write::MultiGzDecoder<Vec<u8>>>,
}

impl Default for Stream {
    fn default() -> Self {
        Stream {
            dec: Some(flate2::write::MultiGzDecoder::new(Vec::new())),
        }
    }
}

impl Stream {
    pub fn ended(&self) -> bool {
        self.dec.is_none()
    }

    /// Inflate `piece` (the last one when `last`): what came out, or the error.
    pub fn feed(&mut self, piece: &[u8], last: bool) -> std::io::Result<Vec<u8>> {
        let Some(dec) = &mut self.dec else {
            return Ok(Vec::new());
        };
        dec.write_all(piece)?;
        if last {
            let dec = self.dec.take().map(|d| d.finish());
            return dec.unwrap_or_else(|| Ok(Vec::new()));
        }
        Ok(std::mem::take(dec.get_mut()))
    }
}

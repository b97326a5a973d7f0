//! The HTTP/2 directives (`conn::h2` serves the connections): `http2`,
//! `http2_max_concurrent_streams`, `http2_chunk_size`, `http2_body_preread_size`, and the
//! older `http2_max_field_size` / `http2_max_header_size` (header list cap), all http or
//! server level but `http2_chunk_size`, which as in nginx a location may set too (it sizes
//! each stream's DATA frames). (`listen ... http2` is in `config::listen`.)

use super::{inherit, LoadCtx, LocConf};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};

const HS: Ctx = Ctx(Ctx::HTTP.0 | Ctx::SERVER.0);

const fn spec(name: &'static str) -> Spec {
    spec_in(name, HS)
}

const fn spec_in(name: &'static str, ctx: Ctx) -> Spec {
    Spec {
        name,
        ctx,
        args: Args::Exactly(1),
        block: false,
    }
}

pub const DIRECTIVES: &[Spec] = &[
    spec("http2"),
    spec("http2_max_concurrent_streams"),
    spec_in("http2_chunk_size", Ctx::HSL),
    spec("http2_body_preread_size"),
    spec("http2_max_field_size"),
    spec("http2_max_header_size"),
];

#[derive(Debug, Clone, Default)]
pub struct Http2Conf {
    pub enable: Option<bool>,
    pub max_concurrent_streams: Option<u32>,
    pub chunk_size: Option<u32>,
    pub body_preread_size: Option<u32>,
    pub max_header_size: Option<u32>,
}

/// The largest frame HTTP/2 allows (RFC 9113 4.2), nginx's NGX_HTTP_V2_MAX_FRAME_SIZE.
const MAX_FRAME: u64 = (1 << 24) - 1;

/// The largest flow-control window HTTP/2 allows (RFC 9113 6.9.1).
const MAX_WINDOW: u64 = (1 << 31) - 1;

impl Http2Conf {
    pub fn merge(&mut self, parent: &Http2Conf) {
        inherit!(
            self,
            parent,
            enable,
            max_concurrent_streams,
            chunk_size,
            body_preread_size,
            max_header_size,
        );
    }

    pub fn enabled(&self) -> bool {
        self.enable.unwrap_or(false)
    }

    /// nginx's default: 128.
    pub fn max_concurrent_streams(&self) -> u32 {
        self.max_concurrent_streams.unwrap_or(128)
    }

    /// The most DATA sent per frame. 16k by default, not nginx's 8k: the h2 codec writes
    /// and flushes one DATA frame at a time, so each frame is its own socket write (and
    /// over TLS its own record); frames of 16k, the largest a client accepts unless it says
    /// otherwise, halve those writes. A 394 KB file over TLS took 0.75x nginx's CPU per
    /// request with 16k frames and 1.2-1.5x with 8k (docs/bench/adhoc/tls).
    pub fn chunk_size(&self) -> u32 {
        self.chunk_size.unwrap_or(16 * 1024)
    }

    /// A stream's initial receive window: what a client may send of a body before it is
    /// read (nginx's default 64k). nginx's 0 (nothing before the body is read, the window
    /// opened then) is one byte here: the h2 crate cannot open a stream's window past its
    /// initial size, so at 0 a body could never come; at 1 it comes a byte per window
    /// update (docs/testing.md, known differences).
    pub fn body_preread_size(&self) -> u32 {
        self.body_preread_size.unwrap_or(64 * 1024).max(1)
    }

    /// The header list cap (decoded names and values plus 32 bytes each, RFC 9113 6.5.2),
    /// `None` for the caller's default.
    pub fn max_header_size(&self) -> Option<u32> {
        self.max_header_size
    }
}

fn size(d: &Directive, max: u64) -> Result<u32, ConfError> {
    let n = setters::size_arg(d, 0)?;
    if n == 0 || n > max {
        return Err(d.error(format!("\"{}\" must be between 1 and {max}", d.name)));
    }
    Ok(n as u32)
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.http2;
    match d.name.as_str() {
        "http2" => c.enable = Some(setters::flag(d)?),
        "http2_max_concurrent_streams" => {
            let n = setters::num_arg(d, 0)?;
            c.max_concurrent_streams = Some(u32::try_from(n).unwrap_or(u32::MAX));
        }
        // As nginx, a size past the largest frame HTTP/2 has (2^24-1) is cut to it, and 0 is
        // refused. Frames are cut to the client's SETTINGS_MAX_FRAME_SIZE too (16k unless
        // it says more), by the codec.
        "http2_chunk_size" => {
            let n = setters::size_arg(d, 0)?;
            if n == 0 {
                return Err(d.error("the http2 chunk size cannot be zero".to_string()));
            }
            c.chunk_size = Some(n.min(MAX_FRAME) as u32);
        }
        // As nginx: 0 (no preread: a stream's window opens only when its body is read) up
        // to the largest window.
        "http2_body_preread_size" => {
            let n = setters::size_arg(d, 0)?;
            if n > MAX_WINDOW {
                return Err(d.error(format!(
                    "the maximum body preread buffer size is {MAX_WINDOW}"
                )));
            }
            c.body_preread_size = Some(n as u32);
        }
        "http2_max_field_size" | "http2_max_header_size" => {
            c.max_header_size = Some(size(d, u64::from(u32::MAX))?)
        }
        _ => return Err(d.error(format!("unknown directive \"{}\"", d.name))),
    }
    Ok(())
}

//! MP4 pseudo-streaming (nginx's ngx_http_mp4_module): `mp4;` makes a location's files
//! answerable from a time, `?start=SECONDS` (and to one, `?end=SECONDS`): the answer is a
//! new MP4 file whose `moov` box has every track's sample tables cut to the samples from
//! `start` (mp4_start_key_frame: from the key frame before it) and whose `mdat` holds only
//! their bytes, chunk offsets moved to match. Without a usable `start`/`end` the file is
//! served as it is. Like nginx's, this is the location's content handler: set in the
//! location itself, not inherited. The box reading and the cut are in `mp4/`.

mod moov;
mod tables;

use super::static_files;
use super::{inherit, LoadCtx, LocConf};
use crate::errlog::Level;
use crate::http::flow::Flow;
use crate::http::request::Request;
use crate::http::response::{Body, FileRange, Part};
use crate::runtime::worker::Worker;
use bytes::Bytes;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use std::fs::File;
use std::os::unix::fs::FileExt;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "mp4",
        ctx: Ctx::LOCATION,
        args: Args::Exactly(0),
        block: false,
    },
    Spec {
        name: "mp4_buffer_size",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "mp4_max_buffer_size",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "mp4_start_key_frame",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
];

#[derive(Debug, Clone, Default)]
pub struct Mp4Conf {
    /// `mp4`: this location's content handler (not inherited).
    pub on: bool,
    pub buffer_size: Option<u64>,
    pub max_buffer_size: Option<u64>,
    pub start_key_frame: Option<bool>,
}

impl Mp4Conf {
    pub fn merge(&mut self, p: &Mp4Conf) {
        inherit!(self, p, buffer_size, max_buffer_size, start_key_frame);
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.mp4;
    let dup = || Err(d.error(format!("\"{}\" directive is duplicate", d.name)));
    match d.name.as_str() {
        "mp4" => c.on = true,
        "mp4_buffer_size" => {
            if c.buffer_size.is_some() {
                return dup();
            }
            c.buffer_size = Some(setters::size_arg(d, 0)?);
        }
        "mp4_max_buffer_size" => {
            if c.max_buffer_size.is_some() {
                return dup();
            }
            c.max_buffer_size = Some(setters::size_arg(d, 0)?);
        }
        _ => {
            if c.start_key_frame.is_some() {
                return dup();
            }
            c.start_key_frame = Some(setters::flag(d)?);
        }
    }
    Ok(())
}

/// nginx's ngx_http_mp4_atofp(value, 3): seconds with any number of decimals, in
/// milliseconds (digits past the third after the dot are checked but dropped).
fn millis(v: &str) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    let (mut value, mut point, mut dot) = (0i64, 3u32, false);
    for b in v.bytes() {
        if b == b'.' {
            if dot {
                return None;
            }
            dot = true;
            continue;
        }
        if !b.is_ascii_digit() {
            return None;
        }
        if point == 0 {
            continue;
        }
        value = value.checked_mul(10)?.checked_add(i64::from(b - b'0'))?;
        if dot {
            point -= 1;
        }
    }
    for _ in 0..point {
        value = value.checked_mul(10)?;
    }
    u64::try_from(value).ok()
}

struct FileSrc<'a>(&'a File);

impl moov::Source for FileSrc<'_> {
    fn read(&self, offset: u64, len: usize) -> Option<Vec<u8>> {
        let mut v = vec![0; len];
        self.0.read_exact_at(&mut v, offset).ok()?;
        Some(v)
    }
}

struct MemSrc<'a>(&'a [u8]);

impl moov::Source for MemSrc<'_> {
    fn read(&self, offset: u64, len: usize) -> Option<Vec<u8>> {
        let from = usize::try_from(offset).ok()?;
        Some(self.0.get(from..from.checked_add(len)?)?.to_vec())
    }
}

/// nginx's `ngx_http_mp4_handler`.
pub fn handle(req: &Request, w: &Worker) -> Flow {
    let f = match static_files::open_media(req, w) {
        Ok(f) => f,
        Err(flow) => return *flow,
    };
    let mut r = static_files::file_response(req, &f);
    // `start` and `end` as nginx reads them: a bad value counts as absent; an `end` alone
    // starts at 0; an `end` at or before `start` cuts nothing off the end.
    let mut start = req.arg("start").and_then(millis);
    let mut length = 0;
    if let Some(end) = req.arg("end").and_then(millis) {
        if end > 0 {
            let s = *start.get_or_insert(0);
            if end > s {
                length = end - s;
            }
        }
    }
    let Some(start) = start else {
        return Flow::Done(r);
    };
    r.single_range = true;
    let c = &req.conf.mp4;
    let params = moov::Params {
        start,
        length,
        start_key_frame: c.start_key_frame.unwrap_or(false),
        buffer_size: c.buffer_size.unwrap_or(512 * 1024),
        max_buffer_size: c.max_buffer_size.unwrap_or(10 * 1024 * 1024),
    };
    let path = req.filename_for(&req.uri);
    let name = path.to_string_lossy();
    let done = match &f.data {
        Some(d) => moov::process(&MemSrc(d), f.size, &name, &params),
        None => moov::process(&FileSrc(&f.file), f.size, &name, &params),
    };
    match done {
        Ok(moov::Outcome::Whole) => {}
        Ok(moov::Outcome::Cut {
            head,
            mdat: (from, to),
        }) => {
            let len = head.len() as u64 + (to - from);
            let data = match &f.data {
                Some(d) => usize::try_from(from)
                    .ok()
                    .zip(usize::try_from(to).ok())
                    .and_then(|(a, b)| (a <= b && b <= d.len()).then(|| d.slice(a..b)))
                    .map(Part::Bytes),
                None => Some(Part::File(FileRange {
                    file: f.file.clone(),
                    offset: from,
                    len: to - from,
                })),
            };
            let Some(data) = data else {
                return Flow::Status(500);
            };
            r.body = Body::Parts(vec![Part::Bytes(Bytes::from(head)), data]);
            // Compressed copies are of the whole file.
            r.variants = None;
            // nginx makes the ETag from the answer's length, not the file's.
            if r.etag.is_some() {
                r.etag = Some(static_files::etag(f.mtime_secs, len).into());
            }
        }
        Err(msg) => {
            crate::errlog::request(Level::Error, req, format_args!("{msg}"));
            return Flow::Status(500);
        }
    }
    Flow::Done(r)
}

#[cfg(test)]
mod tests {
    use super::millis;

    #[test]
    fn start_values_read_as_nginx() {
        assert_eq!(millis("2"), Some(2000));
        assert_eq!(millis("2.5"), Some(2500));
        assert_eq!(millis("0.0015"), Some(1));
        assert_eq!(millis(".5"), Some(500));
        assert_eq!(millis("1.2.3"), None);
        assert_eq!(millis("-1"), None);
        assert_eq!(millis(""), None);
        assert_eq!(millis("99999999999999999999"), None);
    }
}

//! The compressors behind `http::compress`: gzip (flate2 on the pure-Rust zlib-rs backend),
//! Brotli (the `brotli` crate) and zstd (the `zstd` crate, libzstd). One type for the three,
//! fed piece by piece for streamed answers, or given a whole body at once.
//!
//! Output accumulates in a `Vec` that [`Encoder::take`] drains, so a streamed answer is sent
//! as it is compressed without an extra copy per piece.

use crate::modules::compress::Coding;
use std::io::{self, Write};

/// The length of the gzip header flate2 writes (no name, no extra fields).
const GZIP_HEADER: usize = 10;

/// Brotli's window as ngx_brotli's default `brotli_window 512k` (2^19).
const BROTLI_LGWIN: u32 = 19;

pub enum Encoder {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Br(Box<brotli::CompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl Encoder {
    pub fn new(coding: Coding, level: u32) -> io::Result<Encoder> {
        Ok(match coding {
            Coding::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                flate2::Compression::new(gzip_level(level)),
            )),
            Coding::Br => Encoder::Br(Box::new(brotli::CompressorWriter::new(
                Vec::new(),
                16 * 1024,
                level,
                BROTLI_LGWIN,
            ))),
            Coding::Zstd => {
                Encoder::Zstd(zstd::stream::write::Encoder::new(Vec::new(), level as i32)?)
            }
        })
    }

    /// Compress `data`; what is ready appears in [`take`](Self::take).
    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Encoder::Gzip(e) => e.write_all(data),
            Encoder::Br(e) => e.write_all(data),
            Encoder::Zstd(e) => e.write_all(data),
        }
    }

    /// Emit everything written so far in a form the client can decode now (a sync flush):
    /// used when an application's answer pauses, so what it said is not held back.
    pub fn flush(&mut self) -> io::Result<()> {
        match self {
            Encoder::Gzip(e) => e.flush(),
            Encoder::Br(e) => e.flush(),
            Encoder::Zstd(e) => e.flush(),
        }
    }

    /// The compressed bytes produced so far. gzip's 10-byte header alone is held back
    /// until compressed bytes follow it: a short answer then goes out in one piece (one
    /// chunk), as nginx's zlib output does, not its header in a chunk of its own.
    pub fn take(&mut self) -> Vec<u8> {
        let out = match self {
            Encoder::Gzip(e) => {
                let out = e.get_mut();
                if out.len() == GZIP_HEADER && out.starts_with(&[0x1f, 0x8b, 0x08]) {
                    return Vec::new();
                }
                out
            }
            Encoder::Br(e) => e.get_mut(),
            Encoder::Zstd(e) => e.get_mut(),
        };
        std::mem::take(out)
    }

    /// End the stream; returns the last compressed bytes.
    pub fn finish(self) -> io::Result<Vec<u8>> {
        match self {
            Encoder::Gzip(e) => e.finish(),
            Encoder::Br(e) => Ok(e.into_inner()),
            Encoder::Zstd(e) => e.finish(),
        }
    }
}

/// zlib-rs's level 1 is zlib-ng's "quick" strategy, whose output is about a third larger
/// than zlib's level 1 (what nginx sends at `gzip_comp_level 1`); its level 2 matches zlib's
/// level-1 size at about zlib's level-1 speed. So level 1 is given level 2's strategy: an
/// admin who set level 1 gets nginx's bytes per reply, not more.
fn gzip_level(level: u32) -> u32 {
    level.max(2)
}

/// Compress a whole body.
pub fn compress(coding: Coding, level: u32, data: &[u8]) -> io::Result<Vec<u8>> {
    if coding == Coding::Zstd {
        // The one-shot form writes the content size into the frame header.
        return zstd::bulk::compress(data, level as i32);
    }
    let mut e = Encoder::new(coding, level)?;
    e.write(data)?;
    let mut out = e.take();
    out.extend_from_slice(&e.finish()?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// A short gzip answer comes out in one piece: the header waits for the data.
    #[test]
    fn gzip_header_waits_for_the_data() {
        let mut e = Encoder::new(Coding::Gzip, 1).unwrap();
        e.write(b"SEE-THIS").unwrap();
        assert!(e.take().is_empty());
        let whole = e.finish().unwrap();
        assert!(whole.starts_with(&[0x1f, 0x8b, 0x08]));
        let mut text = String::new();
        flate2::read::GzDecoder::new(&whole[..])
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "SEE-THIS");
        // Once data follows, the header goes with it.
        let mut e = Encoder::new(Coding::Gzip, 1).unwrap();
        e.write(b"SEE-THIS").unwrap();
        e.flush().unwrap();
        assert!(e.take().len() > GZIP_HEADER);
    }
}

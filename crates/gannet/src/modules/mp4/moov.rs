//! The `moov` rewrite of nginx's ngx_http_mp4_module: read the file's top-level boxes
//! (`ftyp`, `moov`, `mdat`), cut every track's sample tables (stts, stss, ctts, stsc, stsz,
//! stco/co64) to the samples from `start` (and up to `start + length`), and give back the
//! new file's head (ftyp + moov + mdat header) and the byte range of `mdat` that follows.
//! The steps, their order and their arithmetic are nginx's (1.22), so the bytes are the
//! same; where nginx would read past a table of a malformed file, this stops with an error.
//! Every error is the message nginx logs (the answer is then a 500).

use super::tables::Trak;

/// What the request asks for, and the location's limits.
pub struct Params {
    /// `start`, in milliseconds.
    pub start: u64,
    /// `end - start`, in milliseconds; 0: to the end.
    pub length: u64,
    pub start_key_frame: bool,
    pub buffer_size: u64,
    pub max_buffer_size: u64,
}

pub enum Outcome {
    /// Serve the file as it is (nginx's NGX_DECLINED: moov before mdat and no cut asked).
    Whole,
    /// The new file: `head`, then the file's bytes `mdat.0..mdat.1`.
    Cut { head: Vec<u8>, mdat: (u64, u64) },
}

/// Where the file's bytes come from.
pub trait Source {
    /// Exactly `len` bytes at `offset`; `None` if the file is shorter or unreadable.
    fn read(&self, offset: u64, len: usize) -> Option<Vec<u8>>;
}

/// A failure: nginx's log line (the file's name is put in by the caller's format).
pub type Fail = String;

pub(super) fn be32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map_or(0, |s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}
pub(super) fn be64(b: &[u8], at: usize) -> u64 {
    (u64::from(be32(b, at)) << 32) | u64::from(be32(b, at + 4))
}
pub(super) fn set32(b: &mut [u8], at: usize, v: u32) {
    if let Some(s) = b.get_mut(at..at + 4) {
        s.copy_from_slice(&v.to_be_bytes());
    }
}
pub(super) fn set64(b: &mut [u8], at: usize, v: u64) {
    if let Some(s) = b.get_mut(at..at + 8) {
        s.copy_from_slice(&v.to_be_bytes());
    }
}

/// A box read whole: an 8-byte header (as nginx rewrites it) and its data.
pub(super) fn boxed(name: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + data.len());
    v.extend_from_slice(&((8 + data.len()) as u32).to_be_bytes());
    v.extend_from_slice(name);
    v.extend_from_slice(data);
    v
}

pub(super) struct State<'a> {
    pub name: &'a str,
    pub p: &'a Params,
    pub end: u64,
    pub timescale: u32,
    pub mvhd: Option<Vec<u8>>,
    pub traks: Vec<Trak>,
    pub mdat_last: Option<u64>,
}

impl State<'_> {
    pub fn fail(&self, what: &str) -> Fail {
        format!("{what} in \"{}\"", self.name)
    }
    pub fn fail_pre(&self, what: &str) -> Fail {
        format!("\"{}\" mp4 {what}", self.name)
    }
}

/// What is done with one box (its name and payload): `Ok(false)` stops the level (a track
/// that ends before the start).
pub(super) type BoxFn<'f> = dyn FnMut(&mut State, [u8; 4], &[u8]) -> Result<bool, Fail> + 'f;

/// One level of boxes inside `data`: calls `f(state, name, payload)` for each, as nginx's
/// ngx_http_mp4_read_atom (a size 0 ends the level; 1 is a 64-bit size).
pub(super) fn each_box(st: &mut State, data: &[u8], f: &mut BoxFn) -> Result<bool, Fail> {
    let mut pos = 0usize;
    while pos < data.len() {
        if data.len() - pos < 4 {
            return Err(st.fail_pre("file truncated"));
        }
        let mut size = u64::from(be32(data, pos));
        let mut hdr = 8usize;
        if size == 0 {
            return Ok(true);
        }
        if data.len() - pos < 8 {
            return Err(st.fail_pre("file truncated"));
        }
        if size < 8 {
            if size != 1 || data.len() - pos < 16 {
                return Err(st.fail_pre(&format!("atom is too small:{size}")));
            }
            size = be64(data, pos + 8);
            hdr = 16;
            if size < 16 {
                return Err(st.fail_pre(&format!("atom is too small:{size}")));
            }
        }
        if size > (data.len() - pos) as u64 {
            return Err(st.fail_pre(&format!("atom too large:{size}")));
        }
        let name = [data[pos + 4], data[pos + 5], data[pos + 6], data[pos + 7]];
        let payload = &data[pos + hdr..pos + size as usize];
        if !f(st, name, payload)? {
            // NGX_DECLINED: this level stops here.
            return Ok(false);
        }
        pos += size as usize;
    }
    Ok(true)
}

/// nginx's ngx_http_mp4_process.
pub fn process(src: &dyn Source, size: u64, name: &str, p: &Params) -> Result<Outcome, Fail> {
    let mut st = State {
        name,
        p,
        end: size,
        timescale: 0,
        mvhd: None,
        traks: Vec::new(),
        mdat_last: None,
    };
    let mut ftyp: Option<Vec<u8>> = None;
    let mut moov_seen = false;
    let mut off = 0u64;
    let truncated = || format!("\"{name}\" mp4 file truncated");
    while off < size {
        let h = src
            .read(off, 8.min((size - off) as usize))
            .ok_or_else(truncated)?;
        if h.len() < 4 {
            return Err(truncated());
        }
        let mut asize = u64::from(be32(&h, 0));
        let mut hdr = 8u64;
        if asize == 0 {
            break;
        }
        if asize < 8 {
            if asize != 1 {
                return Err(st.fail_pre(&format!("atom is too small:{asize}")));
            }
            let h16 = src.read(off, 16).ok_or_else(truncated)?;
            asize = be64(&h16, 8);
            hdr = 16;
            if asize < 16 {
                return Err(st.fail_pre(&format!("atom is too small:{asize}")));
            }
        }
        if h.len() < 8 {
            return Err(truncated());
        }
        if asize > size - off {
            return Err(st.fail_pre(&format!("atom too large:{asize}")));
        }
        let data_off = off + hdr;
        let data_size = asize - hdr;
        match &h[4..8] {
            b"ftyp" => {
                if data_size > 1024 {
                    return Err(st.fail_pre(&format!("ftyp atom is too large:{data_size}")));
                }
                if ftyp.is_some() {
                    return Err(st.fail("duplicate mp4 ftyp atom"));
                }
                let d = src
                    .read(data_off, data_size as usize)
                    .ok_or_else(truncated)?;
                ftyp = Some(boxed(b"ftyp", &d));
            }
            b"moov" => {
                let no_mdat = st.mdat_last.is_none();
                if no_mdat && p.start == 0 && p.length == 0 {
                    return Ok(Outcome::Whole);
                }
                if moov_seen {
                    return Err(st.fail("duplicate mp4 moov atom"));
                }
                if data_size > p.buffer_size && data_size > p.max_buffer_size {
                    return Err(format!(
                        "\"{name}\" mp4 moov atom is too large:{data_size}, you may want to increase mp4_max_buffer_size"
                    ));
                }
                moov_seen = true;
                let d = src
                    .read(data_off, data_size as usize)
                    .ok_or_else(truncated)?;
                super::tables::read_moov(&mut st, &d)?;
                if !no_mdat {
                    break;
                }
            }
            b"mdat" => {
                if st.mdat_last.is_some() {
                    return Err(st.fail("duplicate mp4 mdat atom"));
                }
                st.mdat_last = Some(data_off + data_size);
                if !st.traks.is_empty() {
                    break;
                }
            }
            _ => {}
        }
        off += asize;
    }
    if st.traks.is_empty() {
        return Err(st.fail("no mp4 trak atoms were found"));
    }
    let Some(mdat_last) = st.mdat_last else {
        return Err(st.fail("no mp4 mdat atom was found"));
    };
    let ftyp = ftyp.unwrap_or_default();
    let mut moov_size = 8u64;
    if let Some(m) = &st.mvhd {
        moov_size += m.len() as u64;
    }
    let mut start_offset = size;
    let mut end_offset = 0u64;
    let mut traks = std::mem::take(&mut st.traks);
    for t in traks.iter_mut() {
        t.update(&st, mdat_last)?;
        moov_size += t.size;
        start_offset = start_offset.min(t.start_offset);
        end_offset = end_offset.max(t.end_offset);
    }
    if end_offset < start_offset {
        end_offset = start_offset;
    }
    if start_offset > mdat_last {
        return Err(st.fail("start time is out mp4 mdat atom"));
    }
    let data_size = end_offset - start_offset;
    let mut mdat_hdr = Vec::with_capacity(16);
    if data_size > 0xffff_ffff - 8 {
        mdat_hdr.extend_from_slice(&1u32.to_be_bytes());
        mdat_hdr.extend_from_slice(b"mdat");
        mdat_hdr.extend_from_slice(&(16 + data_size).to_be_bytes());
    } else {
        mdat_hdr.extend_from_slice(&((8 + data_size) as u32).to_be_bytes());
        mdat_hdr.extend_from_slice(b"mdat");
    }
    let adjustment = (ftyp.len() as u64)
        .wrapping_add(moov_size)
        .wrapping_add(mdat_hdr.len() as u64)
        .wrapping_sub(start_offset);
    let mut head = Vec::with_capacity((ftyp.len() as u64 + moov_size) as usize + 16);
    head.extend_from_slice(&ftyp);
    head.extend_from_slice(&(moov_size as u32).to_be_bytes());
    head.extend_from_slice(b"moov");
    if let Some(m) = &st.mvhd {
        head.extend_from_slice(m);
    }
    for t in traks.iter_mut() {
        t.adjust(adjustment);
        t.write(&mut head);
    }
    head.extend_from_slice(&mdat_hdr);
    Ok(Outcome::Cut {
        head,
        mdat: (start_offset, end_offset),
    })
}

/// nginx's mvhd handling: the movie's timescale, and its duration cut to the new length.
pub(super) fn read_mvhd(st: &mut State, d: &[u8]) -> Result<(), Fail> {
    if st.mvhd.is_some() {
        return Err(st.fail("duplicate mp4 mvhd atom"));
    }
    let v1 = d.first().is_some_and(|&v| v != 0);
    let need = if v1 { 112 } else { 100 };
    if d.len() < need {
        return Err(st.fail_pre("mvhd atom too small"));
    }
    // Offsets within the payload (after the 8-byte header).
    let (ts_at, dur_at) = if v1 { (20, 24) } else { (12, 16) };
    let timescale = be32(d, ts_at);
    let mut duration = if v1 {
        be64(d, dur_at)
    } else {
        u64::from(be32(d, dur_at))
    };
    st.timescale = timescale;
    let start_time = st.p.start.wrapping_mul(u64::from(timescale)) / 1000;
    if duration < start_time {
        return Err(st.fail_pre("start time exceeds file duration"));
    }
    duration -= start_time;
    if st.p.length > 0 {
        let len = st.p.length.wrapping_mul(u64::from(timescale)) / 1000;
        duration = duration.min(len);
    }
    let mut b = boxed(b"mvhd", d);
    if v1 {
        set64(&mut b, 8 + dur_at, duration);
    } else {
        set32(&mut b, 8 + dur_at, duration as u32);
    }
    st.mvhd = Some(b);
    Ok(())
}

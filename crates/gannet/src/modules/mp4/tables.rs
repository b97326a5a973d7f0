//! One track of the `moov` rewrite: its boxes as read, the cut of its sample tables (nginx's
//! ngx_http_mp4_crop_*_data and update_*_atom, in the same order and with the same integer
//! widths) and the writing of the new `trak`.

use super::moov::{be32, be64, boxed, each_box, read_mvhd, set32, set64, Fail, State};

/// A table with the window (`pos..last`) nginx keeps of it.
#[derive(Default)]
struct Table<T> {
    /// The box's version and flags.
    vf: [u8; 4],
    rows: Vec<T>,
    pos: usize,
    last: usize,
}

impl<T: Copy> Table<T> {
    fn new(vf: [u8; 4], rows: Vec<T>) -> Self {
        let last = rows.len();
        Table {
            vf,
            rows,
            pos: 0,
            last,
        }
    }
    fn live(&self) -> &[T] {
        self.rows.get(self.pos..self.last).unwrap_or(&[])
    }
    fn width(&self) -> usize {
        self.last.saturating_sub(self.pos)
    }
}

pub type Stsc = [u32; 3];

#[derive(Default)]
pub struct Trak {
    tkhd: Option<Vec<u8>>,
    movie_duration: u64,
    mdia: bool,
    mdhd: Option<(Vec<u8>, bool)>,
    timescale: u32,
    duration: u64,
    hdlr: Option<Vec<u8>>,
    minf: bool,
    vmhd: Option<Vec<u8>>,
    smhd: Option<Vec<u8>>,
    dinf: Option<Vec<u8>>,
    stbl: bool,
    stsd: Option<Vec<u8>>,
    stts: Option<Table<[u32; 2]>>,
    stts_entries: u32,
    stss: Option<Table<u32>>,
    stss_data: bool,
    sync_entries: u32,
    ctts: Option<Table<[u32; 2]>>,
    ctts_entries: u32,
    stsc: Option<Table<Stsc>>,
    stsc_entries: u32,
    stsc_start: Option<Stsc>,
    stsc_end: Option<Stsc>,
    /// stsz: the 20-byte header as read, and the sizes unless they are all one.
    stsz: Option<(Vec<u8>, Option<Table<u32>>)>,
    sizes_entries: u32,
    /// stco (false) or co64 (true), offsets widened to 64 bits.
    chunk_offsets: Option<(bool, Table<u64>)>,
    chunks: u32,
    start_sample: u64,
    end_sample: u64,
    start_chunk: u64,
    end_chunk: u64,
    start_chunk_samples: u64,
    end_chunk_samples: u64,
    start_chunk_samples_size: u64,
    end_chunk_samples_size: u64,
    prefix: u64,
    pub size: u64,
    pub start_offset: u64,
    pub end_offset: u64,
    stbl_size: u64,
    minf_size: u64,
    mdia_size: u64,
    trak_size: u64,
}

fn dup(st: &State, what: &str) -> Fail {
    st.fail(&format!("duplicate mp4 {what} atom"))
}

fn vf(d: &[u8]) -> [u8; 4] {
    [d[0], d[1], d[2], d[3]]
}

/// The entries of a table box (`hdr` bytes of payload before them), checked as nginx's.
fn rows<T>(
    st: &State,
    d: &[u8],
    hdr: usize,
    width: usize,
    what: &str,
    get: impl Fn(&[u8]) -> T,
) -> Result<([u8; 4], Vec<T>), Fail> {
    if d.len() < hdr {
        return Err(st.fail_pre(&format!("{what} atom too small")));
    }
    let entries = be32(d, hdr - 4) as usize;
    if (hdr as u64) + (entries as u64) * (width as u64) > d.len() as u64 {
        return Err(st.fail_pre(&format!("{what} atom too small")));
    }
    let rows = d[hdr..hdr + entries * width]
        .chunks_exact(width)
        .map(get)
        .collect();
    Ok((vf(d), rows))
}

pub(super) fn read_moov(st: &mut State, d: &[u8]) -> Result<(), Fail> {
    each_box(st, d, &mut |st, name, d| {
        match &name {
            b"mvhd" => read_mvhd(st, d)?,
            b"trak" => {
                st.traks.push(Trak::default());
                if !each_box(st, d, &mut read_trak)? {
                    // A track that ends before `start`: left out.
                    st.traks.pop();
                }
            }
            b"cmov" => {
                return Err(st.fail_pre("compressed moov atom (cmov) is not supported"));
            }
            _ => {}
        }
        Ok(true)
    })
    .map(|_| ())
}

/// The duration of a tkhd/mdhd cut to the new start and length; `None`: the track ends first.
fn cut_duration(st: &State, duration: u64, timescale: u32) -> Option<u64> {
    let start_time = st.p.start.wrapping_mul(u64::from(timescale)) / 1000;
    if duration <= start_time {
        return None;
    }
    let mut d = duration - start_time;
    if st.p.length > 0 {
        d = d.min(st.p.length.wrapping_mul(u64::from(timescale)) / 1000);
    }
    Some(d)
}

fn last<'s>(st: &'s mut State) -> &'s mut Trak {
    // read_trak runs only after a push.
    let n = st.traks.len() - 1;
    &mut st.traks[n]
}

fn read_trak(st: &mut State, name: [u8; 4], d: &[u8]) -> Result<bool, Fail> {
    match &name {
        b"tkhd" => {
            let v1 = d.first().is_some_and(|&v| v != 0);
            if d.len() < if v1 { 96 } else { 84 } {
                return Err(st.fail_pre("tkhd atom too small"));
            }
            let at = if v1 { 28 } else { 20 };
            let dur = if v1 {
                be64(d, at)
            } else {
                u64::from(be32(d, at))
            };
            let Some(dur) = cut_duration(st, dur, st.timescale) else {
                return Ok(false);
            };
            if last(st).tkhd.is_some() {
                return Err(dup(st, "tkhd"));
            }
            let mut b = boxed(b"tkhd", d);
            if v1 {
                set64(&mut b, 8 + at, dur);
            } else {
                set32(&mut b, 8 + at, dur as u32);
            }
            let t = last(st);
            t.movie_duration = dur;
            t.tkhd = Some(b);
        }
        b"mdia" => {
            if last(st).mdia {
                return Err(dup(st, "mdia"));
            }
            last(st).mdia = true;
            return each_box(st, d, &mut read_mdia);
        }
        _ => {}
    }
    Ok(true)
}

fn read_mdia(st: &mut State, name: [u8; 4], d: &[u8]) -> Result<bool, Fail> {
    match &name {
        b"mdhd" => {
            let v1 = d.first().is_some_and(|&v| v != 0);
            if d.len() < if v1 { 36 } else { 24 } {
                return Err(st.fail_pre("mdhd atom too small"));
            }
            let (ts_at, at) = if v1 { (20, 24) } else { (12, 16) };
            let timescale = be32(d, ts_at);
            let dur = if v1 {
                be64(d, at)
            } else {
                u64::from(be32(d, at))
            };
            let Some(dur) = cut_duration(st, dur, timescale) else {
                return Ok(false);
            };
            if last(st).mdhd.is_some() {
                return Err(dup(st, "mdhd"));
            }
            let t = last(st);
            t.timescale = timescale;
            t.duration = dur;
            t.mdhd = Some((boxed(b"mdhd", d), v1));
        }
        b"hdlr" => {
            if last(st).hdlr.is_some() {
                return Err(dup(st, "hdlr"));
            }
            last(st).hdlr = Some(boxed(b"hdlr", d));
        }
        b"minf" => {
            if last(st).minf {
                return Err(dup(st, "minf"));
            }
            last(st).minf = true;
            return each_box(st, d, &mut read_minf);
        }
        _ => {}
    }
    Ok(true)
}

fn read_minf(st: &mut State, name: [u8; 4], d: &[u8]) -> Result<bool, Fail> {
    match &name {
        b"vmhd" | b"smhd" => {
            let t = last(st);
            if t.vmhd.is_some() || t.smhd.is_some() {
                return Err(dup(st, "vmhd/smhd"));
            }
            let b = Some(boxed(&name, d));
            if &name == b"vmhd" {
                t.vmhd = b;
            } else {
                t.smhd = b;
            }
        }
        b"dinf" => {
            if last(st).dinf.is_some() {
                return Err(dup(st, "dinf"));
            }
            last(st).dinf = Some(boxed(b"dinf", d));
        }
        b"stbl" => {
            if last(st).stbl {
                return Err(dup(st, "stbl"));
            }
            last(st).stbl = true;
            return each_box(st, d, &mut read_stbl);
        }
        _ => {}
    }
    Ok(true)
}

fn read_stbl(st: &mut State, name: [u8; 4], d: &[u8]) -> Result<bool, Fail> {
    match &name {
        b"stsd" => {
            if d.len() < 16 {
                return Err(st.fail_pre("stsd atom too small"));
            }
            if last(st).stsd.is_some() {
                return Err(dup(st, "stsd"));
            }
            let b = boxed(b"stsd", d);
            let t = last(st);
            t.size += b.len() as u64;
            t.stsd = Some(b);
        }
        b"stts" | b"ctts" => {
            let what = if &name == b"stts" { "stts" } else { "ctts" };
            let (v, r) = rows(st, d, 8, 8, what, |e| [be32(e, 0), be32(e, 4)])?;
            let n = r.len() as u32;
            let t = last(st);
            let (slot, count) = if what == "stts" {
                (&mut t.stts, &mut t.stts_entries)
            } else {
                (&mut t.ctts, &mut t.ctts_entries)
            };
            if slot.is_some() {
                return Err(dup(st, what));
            }
            *slot = Some(Table::new(v, r));
            *count = n;
        }
        b"stss" => {
            let (v, r) = rows(st, d, 8, 4, "stss", |e| be32(e, 0))?;
            if last(st).stss.is_some() {
                return Err(dup(st, "stss"));
            }
            let t = last(st);
            t.sync_entries = r.len() as u32;
            t.stss = Some(Table::new(v, r));
            t.stss_data = true;
        }
        b"stsc" => {
            let (v, r) = rows(st, d, 8, 12, "stsc", |e| {
                [be32(e, 0), be32(e, 4), be32(e, 8)]
            })?;
            if last(st).stsc.is_some() {
                return Err(dup(st, "stsc"));
            }
            let t = last(st);
            t.stsc_entries = r.len() as u32;
            t.stsc = Some(Table::new(v, r));
        }
        b"stsz" => {
            if d.len() < 12 {
                return Err(st.fail_pre("stsz atom too small"));
            }
            if last(st).stsz.is_some() {
                return Err(dup(st, "stsz"));
            }
            let uniform = be32(d, 4);
            let entries = be32(d, 8);
            let mut hdr = boxed(b"stsz", &d[..12]);
            let table = if uniform == 0 {
                let (v, r) = rows(st, d, 12, 4, "stsz", |e| be32(e, 0))?;
                Some(Table::new(v, r))
            } else {
                // All samples of one size: the box is kept as it is.
                set32(&mut hdr, 0, (8 + d.len()) as u32);
                last(st).size += 8 + d.len() as u64;
                None
            };
            let t = last(st);
            t.sizes_entries = entries;
            t.stsz = Some((hdr, table));
        }
        b"stco" | b"co64" => {
            let wide = &name == b"co64";
            let (v, r) = if wide {
                rows(st, d, 8, 8, "co64", |e| be64(e, 0))?
            } else {
                rows(st, d, 8, 4, "stco", |e| u64::from(be32(e, 0)))?
            };
            if last(st).chunk_offsets.is_some() {
                return Err(dup(st, "stco/co64"));
            }
            let t = last(st);
            t.chunks = r.len() as u32;
            t.chunk_offsets = Some((wide, Table::new(v, r)));
        }
        _ => {}
    }
    Ok(true)
}

impl Trak {
    /// nginx's update sequence for one track (ngx_http_mp4_process's loop body).
    pub(super) fn update(&mut self, st: &State, mdat_last: u64) -> Result<(), Fail> {
        self.update_stts(st)?;
        self.update_stss(st);
        self.update_ctts(st);
        self.update_stsc(st)?;
        self.update_stsz(st)?;
        self.update_chunk_offsets(st, mdat_last)?;
        self.size += 8;
        self.stbl_size = self.size;
        self.size += 8
            + self.vmhd.as_ref().map_or(0, |b| b.len() as u64)
            + self.smhd.as_ref().map_or(0, |b| b.len() as u64)
            + self.dinf.as_ref().map_or(0, |b| b.len() as u64);
        self.minf_size = self.size;
        if let Some((b, v1)) = &mut self.mdhd {
            if *v1 {
                set64(b, 32, self.duration);
            } else {
                set32(b, 24, self.duration as u32);
            }
            self.size += b.len() as u64;
        }
        self.size += self.hdlr.as_ref().map_or(0, |b| b.len() as u64);
        self.size += 8;
        self.mdia_size = self.size;
        self.size += self.tkhd.as_ref().map_or(0, |b| b.len() as u64);
        if self.prefix != 0 {
            self.size += 8 + 36;
        }
        self.size += 8;
        self.trak_size = self.size;
        Ok(())
    }

    fn update_stts(&mut self, st: &State) -> Result<(), Fail> {
        if self.stts.is_none() {
            return Err(st.fail("no mp4 stts atoms were found"));
        }
        self.crop_stts(st, true)?;
        self.crop_stts(st, false)?;
        let w = self.stts.as_ref().map_or(0, |t| t.width());
        self.size += 16 + 8 * w as u64;
        Ok(())
    }

    /// nginx's ngx_http_mp4_crop_stts_data: find the sample at `start` (or `end`).
    fn crop_stts(&mut self, st: &State, start: bool) -> Result<(), Fail> {
        let ms = if start {
            st.p.start
        } else if st.p.length > 0 {
            st.p.length
        } else {
            return Ok(());
        };
        let mut start_time =
            (ms.wrapping_mul(u64::from(self.timescale)) / 1000).wrapping_add(self.prefix);
        let key = st.p.start_key_frame;
        let sync: Vec<u32> = match &self.stss {
            Some(t) if key && start => t.live().to_vec(),
            _ => Vec::new(),
        };
        let Some(tab) = self.stts.as_mut() else {
            return Ok(());
        };
        let mut entries = self.stts_entries;
        let mut start_sample: u64 = 0;
        let mut i = tab.pos;
        let mut found = None;
        while i < tab.last {
            let [count, duration] = tab.rows[i];
            if start_time < u64::from(count) * u64::from(duration) {
                start_sample += start_time / u64::from(duration);
                found = Some((count, duration, (start_time / u64::from(duration)) as u32));
                break;
            }
            start_sample += u64::from(count);
            start_time -= u64::from(count) * u64::from(duration);
            entries = entries.wrapping_sub(1);
            i += 1;
        }
        let Some((mut count, mut duration, mut rest)) = found else {
            if start {
                return Err(st.fail("start time is out mp4 stts samples"));
            }
            self.end_sample = self.start_sample + start_sample;
            return Ok(());
        };
        if start {
            // ngx_http_mp4_seek_key_frame: back to the last sync sample at or before.
            let mut key_prefix: u32 = 0;
            if key && self.stss_data {
                let s1 = (start_sample as u32).wrapping_add(1);
                for &sample in &sync {
                    if sample > s1 {
                        break;
                    }
                    key_prefix = s1.wrapping_sub(sample);
                }
            }
            if u64::from(key_prefix) > start_sample {
                return Err(st.fail("start time is out mp4 stts samples"));
            }
            start_sample -= u64::from(key_prefix);
            while rest < key_prefix {
                self.prefix = self
                    .prefix
                    .wrapping_add(u64::from(rest) * u64::from(duration));
                key_prefix -= rest;
                if i == tab.pos {
                    return Err(st.fail("start time is out mp4 stts samples"));
                }
                i -= 1;
                entries = entries.wrapping_add(1);
                [count, duration] = tab.rows[i];
                rest = count;
            }
            self.prefix = self
                .prefix
                .wrapping_add(u64::from(key_prefix) * u64::from(duration));
            self.duration = self.duration.wrapping_add(self.prefix);
            rest -= key_prefix;
            tab.rows[i][0] = count.wrapping_sub(rest);
            tab.pos = i;
            self.stts_entries = entries;
            self.start_sample = start_sample;
        } else {
            tab.rows[i][0] = rest;
            tab.last = i + 1;
            self.stts_entries = self.stts_entries.wrapping_sub(entries.wrapping_sub(1));
            self.end_sample = self.start_sample + start_sample;
        }
        Ok(())
    }

    fn update_stss(&mut self, st: &State) {
        if self.stss.is_none() {
            return;
        }
        self.crop_stss(true, false);
        self.crop_stss(false, st.p.length > 0);
        let start_sample = self.start_sample as u32;
        let Some(t) = self.stss.as_mut() else { return };
        if self.sync_entries != 0 {
            for i in t.pos..t.last.min(t.rows.len()) {
                t.rows[i] = t.rows[i].wrapping_sub(start_sample);
            }
        } else {
            self.stss_data = false;
        }
        self.size += 16 + 4 * t.width() as u64;
    }

    /// nginx's ngx_http_mp4_crop_stss_data: keep the sync samples from the start on (and
    /// before the end, when one was asked).
    fn crop_stss(&mut self, start: bool, length: bool) {
        let target = if start {
            (self.start_sample as u32).wrapping_add(1)
        } else if length {
            (self.end_sample as u32).wrapping_add(1)
        } else {
            return;
        };
        let Some(t) = self.stss.as_mut() else { return };
        let mut entries = self.sync_entries;
        let mut i = t.pos;
        while i < t.last {
            if t.rows[i] >= target {
                break;
            }
            entries = entries.wrapping_sub(1);
            i += 1;
        }
        if start {
            t.pos = i;
            self.sync_entries = entries;
        } else {
            t.last = i;
            self.sync_entries = self.sync_entries.wrapping_sub(entries);
        }
    }

    fn update_ctts(&mut self, st: &State) {
        if self.ctts.is_none() {
            return;
        }
        self.crop_ctts(st, true);
        self.crop_ctts(st, false);
        if self.ctts_entries == 0 {
            self.ctts = None;
            return;
        }
        let w = self.ctts.as_ref().map_or(0, |t| t.width());
        self.size += 16 + 8 * w as u64;
    }

    fn crop_ctts(&mut self, st: &State, start: bool) {
        let mut target = if start {
            (self.start_sample as u32).wrapping_add(1)
        } else if st.p.length > 0 {
            (self.end_sample.wrapping_sub(self.start_sample) as u32).wrapping_add(1)
        } else {
            return;
        };
        let Some(t) = self.ctts.as_mut() else { return };
        let mut entries = self.ctts_entries;
        let mut i = t.pos;
        while i < t.last {
            let count = t.rows[i][0];
            if target <= count {
                let rest = target - 1;
                if start {
                    t.rows[i][0] = count - rest;
                    t.pos = i;
                    self.ctts_entries = entries;
                } else {
                    t.rows[i][0] = rest;
                    t.last = i + 1;
                    self.ctts_entries = self.ctts_entries.wrapping_sub(entries.wrapping_sub(1));
                }
                return;
            }
            target -= count;
            entries = entries.wrapping_sub(1);
            i += 1;
        }
        if start {
            t.pos = t.last;
            self.ctts_entries = 0;
        }
    }

    fn update_stsc(&mut self, st: &State) -> Result<(), Fail> {
        if self.stsc.is_none() {
            return Err(st.fail("no mp4 stsc atoms were found"));
        }
        if self.stsc_entries == 0 {
            return Err(st.fail("zero number of entries in stsc atom"));
        }
        self.crop_stsc(st, true)?;
        self.crop_stsc(st, false)?;
        let start_chunk = self.start_chunk as u32;
        if let Some(t) = self.stsc.as_mut() {
            for i in t.pos..t.last.min(t.rows.len()) {
                t.rows[i][0] = t.rows[i][0].wrapping_sub(start_chunk);
            }
        }
        self.size += 16 + 12 * u64::from(self.stsc_entries);
        Ok(())
    }

    /// nginx's ngx_http_mp4_crop_stsc_data, with its 32-bit arithmetic.
    fn crop_stsc(&mut self, st: &State, start: bool) -> Result<(), Fail> {
        let mut entries = self.stsc_entries.wrapping_sub(1);
        let mut start_sample: u32;
        if start {
            start_sample = self.start_sample as u32;
        } else if st.p.length > 0 {
            start_sample = self.end_sample.wrapping_sub(self.start_sample) as u32;
            if let Some(first) = self.stsc_start.as_mut() {
                let mut samples = first[1];
                entries = entries.wrapping_sub(1);
                if samples > start_sample {
                    samples = start_sample;
                    first[1] = samples;
                }
                start_sample -= samples;
            }
        } else {
            return Ok(());
        }
        let out_of = || {
            st.fail(&format!(
                "{} time is out mp4 stsc chunks",
                if start { "start" } else { "end" }
            ))
        };
        let chunks = self.chunks;
        let Some(t) = self.stsc.as_mut() else {
            return Ok(());
        };
        if t.pos >= t.last || t.last > t.rows.len() {
            return Err(out_of());
        }
        let mut i = t.pos;
        let [mut chunk, mut samples, mut id] = t.rows[i];
        let mut prev_samples = 0u32;
        let mut next_chunk;
        i += 1;
        let mut hit = false;
        while i < t.last {
            next_chunk = t.rows[i][0];
            let n = next_chunk.wrapping_sub(chunk).wrapping_mul(samples);
            if start_sample < n {
                hit = true;
                break;
            }
            start_sample -= n;
            prev_samples = samples;
            chunk = next_chunk;
            [_, samples, id] = t.rows[i];
            entries = entries.wrapping_sub(1);
            i += 1;
        }
        next_chunk = if hit {
            t.rows[i][0]
        } else {
            chunks.wrapping_add(1)
        };
        if !hit {
            let n = next_chunk.wrapping_sub(chunk).wrapping_mul(samples);
            if start_sample > n {
                return Err(out_of());
            }
        }
        entries = entries.wrapping_add(1);
        i -= 1;
        if samples == 0 {
            return Err(st.fail("zero number of samples"));
        }
        let target_chunk = chunk.wrapping_sub(1).wrapping_add(start_sample / samples);
        let chunk_samples = start_sample % samples;
        if start {
            t.pos = i;
            self.stsc_entries = entries;
            self.start_chunk = u64::from(target_chunk);
            self.start_chunk_samples = u64::from(chunk_samples);
            t.rows[i][0] = target_chunk.wrapping_add(1);
            samples -= chunk_samples;
        } else {
            if start_sample != 0 {
                t.last = i + 1;
                self.stsc_entries = self.stsc_entries.wrapping_sub(entries.wrapping_sub(1));
                self.end_chunk_samples = u64::from(samples);
            } else {
                t.last = i;
                self.stsc_entries = self.stsc_entries.wrapping_sub(entries);
                self.end_chunk_samples = u64::from(prev_samples);
            }
            if chunk_samples != 0 {
                self.end_chunk = u64::from(target_chunk) + 1;
                self.end_chunk_samples = u64::from(chunk_samples);
            } else {
                self.end_chunk = u64::from(target_chunk);
            }
            samples = chunk_samples;
            next_chunk = chunk.wrapping_add(1);
        }
        if chunk_samples != 0 && next_chunk.wrapping_sub(target_chunk) == 2 {
            t.rows[i][1] = samples;
        } else if chunk_samples != 0 && start {
            self.stsc_start = Some([1, samples, id]);
            t.rows[i][0] = (self.start_chunk as u32).wrapping_add(2);
            self.stsc_entries = self.stsc_entries.wrapping_add(1);
        } else if chunk_samples != 0 {
            let c = self.end_chunk.wrapping_sub(self.start_chunk) as u32;
            self.stsc_end = Some([c, samples, id]);
            self.stsc_entries = self.stsc_entries.wrapping_add(1);
        }
        Ok(())
    }

    fn update_stsz(&mut self, st: &State) -> Result<(), Fail> {
        let Some((_, Some(t))) = self.stsz.as_mut() else {
            return Ok(());
        };
        let mut entries = u64::from(self.sizes_entries);
        if self.start_sample > entries {
            return Err(st.fail("start time is out mp4 stsz samples"));
        }
        entries -= self.start_sample;
        t.pos = self.start_sample as usize;
        let sum = |t: &Table<u32>, to: usize, n: u64| -> Option<u64> {
            let from = to.checked_sub(n as usize)?;
            Some(t.rows.get(from..to)?.iter().map(|&v| u64::from(v)).sum())
        };
        self.start_chunk_samples_size = sum(t, t.pos, self.start_chunk_samples)
            .ok_or_else(|| st.fail("too large mp4 start samples size"))?;
        if self.start_chunk_samples_size > st.end {
            return Err(st.fail("too large mp4 start samples size"));
        }
        if st.p.length > 0 {
            let want = self.end_sample.wrapping_sub(self.start_sample);
            if want > entries {
                return Err(st.fail("end time is out mp4 stsz samples"));
            }
            entries = want;
            t.last = t.pos + entries as usize;
            self.end_chunk_samples_size = sum(t, t.last, self.end_chunk_samples)
                .ok_or_else(|| st.fail("too large mp4 end samples size"))?;
            if self.end_chunk_samples_size > st.end {
                return Err(st.fail("too large mp4 end samples size"));
            }
        }
        self.sizes_entries = entries as u32;
        self.size += 20 + 4 * t.width() as u64;
        Ok(())
    }

    fn update_chunk_offsets(&mut self, st: &State, mdat_last: u64) -> Result<(), Fail> {
        let Some((wide, t)) = self.chunk_offsets.as_mut() else {
            return Err(st.fail("no mp4 stco atoms were found"));
        };
        let kind = if *wide { "co64" } else { "stco" };
        let too_large = |off: u64, size: u64| {
            off > st.end.wrapping_sub(size) || (!*wide && off + size > u64::from(u32::MAX))
        };
        let chunks = u64::from(self.chunks);
        if self.start_chunk > chunks || self.start_chunk as usize >= t.rows.len() {
            return Err(st.fail(&format!("start time is out mp4 {kind} chunks")));
        }
        t.pos = self.start_chunk as usize;
        let off = t.rows[t.pos];
        if too_large(off, self.start_chunk_samples_size) {
            return Err(st.fail("too large chunk offset"));
        }
        self.start_offset = off + self.start_chunk_samples_size;
        t.rows[t.pos] = self.start_offset;
        let entries;
        if st.p.length > 0 {
            if self.end_chunk > chunks || self.end_chunk < self.start_chunk {
                return Err(st.fail(&format!("end time is out mp4 {kind} chunks")));
            }
            entries = self.end_chunk - self.start_chunk;
            t.last = t.pos + entries as usize;
            if entries > 0 {
                let off = t.rows[t.last - 1];
                if too_large(off, self.end_chunk_samples_size) {
                    return Err(st.fail("too large chunk offset"));
                }
                self.end_offset = off + self.end_chunk_samples_size;
            }
        } else {
            entries = chunks - self.start_chunk;
            self.end_offset = mdat_last;
        }
        if entries == 0 {
            self.start_offset = st.end;
            self.end_offset = 0;
        }
        let w = if *wide { 8 } else { 4 };
        self.size += 16 + w * t.width() as u64;
        self.chunks = entries as u32;
        Ok(())
    }

    /// Shift every chunk offset by where mdat's data now begins.
    pub(super) fn adjust(&mut self, by: u64) {
        if let Some((wide, t)) = self.chunk_offsets.as_mut() {
            for i in t.pos..t.last.min(t.rows.len()) {
                t.rows[i] = if *wide {
                    t.rows[i].wrapping_add(by)
                } else {
                    u64::from((t.rows[i] as u32).wrapping_add(by as u32))
                };
            }
        }
    }

    pub(super) fn write(&self, out: &mut Vec<u8>) {
        fn hdr(out: &mut Vec<u8>, size: u64, name: &[u8; 4]) {
            out.extend_from_slice(&(size as u32).to_be_bytes());
            out.extend_from_slice(name);
        }
        fn table_hdr(out: &mut Vec<u8>, name: &[u8; 4], vf: [u8; 4], size: u64, n: u32) {
            hdr(out, size, name);
            out.extend_from_slice(&vf);
            out.extend_from_slice(&n.to_be_bytes());
        }
        let opt = |out: &mut Vec<u8>, b: &Option<Vec<u8>>| {
            if let Some(b) = b {
                out.extend_from_slice(b);
            }
        };
        hdr(out, self.trak_size, b"trak");
        opt(out, &self.tkhd);
        if self.prefix != 0 {
            hdr(out, 44, b"edts");
            hdr(out, 36, b"elst");
            out.extend_from_slice(&[1, 0, 0, 0]);
            out.extend_from_slice(&1u32.to_be_bytes());
            out.extend_from_slice(&self.movie_duration.to_be_bytes());
            out.extend_from_slice(&self.prefix.to_be_bytes());
            out.extend_from_slice(&1u16.to_be_bytes());
            out.extend_from_slice(&0u16.to_be_bytes());
        }
        hdr(out, self.mdia_size, b"mdia");
        if let Some((b, _)) = &self.mdhd {
            out.extend_from_slice(b);
        }
        opt(out, &self.hdlr);
        hdr(out, self.minf_size, b"minf");
        opt(out, &self.vmhd);
        opt(out, &self.smhd);
        opt(out, &self.dinf);
        hdr(out, self.stbl_size, b"stbl");
        opt(out, &self.stsd);
        if let Some(t) = &self.stts {
            table_hdr(
                out,
                b"stts",
                t.vf,
                16 + 8 * t.width() as u64,
                self.stts_entries,
            );
            for r in t.live() {
                out.extend_from_slice(&r[0].to_be_bytes());
                out.extend_from_slice(&r[1].to_be_bytes());
            }
        }
        if let Some(t) = &self.stss {
            let w = if self.stss_data { t.width() } else { 0 };
            table_hdr(
                out,
                b"stss",
                t.vf,
                16 + 4 * t.width() as u64,
                self.sync_entries,
            );
            for r in t.live().iter().take(w) {
                out.extend_from_slice(&r.to_be_bytes());
            }
        }
        if let Some(t) = &self.ctts {
            table_hdr(
                out,
                b"ctts",
                t.vf,
                16 + 8 * t.width() as u64,
                self.ctts_entries,
            );
            for r in t.live() {
                out.extend_from_slice(&r[0].to_be_bytes());
                out.extend_from_slice(&r[1].to_be_bytes());
            }
        }
        if let Some(t) = &self.stsc {
            let size = 16 + 12 * u64::from(self.stsc_entries);
            table_hdr(out, b"stsc", t.vf, size, self.stsc_entries);
            let rows = self
                .stsc_start
                .iter()
                .chain(t.live())
                .chain(self.stsc_end.iter());
            for r in rows {
                for v in r {
                    out.extend_from_slice(&v.to_be_bytes());
                }
            }
        }
        if let Some((h, t)) = &self.stsz {
            match t {
                Some(t) => {
                    let mut h = h.clone();
                    set32(&mut h, 0, (20 + 4 * t.width()) as u32);
                    set32(&mut h, 16, self.sizes_entries);
                    out.extend_from_slice(&h);
                    for r in t.live() {
                        out.extend_from_slice(&r.to_be_bytes());
                    }
                }
                None => out.extend_from_slice(&h[..20.min(h.len())]),
            }
        }
        if let Some((wide, t)) = &self.chunk_offsets {
            let (name, w) = if *wide { (b"co64", 8) } else { (b"stco", 4) };
            table_hdr(out, name, t.vf, 16 + w * t.width() as u64, self.chunks);
            for &r in t.live() {
                if *wide {
                    out.extend_from_slice(&r.to_be_bytes());
                } else {
                    out.extend_from_slice(&(r as u32).to_be_bytes());
                }
            }
        }
    }
}

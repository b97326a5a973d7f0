//! `image_filter`, `image_filter_buffer`, `image_filter_jpeg_quality`,
//! `image_filter_webp_quality`, `image_filter_sharpen`, `image_filter_transparency` and
//! `image_filter_interlace`: nginx's ngx_http_image_filter_module on the `image` crate (pure
//! Rust, no libgd). The whole answer (a file's or an application's, at most
//! `image_filter_buffer`) is read, its type told from its first bytes (JPEG, GIF, PNG,
//! WebP), and it is answered as it is (`test`), as its size in JSON (`size`), or decoded,
//! reduced (never enlarged), cut at the centre, rotated and encoded again in its own format.
//! Whatever fails (no image, too big, undecodable, a bad variable value) is a 415, as nginx's.

use super::{LoadCtx, LocConf};
use crate::http::request::Request;
use crate::http::response::{Body, Part, Response};
use crate::http::variables::Template;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use image::{DynamicImage, ImageFormat};
use std::os::unix::fs::FileExt;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "image_filter",
        ctx: Ctx::LOCATION,
        args: Args::Between(1, 3),
        block: false,
    },
    Spec {
        name: "image_filter_buffer",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "image_filter_jpeg_quality",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "image_filter_webp_quality",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "image_filter_sharpen",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "image_filter_transparency",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "image_filter_interlace",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
];

/// What `image_filter` does with an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Off,
    Test,
    Size,
    Rotate,
    Resize,
    Crop,
}

/// A number that is fixed or a variable's value (nginx's complex values).
#[derive(Debug, Clone)]
pub enum Value {
    Num(usize),
    Var(Template),
}

impl Value {
    fn get(&self, req: &Request) -> usize {
        match self {
            Value::Num(n) => *n,
            Value::Var(t) => number(&t.eval(req, None)),
        }
    }
}

/// nginx's ngx_http_image_filter_value: `-` is "any", a number is itself, anything else 0
/// (which the caller takes as invalid).
fn number(s: &str) -> usize {
    if s == "-" {
        return usize::MAX;
    }
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return 0;
    }
    s.parse().unwrap_or(0)
}

#[derive(Debug, Clone)]
pub struct Filter {
    pub kind: Kind,
    pub width: Option<Value>,
    pub height: Option<Value>,
    pub angle: Option<Value>,
}

#[derive(Debug, Clone, Default)]
pub struct ImageFilterConf {
    pub filter: Option<Filter>,
    pub buffer: Option<u64>,
    pub jpeg_quality: Option<Value>,
    pub webp_quality: Option<Value>,
    pub sharpen: Option<Value>,
    pub transparency: Option<bool>,
    pub interlace: Option<bool>,
}

impl ImageFilterConf {
    pub fn merge(&mut self, p: &ImageFilterConf) {
        if self.filter.is_none() {
            self.filter.clone_from(&p.filter);
        }
        if self.buffer.is_none() {
            self.buffer = p.buffer;
        }
        if self.jpeg_quality.is_none() {
            self.jpeg_quality.clone_from(&p.jpeg_quality);
        }
        if self.webp_quality.is_none() {
            self.webp_quality.clone_from(&p.webp_quality);
        }
        if self.sharpen.is_none() {
            self.sharpen.clone_from(&p.sharpen);
        }
        if self.transparency.is_none() {
            self.transparency = p.transparency;
        }
        if self.interlace.is_none() {
            self.interlace = p.interlace;
        }
    }

    fn active(&self) -> Option<&Filter> {
        self.filter.as_ref().filter(|f| f.kind != Kind::Off)
    }
}

/// A directive's argument: a variable, or a number `ok` accepts (else `invalid parameter`).
fn value(d: &Directive, i: usize, ok: impl Fn(usize) -> bool) -> Result<Value, ConfError> {
    let arg = &d.args[i];
    let t = Template::compile(arg).map_err(|e| d.error(e))?;
    if t.has_vars() {
        return Ok(Value::Var(t));
    }
    let n = number(arg);
    if !ok(n) {
        return Err(d.error(format!("invalid parameter \"{arg}\"")));
    }
    Ok(Value::Num(n))
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.image_filter;
    match d.name.as_str() {
        "image_filter" => set_filter(d, c)?,
        "image_filter_buffer" => c.buffer = Some(setters::size_arg(d, 0)?),
        "image_filter_transparency" => c.transparency = Some(setters::flag(d)?),
        "image_filter_interlace" => c.interlace = Some(setters::flag(d)?),
        name => {
            // The qualities and sharpen: a number (0 is refused for the qualities, as
            // nginx's `n <= 0`), or a variable.
            let zero_ok = name == "image_filter_sharpen";
            let v = value(d, 0, |n| n != usize::MAX && (zero_ok || n > 0))
                .map_err(|_| d.error(format!("invalid value \"{}\"", d.args[0])))?;
            match name {
                "image_filter_jpeg_quality" => c.jpeg_quality = Some(v),
                "image_filter_webp_quality" => c.webp_quality = Some(v),
                _ => c.sharpen = Some(v),
            }
        }
    }
    Ok(())
}

/// nginx's ngx_http_image_filter: `rotate` after `resize`/`crop` (or before) combines
/// with it; the last of `off`/`test`/`size`/`resize`/`crop` wins.
fn set_filter(d: &Directive, c: &mut ImageFilterConf) -> Result<(), ConfError> {
    let bad = |i: usize| d.error(format!("invalid parameter \"{}\"", d.args[i]));
    let prev = c.filter.take();
    let mut f = prev.unwrap_or(Filter {
        kind: Kind::Off,
        width: None,
        height: None,
        angle: None,
    });
    match (d.args.len(), d.args[0].as_str()) {
        (1, "off") => f.kind = Kind::Off,
        (1, "test") => f.kind = Kind::Test,
        (1, "size") => f.kind = Kind::Size,
        (2, "rotate") => {
            if f.kind != Kind::Resize && f.kind != Kind::Crop {
                f.kind = Kind::Rotate;
            }
            f.angle = Some(value(d, 1, |n| matches!(n, 90 | 180 | 270))?);
        }
        (3, "resize" | "crop") => {
            f.kind = if d.args[0] == "resize" {
                Kind::Resize
            } else {
                Kind::Crop
            };
            f.width = Some(value(d, 1, |n| n > 0)?);
            f.height = Some(value(d, 2, |n| n > 0)?);
        }
        _ => return Err(bad(0)),
    }
    c.filter = Some(f);
    Ok(())
}

/// Whether `req`'s location filters images: then an application's answer is read whole
/// before it is answered (`conn::exchange`). Not a HEAD's: it has no body to filter.
pub fn applies(req: &Request) -> bool {
    req.conf.image_filter.active().is_some() && !req.is_head()
}

/// An application's answer read whole (at most `image_filter_buffer`, else nginx's 415),
/// to go through [`filter`] as a body at hand.
pub async fn read_whole(
    req: &Request,
    mut resp: Response,
    stream: &mut crate::conn::gateway::Streaming,
) -> Response {
    if resp.status == 304 {
        return resp;
    }
    let limit = limit(req);
    if let Some(len) = resp.content_length.filter(|&l| l > limit) {
        return reject(req, &format!("too big response: {len}"));
    }
    let mut body = Vec::new();
    loop {
        match stream.next(req).await {
            Ok(Some(b)) => {
                body.extend_from_slice(&b);
                if body.len() as u64 > limit {
                    return reject(req, &format!("too big response: {}", body.len()));
                }
            }
            Ok(None) => break,
            // Logged by the gateway: a body cut short is no image.
            Err(()) => return reject(req, "upstream body cut short"),
        }
    }
    set_body(&mut resp, body);
    resp
}

fn limit(req: &Request) -> u64 {
    req.conf.image_filter.buffer.unwrap_or(1024 * 1024)
}

/// nginx's ngx_http_filter_finalize_request with 415, the reason logged.
fn reject(req: &Request, why: &str) -> Response {
    crate::errlog::request(
        crate::errlog::Level::Error,
        req,
        format_args!("image filter: {why}"),
    );
    Response::error_page(415, req.conf.core.server_tokens())
}

/// The image types nginx tells apart, in its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Type {
    Jpeg,
    Gif,
    Png,
    Webp,
}

impl Type {
    /// nginx's ngx_http_image_test: the first 16 bytes' signature.
    fn of(b: &[u8]) -> Option<Type> {
        if b.len() < 16 {
            return None;
        }
        if b[0] == 0xff && b[1] == 0xd8 {
            Some(Type::Jpeg)
        } else if b.starts_with(b"GIF8") && b[5] == b'a' && matches!(b[4], b'7' | b'9') {
            Some(Type::Gif)
        } else if b.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(Type::Png)
        } else if b.starts_with(b"RIFF") && &b[8..12] == b"WEBP" {
            Some(Type::Webp)
        } else {
            None
        }
    }

    fn name(self) -> &'static str {
        match self {
            Type::Jpeg => "jpeg",
            Type::Gif => "gif",
            Type::Png => "png",
            Type::Webp => "webp",
        }
    }

    fn format(self) -> ImageFormat {
        match self {
            Type::Jpeg => ImageFormat::Jpeg,
            Type::Gif => ImageFormat::Gif,
            Type::Png => ImageFormat::Png,
            Type::Webp => ImageFormat::WebP,
        }
    }
}

/// The image filter on an answer whose body is at hand (a file's, or an application's read
/// whole): `resp` becomes the image's answer, or nginx's 415. HTTP/1 and HTTP/2 both come
/// through here (`http::handler`).
pub fn filter(req: &Request, resp: &mut Response) {
    let Some(f) = req.conf.image_filter.active() else {
        return;
    };
    // A HEAD too: nginx filters the file's body and sends the filtered answer's head.
    if resp.status == 304 {
        return;
    }
    if let Err(why) = run(req, f, resp) {
        *resp = reject(req, &why);
    }
}

fn run(req: &Request, f: &Filter, resp: &mut Response) -> Result<(), String> {
    let c = &req.conf.image_filter;
    let limit = limit(req);
    let ct = resp.content_type.as_deref().unwrap_or("");
    if ct
        .get(..25)
        .is_some_and(|p| p.eq_ignore_ascii_case("multipart/x-mixed-replace"))
    {
        return Err("multipart/x-mixed-replace response".into());
    }
    let len = resp.content_length.unwrap_or(resp.body.len());
    if len > limit {
        return Err(format!("too big response: {len}"));
    }
    let data = read_body(&resp.body).map_err(|e| format!("read failed: {e}"))?;
    let Some(ty) = Type::of(&data) else {
        if f.kind == Kind::Size {
            json(resp, None);
            return Ok(());
        }
        return Err("not an image".into());
    };
    resp.content_type = Some(format!("image/{}", ty.name()).into());
    resp.accept_ranges = false;
    let dims = image::ImageReader::with_format(std::io::Cursor::new(&data), ty.format())
        .into_dimensions()
        .ok();
    let angle = f.angle.as_ref().map_or(0, |a| a.get(req));
    match f.kind {
        Kind::Test => return Ok(()),
        Kind::Size => {
            json(resp, dims.map(|d| (d, ty)));
            return Ok(());
        }
        Kind::Rotate if !matches!(angle, 90 | 180 | 270) => {
            return Err(format!("bad angle {angle}"));
        }
        _ => {}
    }
    let (mw, mh) = if f.kind == Kind::Rotate {
        (usize::MAX, usize::MAX)
    } else {
        let mw = f.width.as_ref().map_or(0, |v| v.get(req));
        let mh = f.height.as_ref().map_or(0, |v| v.get(req));
        if mw == 0 || mh == 0 {
            return Err("bad width or height".into());
        }
        (mw, mh)
    };
    // Small enough and not rotated: passed on as it is (nginx's ngx_http_image_asis).
    if let Some((w, h)) = dims {
        if w as usize <= mw && h as usize <= mh && angle == 0 {
            set_body(resp, data);
            return Ok(());
        }
    }
    let img = image::load_from_memory_with_format(&data, ty.format())
        .map_err(|e| format!("decode failed: {e}"))?;
    let img = transform(img, f.kind, mw, mh, angle);
    // image_filter_transparency off: a palette image's transparent colour is not kept (GIF
    // is one; the crate does not say which PNGs were).
    let img = if ty == Type::Gif && c.transparency == Some(false) {
        DynamicImage::ImageRgb8(img.to_rgb8())
    } else {
        img
    };
    let img = match c.sharpen.as_ref().map_or(0, |v| v.get(req)) {
        0 => img,
        // gd's percentage, as the unsharp mask's strength (an approximation of libgd's).
        s => img.unsharpen(s.min(1000) as f32 / 100.0, 0),
    };
    let out = encode(&img, ty, req).map_err(|e| format!("encode failed: {e}"))?;
    set_body(resp, out);
    Ok(())
}

/// nginx's ngx_http_image_resize's geometry: reduce (`resize`: to fit both bounds; `crop`:
/// to fit the tighter one), rotate, then cut the centre to the bounds (`crop`).
fn transform(img: DynamicImage, kind: Kind, mw: usize, mh: usize, angle: usize) -> DynamicImage {
    let (sx, sy) = (img.width() as usize, img.height() as usize);
    let (mut dx, mut dy) = (sx, sy);
    let mut resize = false;
    match kind {
        Kind::Resize => {
            if dx > mw {
                dy = (dy * mw / dx).max(1);
                dx = mw;
            }
            if dy > mh {
                dx = (dx * mh / dy).max(1);
                dy = mh;
            }
            resize = true;
        }
        Kind::Crop => {
            if (dx as f64 / dy as f64) < (mw as f64 / mh as f64) {
                if dx > mw {
                    dy = (dy * mw / dx).max(1);
                    dx = mw;
                    resize = true;
                }
            } else if dy > mh {
                dx = (dx * mh / dy).max(1);
                dy = mh;
                resize = true;
            }
        }
        _ => {}
    }
    let mut img = if resize && (dx, dy) != (sx, sy) {
        img.resize_exact(dx as u32, dy as u32, image::imageops::FilterType::Triangle)
    } else {
        img
    };
    img = match angle {
        90 => img.rotate90(),
        180 => img.rotate180(),
        270 => img.rotate270(),
        _ => img,
    };
    if kind == Kind::Crop {
        let (dx, dy) = (img.width() as usize, img.height() as usize);
        let ox = dx.saturating_sub(mw);
        let oy = dy.saturating_sub(mh);
        if ox > 0 || oy > 0 {
            let (w, h) = ((dx - ox) as u32, (dy - oy) as u32);
            img = img.crop_imm((ox / 2) as u32, (oy / 2) as u32, w, h);
        }
    }
    img
}

fn encode(img: &DynamicImage, ty: Type, req: &Request) -> image::ImageResult<Vec<u8>> {
    let c = &req.conf.image_filter;
    let mut out = Vec::new();
    match ty {
        Type::Jpeg => {
            let q = c.jpeg_quality.as_ref().map_or(75, |v| v.get(req));
            let q = q.clamp(1, 100) as u8;
            let enc = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, q);
            // JPEG has no alpha: as gd, what is transparent is dropped.
            img.to_rgb8().write_with_encoder(enc)?;
            quality_comment(&mut out, q);
        }
        // The `image` crate writes WebP lossless only: image_filter_webp_quality has no
        // effect (docs/modules/image_filter.md).
        Type::Webp => img
            .to_rgba8()
            .write_to(&mut std::io::Cursor::new(&mut out), ImageFormat::WebP)?,
        Type::Gif => encode_gif(img, c.interlace == Some(true), &mut out)?,
        Type::Png => img.write_to(&mut std::io::Cursor::new(&mut out), ImageFormat::Png)?,
    }
    Ok(out)
}

/// A comment naming the quality, after the JFIF segment, as libgd's JPEGs carry one for
/// nginx (`CREATOR: gd-jpeg v1.0 (using IJG JPEG v80), quality = 75`): tools read the
/// quality back from it.
fn quality_comment(jpeg: &mut Vec<u8>, quality: u8) {
    let text = format!("CREATOR: gannet image_filter, quality = {quality}\n");
    // SOI, then APP0 (JFIF) when the encoder wrote one: its length follows its marker.
    let mut at = 2;
    if jpeg.get(2..4) == Some(&[0xff, 0xe0][..]) {
        let len = jpeg
            .get(4..6)
            .map_or(0, |l| usize::from(u16::from_be_bytes([l[0], l[1]])));
        at = 4 + len;
    }
    if at > jpeg.len() || !jpeg.starts_with(&[0xff, 0xd8]) {
        return;
    }
    let len = (text.len() + 2) as u16;
    let mut com = vec![0xff, 0xfe];
    com.extend_from_slice(&len.to_be_bytes());
    com.extend_from_slice(text.as_bytes());
    jpeg.splice(at..at, com);
}

/// A GIF as the image crate writes one (a palette quantised at its best quality, the
/// frame cleared to the background after), interlaced when asked: its rows stored in the
/// four passes GIF's interlacing orders them in (every 8th from 0, every 8th from 4, every
/// 4th from 2, every 2nd from 1).
fn encode_gif(img: &DynamicImage, interlace: bool, out: &mut Vec<u8>) -> image::ImageResult<()> {
    let fail = |e: gif::EncodingError| {
        image::ImageError::Encoding(image::error::EncodingError::new(ImageFormat::Gif.into(), e))
    };
    let too_big = || {
        image::ImageError::Parameter(image::error::ParameterError::from_kind(
            image::error::ParameterErrorKind::DimensionMismatch,
        ))
    };
    let mut rgba = img.to_rgba8();
    let w = u16::try_from(rgba.width()).map_err(|_| too_big())?;
    let h = u16::try_from(rgba.height()).map_err(|_| too_big())?;
    let mut frame = gif::Frame::from_rgba_speed(w, h, &mut rgba, 1);
    frame.dispose = gif::DisposalMethod::Background;
    if interlace && w > 0 {
        let row = usize::from(w);
        let rows: Vec<usize> = [(0, 8), (4, 8), (2, 4), (1, 2)]
            .into_iter()
            .flat_map(|(first, step)| (first..usize::from(h)).step_by(step))
            .collect();
        let mut reordered = Vec::with_capacity(frame.buffer.len());
        for r in rows {
            if let Some(line) = frame.buffer.get(r * row..(r + 1) * row) {
                reordered.extend_from_slice(line);
            }
        }
        frame.buffer = reordered.into();
        frame.interlaced = true;
    }
    let mut enc = gif::Encoder::new(out, w, h, &[]).map_err(fail)?;
    enc.write_frame(&frame).map_err(fail)
}

/// nginx's ngx_http_image_json: a 200 `application/json` answer, the other headers gone
/// (ngx_http_clean_header).
fn json(resp: &mut Response, img: Option<((u32, u32), Type)>) {
    let text = match img {
        Some(((w, h), ty)) => format!(
            "{{ \"img\" : {{ \"width\": {w}, \"height\": {h}, \"type\": \"{}\" }} }}\r\n",
            ty.name()
        ),
        None => "{}\r\n".to_string(),
    };
    let mut r = Response::new(200);
    r.content_type = Some("application/json".into());
    r.body = Body::bytes(text);
    r.content_length = Some(r.body.len());
    *resp = r;
}

fn set_body(resp: &mut Response, data: Vec<u8>) {
    resp.body = Body::bytes(data);
    resp.content_length = Some(resp.body.len());
    resp.length_unknown = false;
}

/// The body's bytes, files' ranges read.
fn read_body(body: &Body) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    if let Body::Parts(parts) = body {
        for p in parts {
            match p {
                Part::Bytes(b) => out.extend_from_slice(b),
                Part::File(f) => {
                    let start = out.len();
                    out.resize(start + f.len as usize, 0);
                    f.file.read_exact_at(&mut out[start..], f.offset)?;
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_as_nginx_reads_them() {
        assert_eq!(number("-"), usize::MAX);
        assert_eq!(number("120"), 120);
        assert_eq!(number(""), 0);
        assert_eq!(number("12x"), 0);
        assert_eq!(number("+5"), 0);
    }

    #[test]
    fn types_from_the_first_bytes() {
        let pad = |b: &[u8]| [b, &[0u8; 16][..]].concat();
        assert_eq!(Type::of(&pad(b"\xff\xd8\xff")), Some(Type::Jpeg));
        assert_eq!(Type::of(&pad(b"GIF89a")), Some(Type::Gif));
        assert_eq!(Type::of(&pad(b"GIF88a")), None);
        assert_eq!(Type::of(&pad(b"\x89PNG\r\n\x1a\n")), Some(Type::Png));
        assert_eq!(Type::of(b"RIFF\0\0\0\0WEBPVP8 "), Some(Type::Webp));
        // Fewer than 16 bytes are no image, as nginx's test.
        assert_eq!(Type::of(b"\xff\xd8\xff"), None);
    }

    #[test]
    fn geometry_as_nginx() {
        let img = || DynamicImage::new_rgb8(120, 80);
        let size = |i: DynamicImage| (i.width(), i.height());
        assert_eq!(size(transform(img(), Kind::Resize, 50, 50, 0)), (50, 33));
        assert_eq!(
            size(transform(img(), Kind::Resize, usize::MAX, 20, 90)),
            (20, 30)
        );
        assert_eq!(size(transform(img(), Kind::Crop, 30, 30, 0)), (30, 30));
        // Wider bounds than the image's ratio: nginx fits the width (already within) and
        // only cuts the height.
        assert_eq!(size(transform(img(), Kind::Crop, 200, 10, 0)), (120, 10));
        assert_eq!(size(transform(img(), Kind::Crop, 10, 40, 0)), (10, 40));
        assert_eq!(
            size(transform(img(), Kind::Rotate, usize::MAX, usize::MAX, 270)),
            (80, 120)
        );
    }
}

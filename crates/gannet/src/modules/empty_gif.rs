//! ngx_http_empty_gif_module: `empty_gif;` makes a location answer with a 1x1 transparent
//! GIF (43 bytes, `image/gif`) - the tracking pixel of ad and analytics configs. As nginx's:
//! GET and HEAD only (others 405), a fixed Last-Modified (Sun, 28 Sep 1970 06:00:00 GMT) so
//! `If-Modified-Since` gets a 304, and the location's content handler is not inherited.

use super::{LoadCtx, LocConf};
use crate::http::flow::Flow;
use crate::http::request::Request;
use crate::http::response::{Body, Response};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use gannet_proto::h1::Method;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "empty_gif",
    ctx: Ctx::LOCATION,
    args: Args::Exactly(0),
    block: false,
}];

/// The picture: GIF89a, one pixel, a two-colour table whose second colour (white) is
/// transparent, LZW data for one pixel of colour 1.
const GIF: &[u8] = &[
    b'G', b'I', b'F', b'8', b'9', b'a', // header
    0x01, 0x00, 0x01, 0x00, // logical screen 1x1
    0x80, 0x01, 0x00, // global 1-bit colour table, background colour 1, no aspect ratio
    0x00, 0x00, 0x00, 0xff, 0xff, 0xff, // colours: black, white
    0x21, 0xf9, 0x04, 0x01, 0x00, 0x00, 0x01, 0x00, // graphic control: colour 1 transparent
    0x2c, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, // image 1x1 at 0,0
    0x02, 0x02, 0x4c, 0x01, 0x00, // LZW: minimum code size 2, clear, 1, end
    0x3b, // trailer
];

/// nginx's fixed `last_modified_time` of the picture (seconds since the epoch).
const LAST_MODIFIED: u64 = 23_349_600;

pub fn set(_d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    lc.empty_gif = true;
    Ok(())
}

/// The content handler of an `empty_gif` location.
pub fn handle(req: &Request) -> Flow {
    if !matches!(req.method(), Method::Get | Method::Head) {
        return Flow::Status(405);
    }
    let mut r = Response::new(200);
    r.content_type = Some(Arc::from("image/gif"));
    r.last_modified = Some(SystemTime::UNIX_EPOCH + Duration::from_secs(LAST_MODIFIED));
    r.body = Body::bytes(GIF);
    Flow::Done(r)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_picture_is_nginx_s_43_bytes() {
        assert_eq!(super::GIF.len(), 43);
    }
}

//! gannet-proto: pure protocol codecs, no I/O. The server feeds bytes in and writes what the
//! encoders produce; everything here is testable with byte strings.
//!
//! - [`h1::parse`]: HTTP/1.x request heads (on `httparse`) with the framing rules of RFC 9112.
//! - [`h1::response`]: HTTP/1.x response heads from upstream servers, with their framing.
//! - [`h1::chunked`]: the chunked body decoder (request bodies, and proxied answers).
//! - [`h1::encode`]: status lines, reason phrases, HTTP dates.
//! - [`cgi`]: what the three application protocols share: the parameter sink and the CGI
//!   response head (optionally after an HTTP status line).
//! - [`fastcgi`]: FastCGI records.
//! - [`scgi`]: SCGI request headers.
//! - [`uwsgi`]: uwsgi request packets.
//! - [`uri`]: request-target splitting, percent-decoding and path normalisation.

pub mod cgi;
pub mod fastcgi;
pub mod h1;
pub mod scgi;
pub mod uri;
pub mod uwsgi;

#[doc(hidden)]
pub mod fuzz_support;

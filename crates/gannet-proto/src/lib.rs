//! gannet-proto: pure protocol codecs, no I/O. The server feeds bytes in and writes what the
//! encoders produce; everything here is testable with byte strings.
//!
//! - [`h1::parse`]: HTTP/1.x request heads (on `httparse`) with the framing rules of RFC 9112.
//! - [`h1::chunked`]: the chunked request-body decoder.
//! - [`h1::encode`]: status lines, reason phrases, HTTP dates.
//! - [`fastcgi`]: FastCGI records and the CGI response head.
//! - [`uri`]: request-target splitting, percent-decoding and path normalisation.

pub mod fastcgi;
pub mod h1;
pub mod uri;

#[doc(hidden)]
pub mod fuzz_support;

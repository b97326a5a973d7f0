//! SCGI requests (the Simple Common Gateway Interface, as nginx's ngx_http_scgi_module speaks
//! it), no I/O: the header block is one netstring, `LEN:` then NUL-terminated names and
//! values then `,`, whose first pair must be `CONTENT_LENGTH` and which must carry `SCGI` `1`;
//! the request body follows as is. The application answers with a CGI head (or an HTTP
//! status line, [`crate::cgi::parse_head_or_status_line`]) and the body, and closes the
//! connection to end it: SCGI has one request per connection.

use crate::cgi::{ParamError, ParamSink};

/// The header pairs after the two the protocol fixes.
#[derive(Default, Debug, Clone)]
pub struct Headers {
    buf: Vec<u8>,
}

impl Headers {
    pub fn new() -> Headers {
        Headers::default()
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

impl ParamSink for Headers {
    /// Add one pair. `CONTENT_LENGTH` and `SCGI` are skipped: [`request`] writes them where
    /// the protocol wants them, and nginx's stock `scgi_params` sets `SCGI` too.
    fn push(&mut self, name: &[u8], value: &[u8]) -> Result<(), ParamError> {
        if name.contains(&0) || value.contains(&0) {
            return Err(ParamError::Nul);
        }
        if name == b"CONTENT_LENGTH" || name == b"SCGI" {
            return Ok(());
        }
        self.buf.reserve(name.len() + value.len() + 2);
        self.buf.extend_from_slice(name);
        self.buf.push(0);
        self.buf.extend_from_slice(value);
        self.buf.push(0);
        Ok(())
    }
}

/// The header netstring of a request whose body is `content_length` bytes.
pub fn request(out: &mut Vec<u8>, content_length: usize, h: &Headers) {
    const SCGI_1: &[u8] = b"\0SCGI\x001\0";
    let length = content_length.to_string();
    let fixed = b"CONTENT_LENGTH\0".len() + length.len() + SCGI_1.len();
    out.extend_from_slice((fixed + h.buf.len()).to_string().as_bytes());
    out.extend_from_slice(b":CONTENT_LENGTH\0");
    out.extend_from_slice(length.as_bytes());
    out.extend_from_slice(SCGI_1);
    out.extend_from_slice(&h.buf);
    out.push(b',');
}

#[cfg(test)]
#[path = "scgi_tests.rs"]
mod tests;

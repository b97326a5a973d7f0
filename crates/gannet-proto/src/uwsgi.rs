//! uwsgi requests (the uWSGI server's native protocol, as nginx's ngx_http_uwsgi_module
//! speaks it), no I/O: a 4-byte header (`modifier1`, the size of the variables as a
//! little-endian u16, `modifier2`), then each variable as a little-endian u16 length and
//! the name, a u16 length and the value; the request body follows as is. The block cannot
//! exceed 65535 bytes. The application answers with an HTTP status line and header fields
//! (or a CGI head, [`crate::cgi::parse_head_or_status_line`]) and the body, and closes the
//! connection to end it.

use crate::cgi::{ParamError, ParamSink};

/// The most bytes the variables may take: their size is a u16 in the header.
pub const MAX_VARS: usize = u16::MAX as usize;

/// The variables of one request.
#[derive(Default, Debug, Clone)]
pub struct Vars {
    buf: Vec<u8>,
}

impl Vars {
    pub fn new() -> Vars {
        Vars::default()
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

impl ParamSink for Vars {
    /// Add one variable, unless the block would pass [`MAX_VARS`]; then nothing is added.
    fn push(&mut self, name: &[u8], value: &[u8]) -> Result<(), ParamError> {
        if self.buf.len() + 4 + name.len() + value.len() > MAX_VARS {
            return Err(ParamError::TooBig);
        }
        // Both fit in a u16: each is shorter than the block.
        self.buf
            .extend_from_slice(&(name.len() as u16).to_le_bytes());
        self.buf.extend_from_slice(name);
        self.buf
            .extend_from_slice(&(value.len() as u16).to_le_bytes());
        self.buf.extend_from_slice(value);
        Ok(())
    }
}

/// The packet header and the variables; the body is written after them as is.
pub fn request(out: &mut Vec<u8>, modifier1: u8, modifier2: u8, v: &Vars) {
    out.push(modifier1);
    out.extend_from_slice(&(v.buf.len() as u16).to_le_bytes());
    out.push(modifier2);
    out.extend_from_slice(&v.buf);
}

#[cfg(test)]
#[path = "uwsgi_tests.rs"]
mod tests;

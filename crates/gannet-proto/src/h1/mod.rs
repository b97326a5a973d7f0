//! HTTP/1.x codec.

pub mod chunked;
pub mod encode;
mod fields;
pub mod parse;
mod reqline;

#[cfg(test)]
mod chunked_tests;
#[cfg(test)]
mod encode_tests;
#[cfg(test)]
mod parse_tests;

pub use chunked::{Chunk, ChunkedDecoder};
pub use parse::{parse_request, BodyKind, Limits, Method, ParseError, RequestHead, Version};

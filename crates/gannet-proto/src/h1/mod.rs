//! HTTP/1.x codec.

pub mod chunked;
pub mod encode;
mod fields;
pub mod parse;
mod plain;
mod reqline;
pub mod response;

#[cfg(test)]
mod chunked_tests;
#[cfg(test)]
mod encode_tests;
#[cfg(test)]
mod parse_tests;
#[cfg(test)]
mod plain_tests;
#[cfg(test)]
mod response_tests;

pub use chunked::{Chunk, ChunkedDecoder};
pub use fields::valid_host;
pub use parse::{
    parse_request, BodyKind, HeaderNames, Limits, Method, ParseError, RequestHead, Version,
};
pub use response::{parse_response, Framing, ResponseError, ResponseHead};

//! Fuzz the HTTP/1 request path: pipelined heads, their bodies (Content-Length and chunked),
//! the trailing bytes through a chunked decoder, and each head's request target. The steps
//! live in `gannet_proto::fuzz_support` so `cargo test` replays saved inputs identically.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gannet_proto::fuzz_support::h1_parse(data);
});

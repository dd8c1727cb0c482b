//! Fuzz target: arbitrary Content-Type and Content-Encoding headers through `ParsedRequest::parse_http`.
//! The checks live in `keyrelay_fuzz::targets::request_http`, so the `cargo test` replay runs them too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| keyrelay_fuzz::targets::request_http(data));

//! Fuzz target: an arbitrary query string (no body) through parse, key rewrite and read-back.
//! The checks live in `keyrelay_fuzz::targets::request_query`, so the `cargo test` replay runs them too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| keyrelay_fuzz::targets::request_query(data));

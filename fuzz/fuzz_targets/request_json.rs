//! Fuzz target: `content-type\nquery\nbody` for JSON bodies (empty first line: no Content-Type).
//! The checks live in `keyrelay_fuzz::targets::request_json`, so the `cargo test` replay runs them too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| keyrelay_fuzz::targets::request_json(data));

//! Fuzz target: `content-type\nquery\nbody` with a multipart Content-Type and body.
//! The checks live in `keyrelay_fuzz::targets::request_multipart`, so the `cargo test` replay runs them too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| keyrelay_fuzz::targets::request_multipart(data));

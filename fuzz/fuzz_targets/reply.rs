//! Fuzz target: arbitrary upstream answer bytes through every answer parser.
//! The checks live in `keyrelay_fuzz::targets::reply`, so the `cargo test` replay runs them too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| keyrelay_fuzz::targets::reply(data));

//! Fuzz target: `query\nbody` as an urlencoded body, labelled and unlabelled.
//! The checks live in `keyrelay_fuzz::targets::request_form`, so the `cargo test` replay runs them too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| keyrelay_fuzz::targets::request_form(data));

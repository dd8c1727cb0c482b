//! Fuzz target: `query\nbody` as an urlencoded body, labelled and unlabelled.
#![no_main]

use keyrelay_fuzz::{check_request, split_line, with_caller_key};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (query, body) = split_line(data);
    let Ok(query) = String::from_utf8(with_caller_key(query)) else {
        return;
    };
    let body = with_caller_key(body);
    check_request(&query, Some("application/x-www-form-urlencoded"), &body);
    // Unlabelled bodies (curl -d) are guessed: form, or JSON when they start with `{`.
    check_request(&query, None, &body);
});

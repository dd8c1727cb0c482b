//! Fuzz target: an arbitrary query string (no body) through parse, key rewrite and re-parse.
#![no_main]

use keyrelay_fuzz::{check_request, with_caller_key};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // hyper hands keyrelay the query as a str, so only UTF-8 queries can occur.
    let Ok(query) = String::from_utf8(with_caller_key(data)) else {
        return;
    };
    check_request(&query, None, b"");
});

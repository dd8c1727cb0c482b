//! Fuzz target: `content-type\nquery\nbody` for JSON bodies; an empty first line means no
//! Content-Type (guessed from the body), and `text/plain` is what the npm client sends.
#![no_main]

use keyrelay_fuzz::{check_request, split_line, with_caller_key};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (content_type, rest) = split_line(data);
    let (query, body) = split_line(rest);
    let (Ok(content_type), Ok(query)) = (
        std::str::from_utf8(content_type),
        String::from_utf8(with_caller_key(query)),
    ) else {
        return;
    };
    let content_type = Some(content_type).filter(|ct| !ct.is_empty());
    check_request(&query, content_type, &with_caller_key(body));
});

//! Fuzz target: `content-type\nquery\nbody`, the Content-Type carrying the boundary, so the
//! boundary's spelling (quoted, padded, odd characters) is fuzzed together with the body.
#![no_main]

use keyrelay_fuzz::{
    check_multipart_with_multer, check_request, multer_differential_enabled, split_line,
    with_caller_key,
};
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
    let body = with_caller_key(body);
    check_request(&query, Some(content_type), &body);
    if multer_differential_enabled() {
        check_multipart_with_multer(&query, content_type, &body);
    }
});

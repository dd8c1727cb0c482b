//! Fuzz target: arbitrary upstream answer bytes through every answer parser.
#![no_main]

use keyrelay::captcha::{
    classify, parse_balance, parse_reply, parse_threads, split_ids_reply, Outcome, Reply,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let reply = parse_reply(data);
    if let Reply::Error(code) = &reply {
        assert_eq!(code.trim(), code, "error codes are trimmed");
    }
    for status in [200, 204, 301, 404, 429, 500, 502, 0, 999] {
        let outcome = classify(status, &reply);
        match status {
            429 => assert_eq!(outcome, Outcome::KeyFull),
            200..=299 => match reply {
                Reply::Ok(_) | Reply::NotReady | Reply::Value(_) => {
                    assert_eq!(outcome, Outcome::Success)
                }
                Reply::Garbage => assert_eq!(outcome, Outcome::Transient),
                Reply::Error(_) => {}
            },
            _ => assert_eq!(outcome, Outcome::Transient),
        }
    }
    if let Some(balance) = parse_balance(data) {
        assert!(balance.is_finite());
    }
    let _ = parse_threads(data);
    assert_eq!(split_ids_reply(data, 0), None);
    for expected in 1..=4 {
        if let Some(items) = split_ids_reply(data, expected) {
            assert_eq!(items.len(), expected, "one item per id");
        }
    }
});

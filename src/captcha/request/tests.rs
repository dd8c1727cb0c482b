//! Unit tests of request parsing and the key rewrite, over every body encoding: the
//! helpers they share, and a file under `tests/` for each concern.

use super::*;
use crate::captcha::param_name::php_name;

const POOL: &str = "POOLKEY0123456789abcdef012345678";

fn parse(query: &str, content_type: Option<&str>, body: &[u8]) -> ParsedRequest {
    ParsedRequest::parse(Some(query), content_type, Bytes::copy_from_slice(body))
        .expect("request should parse")
}

fn parse_err(content_type: Option<&str>, body: &[u8]) -> RequestError {
    ParsedRequest::parse(None, content_type, Bytes::copy_from_slice(body))
        .expect_err("request should be rejected")
}

fn pairs(request: &ParsedRequest) -> Pairs {
    Pairs(request.params())
}

/// Decoded params, comparable with a literal list of `(name, value)`.
#[derive(Debug)]
struct Pairs(Vec<(String, String)>);

impl<const N: usize> PartialEq<[(&str, &str); N]> for Pairs {
    fn eq(&self, other: &[(&str, &str); N]) -> bool {
        self.0.len() == N
            && self
                .0
                .iter()
                .zip(other)
                .all(|((n, v), (on, ov))| n == on && v == ov)
    }
}

impl std::ops::Index<usize> for Pairs {
    type Output = (String, String);
    fn index(&self, i: usize) -> &(String, String) {
        &self.0[i]
    }
}

fn rewrite_key(request: &ParsedRequest) -> (String, Vec<u8>) {
    let rewritten = request.rewrite(&[("key", POOL)]);
    (rewritten.query, rewritten.body.to_vec())
}

const FORM: Option<&str> = Some("application/x-www-form-urlencoded");
const JSON: Option<&str> = Some("application/json");
/// The boundary of the one-part bodies that the multipart and strict-reading tests build.
const MULTIPART_B: Option<&str> = Some("multipart/form-data; boundary=b");

mod json_rewrite;
mod multipart_rewrite;
mod parsing;
mod robustness;
mod strict_reading;
mod uncertain;
mod urlencoded_rewrite;

//! The host of a request's authority as the proxy compares and dials it: case, a final dot,
//! IPv6 brackets.

/// An IPv6 literal without the brackets a URI puts around it (`[::1]` is `::1`), so that
/// it can be dialled and named in a certificate; any other host as it is.
pub(super) fn unbracket(host: &str) -> &str {
    host.strip_prefix('[')
        .and_then(|inner| inner.strip_suffix(']'))
        .unwrap_or(host)
}

/// Whether `host` is on the `intercepted` list: by name without case or a final dot, which
/// names the same host, and an IPv6 literal with or without its brackets.
pub(super) fn is_intercepted(intercepted: &[String], host: &str) -> bool {
    let host = unbracket(host.trim_end_matches('.'));
    intercepted
        .iter()
        .any(|h| unbracket(h).eq_ignore_ascii_case(host))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_intercepted_by_name_without_case_or_a_final_dot() {
        let list = vec![
            "ocr.captchaai.com".to_owned(),
            "127.0.0.1".to_owned(),
            "[::1]".to_owned(),
        ];
        for host in [
            "ocr.captchaai.com",
            "OCR.CaptchaAI.com",
            "ocr.captchaai.com.",
            "127.0.0.1",
            "::1",
            "[::1]",
        ] {
            assert!(is_intercepted(&list, host), "{host}");
        }
        for host in [
            "captchaai.com",
            "example.com",
            "127.0.0.2",
            "",
            "[::2]",
            "[",
            "]",
        ] {
            assert!(!is_intercepted(&list, host), "{host}");
        }
    }
}

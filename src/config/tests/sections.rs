//! The top-level settings and sections, and that every problem is collected.

use super::*;

#[test]
fn listen_must_be_a_socket_address() {
    assert_problem(
        &format!("listen = \"localhost:8080\"\n{}", one_key()),
        "listen: a string ending …8080 is not an IP address and port such as \"127.0.0.1:8080\"",
    );
}

#[test]
fn upstream_must_be_an_http_base_url() {
    assert_problem(
        &format!("upstream = \"ftp://ocr.captchaai.com\"\n{}", one_key()),
        "upstream: scheme must be http or https, got \"ftp\"",
    );
    assert_problem(
        &format!(
            "upstream = \"https://ocr.captchaai.com/?x=1\"\n{}",
            one_key()
        ),
        "upstream: must not have a query (\"?...\"); it is a base URL",
    );
}

#[test]
fn durations_need_a_unit() {
    assert_problem(
        &format!("refresh_interval = \"5 minutes please\"\n{}", one_key()),
        "refresh_interval: invalid duration, a string ending …ease: expected number at 10",
    );
    assert_problem(
        &format!("{}[failover]\nbusy_cooldown = 10\n", one_key()),
        "failover.busy_cooldown: write durations as a string with a unit, e.g. \"30s\" (got the integer 10)",
    );
    assert_problem(
        &format!("{}[timeouts]\nsolve = 1.5\n", one_key()),
        "timeouts.solve: must be a duration such as \"30s\", got a float",
    );
    assert_problem(
        &format!("{}[pins]\nttl = \"2y\"\n", one_key()),
        "pins.ttl: must be at most 365days, got 2years",
    );
}

#[test]
fn zero_durations_are_refused_where_they_make_no_sense() {
    let text = format!(
        "refresh_interval = \"0s\"\n{}[pins]\nttl = \"0m\"\n[timeouts]\nconnect = \"0s\"\nrequest = \"0s\"\nsolve = \"0s\"\nrefresh = \"0ms\"\n",
        one_key()
    );
    assert_eq!(
        problems(&text),
        [
            "refresh_interval: must be greater than 0",
            "pins.ttl: must be greater than 0",
            "timeouts.connect: must be greater than 0",
            "timeouts.request: must be greater than 0",
            "timeouts.solve: must be greater than 0",
            "timeouts.refresh: must be greater than 0",
        ]
    );
}

#[test]
fn failover_counts_and_balance_are_checked() {
    let text = format!(
        "{}[failover]\nmax_attempts = 0\ntransient_failures = 0\nmin_balance = -1\nbackoff_base = \"1s\"\nbackoff_max = \"500ms\"\n",
        one_key()
    );
    assert_eq!(
        problems(&text),
        [
            "failover.max_attempts: must be >= 1, got 0",
            "failover.min_balance: must be >= 0, got -1",
            "failover.transient_failures: must be >= 1, got 0",
            "failover.backoff_max: must be >= failover.backoff_base (1s), got 500ms",
        ]
    );
    assert_problem(
        &format!("{}[failover]\nmin_balance = nan\n", one_key()),
        "failover.min_balance: must be a finite number, got NaN",
    );
}

#[test]
fn pins_and_limits_are_checked() {
    assert_problem(
        &format!("{}[pins]\nmax_pins = 0\n", one_key()),
        "pins.max_pins: must be >= 1, got 0",
    );
    let max_body = |v: &str| format!("{}[limits]\nmax_body = {v}\n", one_key());
    assert_problem(&max_body("0"), "limits.max_body: must be greater than 0");
    assert_problem(
        &max_body("\"0B\""),
        "limits.max_body: must be greater than 0",
    );
    assert_problem(&max_body("-5"), "limits.max_body: must be greater than 0");
    assert_problem(
        &max_body("true"),
        "limits.max_body: must be a size such as \"16MiB\" or a number of bytes, got a boolean",
    );
    let bad = problems(&max_body("\"lots\""));
    assert_eq!(bad.len(), 1);
    assert!(
        bad[0].starts_with("limits.max_body: invalid size: couldn't parse \"lots\""),
        "{bad:?}"
    );
}

#[test]
fn all_problems_are_collected_and_listed() {
    let text = "listen = \"nope\"\n[failover]\nmax_attempts = 0\n";
    let error = error_with(text, &no_env);
    assert_eq!(
        error.to_string(),
        "invalid configuration (3 problems):\n\
         \x20 listen: \"nope\" is not an IP address and port such as \"127.0.0.1:8080\"\n\
         \x20 failover.max_attempts: must be >= 1, got 0\n\
         \x20 keys: the pool is empty; add a [[keys]] entry or set keys_env"
    );
    let single = error_with("", &no_env);
    assert_eq!(
        single.to_string(),
        "invalid configuration: keys: the pool is empty; add a [[keys]] entry or set keys_env"
    );
}

#[test]
fn upstream_no_proxy_is_read_beside_upstream_proxy_and_refused_without_it() {
    let text = format!(
        "upstream_proxy = \"http://proxy.internal:3128\"\nupstream_no_proxy = [\"localhost\", \"*.corp\"]\n{}",
        one_key()
    );
    let config = Config::from_toml_str(&text, &no_env).expect("valid");
    let proxy = config.upstream_proxy.expect("a proxy");
    assert_eq!(proxy.direct(), ["localhost", ".corp"]);

    let alone = format!("upstream_no_proxy = [\"localhost\"]\n{}", one_key());
    let found = problems(&alone);
    assert!(
        found
            .iter()
            .any(|p| p.starts_with("upstream_no_proxy: lists hosts that bypass upstream_proxy")),
        "{found:?}"
    );
    // An empty list says nothing, with or without a proxy.
    let empty = format!("upstream_no_proxy = []\n{}", one_key());
    assert!(Config::from_toml_str(&empty, &no_env).is_ok());
}

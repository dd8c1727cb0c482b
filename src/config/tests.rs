//! Unit tests for `proxy.toml` parsing and validation: every rule with its exact message,
//! the defaults, `${VAR}` and `keys_env`, and that no key value escapes.

use std::collections::HashMap;
use std::time::Duration;

use super::*;

/// Test keys carry "canary" in the middle, where neither the default name (first eight
/// characters) nor the fingerprint (last four) reaches: any output containing it leaked.
const KEY_A: &str = "keyAAAAA-canary-0123456789abcd01";
const KEY_B: &str = "keyBBBBB-canary-0123456789abcd02";
const KEY_C: &str = "keyCCCCC-canary-0123456789abcd03";
const CANARY: &str = "canary";

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| map.get(name).cloned()
}

fn no_env(_: &str) -> Option<String> {
    None
}

fn parse_with(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Config {
    match Config::from_toml_str(text, env) {
        Ok(config) => config,
        Err(e) => panic!("expected a valid config, got: {e}"),
    }
}

fn parse(text: &str) -> Config {
    parse_with(text, &no_env)
}

fn error_with(text: &str, env: &dyn Fn(&str) -> Option<String>) -> ConfigError {
    let error = match Config::from_toml_str(text, env) {
        Ok(config) => panic!("expected an error, got {config:?}"),
        Err(e) => e,
    };
    assert_no_secret(&error.to_string());
    assert_no_secret(&format!("{error:?}"));
    error
}

/// The validation problems of an invalid config, in order.
fn problems_with(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    match error_with(text, env) {
        ConfigError::Invalid(problems) => problems,
        other => panic!("expected Invalid, got: {other}"),
    }
}

fn problems(text: &str) -> Vec<String> {
    problems_with(text, &no_env)
}

/// Asserts that `text` holds exactly one problem and that it is `want`.
fn assert_problem(text: &str, want: &str) {
    assert_eq!(problems(text), vec![want.to_owned()], "config:\n{text}");
}

fn assert_no_secret(shown: &str) {
    assert!(!shown.contains(CANARY), "a key value leaked: {shown}");
}

fn one_key() -> String {
    format!("[[keys]]\nname = \"a\"\nkey = \"{KEY_A}\"\n")
}

// === defaults ===

#[test]
fn a_single_key_gets_every_default() {
    let config = parse(&format!("[[keys]]\nkey = \"{KEY_A}\"\n"));
    assert_eq!(config.listen, "127.0.0.1:8080".parse().expect("literal"));
    assert_eq!(config.upstream.as_str(), "https://ocr.captchaai.com");
    assert_eq!(config.refresh_interval, Duration::from_secs(300));
    assert_eq!(config.keys.len(), 1);
    let key = &config.keys[0];
    assert_eq!(key.name, "keyAAAAA");
    assert_eq!(key.key.expose(), KEY_A);
    assert_eq!(key.weight, 1.0);
    assert_eq!(key.threads, None);
    assert_eq!(key.upstream, config.upstream);

    let f = &config.failover;
    assert_eq!(f.max_attempts, 3);
    assert!(!f.retry_unsure_submits);
    assert_eq!(f.min_balance, 0.01);
    assert_eq!(f.busy_cooldown, Duration::from_secs(10));
    assert_eq!(f.transient_failures, 3);
    assert_eq!(f.transient_cooldown, Duration::from_secs(30));
    assert_eq!(f.backoff_base, Duration::from_millis(100));
    assert_eq!(f.backoff_max, Duration::from_secs(2));
    assert_eq!(config.pins.ttl, Duration::from_secs(7200));
    assert_eq!(config.pins.max_pins, 1_000_000);
    assert_eq!(config.limits.max_body, 16 * 1024 * 1024);
    assert_eq!(config.timeouts.connect, Duration::from_secs(10));
    assert_eq!(config.timeouts.request, Duration::from_secs(60));
    assert_eq!(config.timeouts.solve, Duration::from_secs(180));
    assert_eq!(config.timeouts.refresh, Duration::from_secs(15));
}

#[test]
fn every_setting_is_read() {
    let text = format!(
        r#"
listen = "127.0.0.1:9090"
upstream = "http://127.0.0.1:9000/prefix/"
refresh_interval = "1h 30m"

[[keys]]
name = "client-a"
key = "{KEY_A}"
weight = 2.5
threads = 50

[[keys]]
name = "client.b_2"
key = "{KEY_B}"
weight = 3

[failover]
max_attempts = 5
retry_unsure_submits = true
min_balance = 0
busy_cooldown = "0s"
transient_failures = 1
transient_cooldown = "1m"
backoff_base = "250ms"
backoff_max = "250ms"

[pins]
ttl = "30m"
max_pins = 10

[limits]
max_body = "1KiB"

[timeouts]
connect = "1s"
request = "2s"
solve = "3s"
refresh = "4s"
"#
    );
    let config = parse(&text);
    assert_eq!(config.listen, "127.0.0.1:9090".parse().expect("literal"));
    assert_eq!(config.upstream.as_str(), "http://127.0.0.1:9000/prefix");
    assert_eq!(config.refresh_interval, Duration::from_secs(5400));
    let [a, b] = &config.keys[..] else {
        panic!("two keys expected: {:?}", config.keys);
    };
    assert_eq!(
        (a.name.as_str(), a.key.expose(), a.weight, a.threads),
        ("client-a", KEY_A, 2.5, Some(50))
    );
    assert_eq!(
        (b.name.as_str(), b.key.expose(), b.weight, b.threads),
        ("client.b_2", KEY_B, 3.0, None)
    );
    assert_eq!(a.upstream.as_str(), "http://127.0.0.1:9000/prefix");
    let f = &config.failover;
    assert_eq!(f.max_attempts, 5);
    assert!(f.retry_unsure_submits);
    assert_eq!(f.min_balance, 0.0);
    assert_eq!(f.busy_cooldown, Duration::ZERO);
    assert_eq!(f.transient_failures, 1);
    assert_eq!(f.transient_cooldown, Duration::from_secs(60));
    assert_eq!(f.backoff_base, Duration::from_millis(250));
    assert_eq!(f.backoff_max, Duration::from_millis(250));
    assert_eq!(config.pins.ttl, Duration::from_secs(1800));
    assert_eq!(config.pins.max_pins, 10);
    assert_eq!(config.limits.max_body, 1024);
    let t = &config.timeouts;
    assert_eq!(
        [t.connect, t.request, t.solve, t.refresh],
        [1, 2, 3, 4].map(Duration::from_secs)
    );
}

#[test]
fn inline_key_tables_work_like_array_tables() {
    let text = format!("keys = [{{ name = \"a\", key = \"{KEY_A}\" }}, {{ key = \"{KEY_B}\" }}]");
    let config = parse(&text);
    let names: Vec<&str> = config.keys.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["a", "keyBBBBB"]);
}

#[test]
fn max_body_takes_an_integer_number_of_bytes() {
    let config = parse(&format!("{}[limits]\nmax_body = 4096\n", one_key()));
    assert_eq!(config.limits.max_body, 4096);
}

#[test]
fn default_impls_match_the_constants() {
    let f = Failover::default();
    assert_eq!(
        (f.max_attempts, f.min_balance, f.backoff_max),
        (
            DEFAULT_MAX_ATTEMPTS,
            DEFAULT_MIN_BALANCE,
            DEFAULT_BACKOFF_MAX
        )
    );
    assert_eq!(Pins::default().ttl, DEFAULT_PIN_TTL);
    assert_eq!(Limits::default().max_body, DEFAULT_MAX_BODY);
    assert_eq!(Timeouts::default().solve, DEFAULT_SOLVE_TIMEOUT);
}

#[test]
fn for_keys_builds_a_default_config_on_an_ephemeral_port() {
    let upstream = Upstream::parse("http://127.0.0.1:9000").expect("valid");
    let key = KeyConfig::new("sim-a", KEY_A, upstream.clone());
    assert_eq!(
        (key.name.as_str(), key.key.expose(), key.weight, key.threads),
        ("sim-a", KEY_A, 1.0, None)
    );
    let config = Config::for_keys(upstream.clone(), vec![key]);
    assert_eq!(config.listen, "127.0.0.1:0".parse().expect("literal"));
    assert_eq!(config.upstream, upstream);
    assert_eq!(config.refresh_interval, DEFAULT_REFRESH_INTERVAL);
    assert_eq!(config.failover.max_attempts, DEFAULT_MAX_ATTEMPTS);
    assert_eq!(config.keys.len(), 1);
}

// === ${VAR} ===

#[test]
fn a_key_can_come_whole_from_the_environment() {
    let env = env_of(&[("CAPTCHAAI_KEY_A", KEY_A)]);
    let config = parse_with(
        "[[keys]]\nname = \"client-a\"\nkey = \"${CAPTCHAAI_KEY_A}\"\n",
        &env,
    );
    assert_eq!(config.keys[0].key.expose(), KEY_A);
}

#[test]
fn variables_can_be_embedded_and_repeated() {
    let env = env_of(&[("HEAD", "keyAAAAA"), ("TAIL", "0123456789abcd01")]);
    let config = parse_with("[[keys]]\nkey = \"${HEAD}-canary-${TAIL}\"\n", &env);
    assert_eq!(config.keys[0].key.expose(), KEY_A);
    assert_eq!(config.keys[0].name, "keyAAAAA");
}

#[test]
fn a_dollar_without_brace_is_literal() {
    let config = parse("[[keys]]\nkey = \"$abc$def0123456789abcdef01234567\"\n");
    assert_eq!(
        config.keys[0].key.expose(),
        "$abc$def0123456789abcdef01234567"
    );
}

#[test]
fn substituted_values_are_trimmed() {
    let env = env_of(&[("K", &format!("  {KEY_A}\n"))]);
    let config = parse_with("[[keys]]\nkey = \"${K}\"\n", &env);
    assert_eq!(config.keys[0].key.expose(), KEY_A);
}

#[test]
fn an_unset_variable_is_named() {
    assert_problem(
        "[[keys]]\nname = \"client-a\"\nkey = \"${CAPTCHAAI_KEY_A}\"\n",
        "keys[0] (\"client-a\").key: environment variable CAPTCHAAI_KEY_A is not set",
    );
}

#[test]
fn every_unset_variable_is_named() {
    assert_eq!(
        problems("[[keys]]\nkey = \"${ONE}x${TWO}\"\n"),
        [
            "keys[0].key: environment variable ONE is not set",
            "keys[0].key: environment variable TWO is not set",
        ]
    );
}

#[test]
fn a_key_empty_after_substitution_is_refused() {
    let env = env_of(&[("EMPTY", " "), ("ALSO", "")]);
    assert_eq!(
        problems_with("[[keys]]\nkey = \"${EMPTY}${ALSO}\"\n", &env),
        ["keys[0].key: is empty after substituting ${EMPTY}, ${ALSO}"]
    );
    assert_problem(
        "[[keys]]\nname = \"a\"\nkey = \"  \"\n",
        "keys[0] (\"a\").key: must not be empty",
    );
}

#[test]
fn malformed_references_are_refused_without_echoing_them() {
    assert_problem(
        "[[keys]]\nkey = \"abc${canary\"\n",
        "keys[0].key: \"${\" without a closing \"}\"",
    );
    assert_problem(
        "[[keys]]\nkey = \"${canary-key}\"\n",
        "keys[0].key: \"${...}\" must hold an environment variable name (A-Z, a-z, 0-9 and '_')",
    );
    assert_problem(
        "[[keys]]\nkey = \"${}\"\n",
        "keys[0].key: \"${...}\" must hold an environment variable name (A-Z, a-z, 0-9 and '_')",
    );
}

#[test]
fn keys_with_inner_whitespace_are_refused() {
    let env = env_of(&[("TWO_LINES", &format!("{KEY_A}\n{KEY_B}"))]);
    assert_eq!(
        problems_with("[[keys]]\nkey = \"${TWO_LINES}\"\n", &env),
        ["keys[0].key: must not contain whitespace or control characters"]
    );
}

// === keys_env ===

#[test]
fn keys_env_appends_trimmed_keys_after_the_file_keys() {
    let env = env_of(&[("POOL", &format!(" {KEY_B} ,, {KEY_C},\n"))]);
    let text = format!("keys_env = \"POOL\"\n{}", one_key());
    let config = parse_with(&text, &env);
    let got: Vec<(&str, &str, f64, Option<u32>)> = config
        .keys
        .iter()
        .map(|k| (k.name.as_str(), k.key.expose(), k.weight, k.threads))
        .collect();
    assert_eq!(
        got,
        [
            ("a", KEY_A, 1.0, None),
            ("keyBBBBB", KEY_B, 1.0, None),
            ("keyCCCCC", KEY_C, 1.0, None),
        ]
    );
}

#[test]
fn keys_env_alone_is_a_pool() {
    let env = env_of(&[("POOL", KEY_A)]);
    let config = parse_with("keys_env = \"POOL\"\n", &env);
    assert_eq!(config.keys.len(), 1);
    assert_eq!(config.keys[0].name, "keyAAAAA");
}

#[test]
fn an_unset_keys_env_adds_nothing_and_is_no_error() {
    let config = parse(&format!("keys_env = \"POOL\"\n{}", one_key()));
    assert_eq!(config.keys.len(), 1);
}

#[test]
fn an_empty_pool_is_refused() {
    assert_problem(
        "",
        "keys: the pool is empty; add a [[keys]] entry or set keys_env",
    );
    assert_problem(
        "keys = []",
        "keys: the pool is empty; add a [[keys]] entry or set keys_env",
    );
}

#[test]
fn a_pool_larger_than_the_cap_is_refused() {
    let many: Vec<String> = (0..=super::keys::MAX_KEYS)
        .map(|i| format!("k{i:031}"))
        .collect();
    let env = env_of(&[("MANY_KEYS", &many.join(","))]);
    assert!(problems_with("keys_env = \"MANY_KEYS\"", &env)
        .contains(&"keys: the pool has 1001 keys; at most 1000 are supported".to_owned()));
}

#[test]
fn an_empty_pool_names_the_keys_env_variable() {
    assert_problem(
        "keys_env = \"CAPTCHAAI_KEYS\"",
        "keys: the pool is empty; add a [[keys]] entry or set keys_env \
         (keys_env names CAPTCHAAI_KEYS, which is not set)",
    );
    let env = env_of(&[("CAPTCHAAI_KEYS", " , ,")]);
    assert_eq!(
        problems_with("keys_env = \"CAPTCHAAI_KEYS\"", &env),
        [
            "keys: the pool is empty; add a [[keys]] entry or set keys_env \
          (keys_env names CAPTCHAAI_KEYS, which holds no keys)"
        ]
    );
}

#[test]
fn keys_env_must_name_a_variable() {
    assert_problem(
        &format!("keys_env = \"MY KEYS\"\n{}", one_key()),
        "keys_env: \"MY KEYS\" is not an environment variable name (A-Z, a-z, 0-9 and '_')",
    );
    assert_problem(
        &format!("keys_env = \"\"\n{}", one_key()),
        "keys_env: \"\" is not an environment variable name (A-Z, a-z, 0-9 and '_')",
    );
}

// === names ===

#[test]
fn short_keys_are_named_by_position() {
    let config = parse("[[keys]]\nkey = \"short-key-1\"\n[[keys]]\nkey = \"short-key-2\"\n");
    let names: Vec<&str> = config.keys.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["keys[0]", "keys[1]"]);
}

#[test]
fn default_names_step_aside_for_taken_names() {
    // Both simulator keys start "simkey-v"; the second default, and any default that a
    // given name already uses, falls back to the position.
    let env = env_of(&[(
        "POOL",
        "simkey-valid-0000000000000000001,simkey-valid-0000000000000000002",
    )]);
    let text = format!(
        "keys_env = \"POOL\"\n[[keys]]\nkey = \"{KEY_A}\"\n[[keys]]\nname = \"keyAAAAA\"\nkey = \"{KEY_B}\"\n"
    );
    let config = parse_with(&text, &env);
    let names: Vec<&str> = config.keys.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["keys[0]", "keyAAAAA", "simkey-v", "keys[3]"]);
}

#[test]
fn default_names_that_are_not_valid_names_fall_back_to_the_position() {
    let config = parse("[[keys]]\nkey = \"key+with/0123456789abcdef0123456789\"\n");
    assert_eq!(config.keys[0].name, "keys[0]");
}

#[test]
fn names_are_checked() {
    let long = "n".repeat(65);
    assert_eq!(
        problems(&format!(
            "[[keys]]\nname = \"\"\nkey = \"{KEY_A}\"\n\
             [[keys]]\nname = \"a b\"\nkey = \"{KEY_B}\"\n\
             [[keys]]\nname = \"{long}\"\nkey = \"{KEY_C}\"\n\
             [[keys]]\nname = 7\nkey = \"k4\"\n"
        )),
        [
            "keys[3].name: must be a string, got an integer".to_owned(),
            "keys[0].name: must not be empty".to_owned(),
            "keys[1] (\"a b\").name: may only contain A-Z, a-z, 0-9, '.', '_' and '-'".to_owned(),
            "keys[2] (a string ending …nnnn).name: must be at most 64 characters, got 65"
                .to_owned(),
        ]
    );
    let config = parse(&format!(
        "[[keys]]\nname = \"{}\"\nkey = \"k\"\n",
        "n".repeat(64)
    ));
    assert_eq!(config.keys[0].name.len(), 64);
}

#[test]
fn duplicate_names_are_refused() {
    assert_problem(
        &format!(
            "[[keys]]\nname = \"a\"\nkey = \"{KEY_A}\"\n[[keys]]\nname = \"a\"\nkey = \"{KEY_B}\"\n"
        ),
        "keys[1] (\"a\").name: duplicate name, keys[0] has it too",
    );
}

#[test]
fn duplicate_keys_name_both_entries_not_the_key() {
    assert_problem(
        &format!(
            "[[keys]]\nname = \"a\"\nkey = \"{KEY_A}\"\n[[keys]]\nname = \"b\"\nkey = \"{KEY_A}\"\n"
        ),
        "keys[1] (\"b\").key: same key as keys[0] (\"a\")",
    );
    let env = env_of(&[("POOL", KEY_A)]);
    assert_eq!(
        problems_with(&format!("keys_env = \"POOL\"\n{}", one_key()), &env),
        ["keys_env[0] (\"keyAAAAA\").key: same key as keys[0] (\"a\")"]
    );
}

// === other key fields ===

#[test]
fn weights_must_be_finite_and_positive() {
    let entry = |w: &str| {
        format!(
            "{}[[keys]]\nname = \"client-b\"\nkey = \"{KEY_B}\"\nweight = {w}\n",
            one_key()
        )
    };
    let cases = [
        ("-1", "keys[1] (\"client-b\").weight: must be > 0, got -1"),
        ("0", "keys[1] (\"client-b\").weight: must be > 0, got 0"),
        ("0.0", "keys[1] (\"client-b\").weight: must be > 0, got 0"),
        (
            "nan",
            "keys[1] (\"client-b\").weight: must be a finite number, got NaN",
        ),
        (
            "inf",
            "keys[1] (\"client-b\").weight: must be a finite number, got inf",
        ),
        (
            "\"2\"",
            "keys[1] (\"client-b\").weight: must be a number, got a string",
        ),
    ];
    for (weight, want) in cases {
        assert_problem(&entry(weight), want);
    }
}

#[test]
fn threads_must_be_a_positive_u32() {
    let entry = |t: &str| format!("[[keys]]\nname = \"a\"\nkey = \"{KEY_A}\"\nthreads = {t}\n");
    let cases = [
        ("0", "keys[0] (\"a\").threads: must be >= 1, got 0"),
        ("-5", "keys[0] (\"a\").threads: must be >= 1, got -5"),
        (
            "4294967296",
            "keys[0] (\"a\").threads: must be at most 4294967295, got 4294967296",
        ),
        (
            "1.5",
            "keys[0] (\"a\").threads: must be a whole number, got a float",
        ),
    ];
    for (threads, want) in cases {
        assert_problem(&entry(threads), want);
    }
}

#[test]
fn a_key_must_be_present_and_a_string() {
    assert_problem(
        "[[keys]]\nname = \"a\"\n",
        "keys[0] (\"a\").key: missing; write key = \"...\" or key = \"${VAR}\"",
    );
    assert_problem(
        "[[keys]]\nkey = 123456789012\n",
        "keys[0].key: must be a string, got an integer",
    );
}

#[test]
fn key_entries_must_be_tables_without_unknown_fields() {
    assert_problem(
        &format!("keys = [\"{KEY_A}\"]"),
        "keys[0]: must be a table with key = \"...\", got a string",
    );
    assert_problem(
        &format!("keys = \"{KEY_A}\""),
        "keys: must be an array of tables ([[keys]] entries), got a string",
    );
    assert_problem(
        &format!("[[keys]]\nkee = \"{KEY_A}\"\n"),
        "keys[0]: unknown field `kee`, expected one of `name`, `key`, `weight`, `threads`, `tier`, `provider`, `upstream`",
    );
}

// === top-level and sections ===

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

// === parse errors ===

#[test]
fn unknown_fields_are_parse_errors_with_a_position() {
    let text = format!("{}[failover]\nmax_attempt = 1\n", one_key());
    let error = error_with(&text, &no_env);
    let ConfigError::Parse(inner) = &error else {
        panic!("expected Parse, got {error}");
    };
    let start = text.find("max_attempt =").expect("in the text");
    assert_eq!(inner.span(), Some(start..start + "max_attempt".len()));
    let shown = error.to_string();
    assert!(
        shown.starts_with("TOML parse error at line 5, column 1\n"),
        "{shown}"
    );
    assert!(
        shown.ends_with("unknown field `max_attempt`, expected one of `max_attempts`, `retry_unsure_submits`, `min_balance`, `busy_cooldown`, `transient_failures`, `transient_cooldown`, `backoff_base`, `backoff_max`, `max_transient_ejection`, `transient_cooldown_max`, `ip_ban_pause`, `retry_budget`, `retry_budget_min`"),
        "{shown}"
    );
    assert!(shown.contains("5 | max_attempt = *\n"), "{shown}");
    let top = error_with(&format!("listn = \"x\"\n{}", one_key()), &no_env);
    assert!(top.to_string().contains("unknown field `listn`"), "{top}");
}

#[test]
fn wrong_types_are_parse_errors() {
    let error = error_with(
        &format!("{}[failover]\nmax_attempts = \"3\"\n", one_key()),
        &no_env,
    );
    let shown = error.to_string();
    assert!(
        shown.ends_with("\ninvalid type: string, expected u32"),
        "{shown}"
    );
    assert!(shown.contains("max_attempts = ***\n"), "{shown}");
}

#[test]
fn a_syntax_error_on_a_key_line_masks_the_key() {
    let text = format!("listen = \"127.0.0.1:8080\"\n[[keys]]\nname = \"a\"\nkey = {KEY_A}\n");
    let error = error_with(&text, &no_env);
    let shown = error.to_string();
    assert_eq!(
        shown,
        format!(
            "TOML parse error at line 4, column 7\n  |\n4 | key = {}\n  |       {}\n\
             string values must be quoted, expected literal string",
            "*".repeat(32),
            "^".repeat(32)
        )
    );
    let ConfigError::Parse(inner) = &error else {
        panic!("expected Parse");
    };
    assert_eq!(
        inner.message(),
        "string values must be quoted, expected literal string"
    );
    assert_no_secret(&inner.to_string());
    assert_no_secret(&format!("{inner:?}"));
}

#[test]
fn other_parse_errors_near_keys_mask_them_too() {
    let cases = [
        format!("[[keys]]\nkey = \"{KEY_A}\"\nkey = \"{KEY_B}\"\n"),
        format!("[[keys]]\nkey = \"{KEY_A}\" trailing\n"),
        format!("[[keys]]\nkey = \"{KEY_A}\n"),
        format!("[[keys]]\nkey = \"{KEY_A}\\q\"\n"),
        format!("[[keys]]\nname = \"a\", key = \"{KEY_A}\"\n"),
        format!("[[keys]]\n{KEY_A}\n"),
        format!("[[keys]]\nkey = \"\"\"\n{KEY_A}\\q\n\"\"\"\n"),
        format!("keys = [{{ key = \"{KEY_A}\" }}, {{ key = {KEY_B} }}]\n"),
    ];
    for text in cases {
        let error = error_with(&text, &no_env);
        assert!(matches!(error, ConfigError::Parse(_)), "{text}: {error}");
        assert!(
            error.to_string().contains("TOML parse error at line"),
            "{error}"
        );
    }
}

// === output never shows a key ===

#[test]
fn debug_and_summary_show_no_key() {
    let env = env_of(&[("POOL", KEY_C)]);
    let text = format!(
        "keys_env = \"POOL\"\n[[keys]]\nname = \"a\"\nkey = \"{KEY_A}\"\nthreads = 5\n[[keys]]\nkey = \"{KEY_B}\"\nweight = 2.5\ntier = 1\n"
    );
    let config = parse_with(&text, &env);
    assert_no_secret(&format!("{config:?}"));
    assert_no_secret(&format!("{config:#?}"));
    let summary = config.summary();
    assert_no_secret(&summary);
    assert_eq!(
        summary,
        "listen 127.0.0.1:8080, upstream https://ocr.captchaai.com, refresh every 5m\n\
         failover: max_attempts 3, retry_unsure_submits false, min_balance 0.01, busy_cooldown 10s, \
         transient_failures 3, transient_cooldown 30s, backoff 100ms to 2s\n\
         pins: ttl 2h, max_pins 1000000; limits: max_body 16777216 bytes; key_headers true\n\
         timeouts: connect 10s, request 1m, solve 3m, refresh 15s\n\
         strategy weighted; capacity: queue_timeout 5s, max_queued 1000, stale_after 5m, slow_start 30s\n\
         scaling: brake_balance 0 (never brakes)\n\
         access: no tokens; admin: on the proxy listeners, no token\n3 keys:\n\
         \x20 name      tier  provider   upstream                   weight  threads  fingerprint\n\
         \x20 a         0     captchaai  https://ocr.captchaai.com  1       5        …cd01\n\
         \x20 keyBBBBB  1     captchaai  https://ocr.captchaai.com  2.5     -        …cd02\n\
         \x20 keyCCCCC  0     captchaai  https://ocr.captchaai.com  1       -        …cd03\n"
    );
}

#[test]
fn a_one_key_summary_says_key() {
    let config = parse(&one_key());
    assert!(
        config.summary().contains("\n1 key:\n"),
        "{}",
        config.summary()
    );
}

// === load ===

#[test]
fn load_reads_a_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("proxy.toml");
    std::fs::write(&path, one_key()).expect("write");
    let config = Config::load(&path).expect("valid file");
    assert_eq!(config.keys[0].name, "a");
}

/// Every shape of config path a user types, with and without `data_dir`: the directory is
/// never empty (a bare `proxy.toml` has the parent `""`), always absolute, and the file's own
/// directory unless `data_dir` says otherwise.
#[test]
fn data_dir_is_the_config_files_directory_for_every_path_shape() {
    let cwd = std::env::current_dir().expect("a current directory");
    let cases: [(&str, Option<&str>, PathBuf); 10] = [
        ("proxy.toml", None, cwd.clone()),
        ("./proxy.toml", None, cwd.join(".")),
        ("conf/proxy.toml", None, cwd.join("conf")),
        ("../proxy.toml", None, cwd.join("..")),
        (
            "/etc/keyrelay/proxy.toml",
            None,
            PathBuf::from("/etc/keyrelay"),
        ),
        ("/proxy.toml", None, PathBuf::from("/")),
        ("proxy.toml", Some("state"), cwd.join("state")),
        ("conf/proxy.toml", Some("state"), cwd.join("conf/state")),
        (
            "proxy.toml",
            Some("/var/lib/keyrelay"),
            PathBuf::from("/var/lib/keyrelay"),
        ),
        ("/", None, cwd.clone()),
    ];
    for (path, configured, want) in cases {
        let got = data_dir_for(Path::new(path), configured.map(PathBuf::from));
        assert_eq!(got, want, "config {path:?}, data_dir {configured:?}");
        assert!(got.is_absolute() && !got.as_os_str().is_empty(), "{got:?}");
    }
}

#[test]
fn load_of_a_bare_file_name_gives_a_usable_data_dir() {
    // The shipped file, by the relative name the README uses; cargo runs tests from the
    // package root, where it is.
    let config = Config::load(Path::new("proxy.toml")).expect("the shipped proxy.toml loads");
    let dir = config.data_dir.expect("load always sets data_dir");
    assert_eq!(dir, std::env::current_dir().expect("a current directory"));
    assert!(dir.is_dir(), "{dir:?}");
}

#[test]
fn load_names_a_missing_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("missing.toml");
    let error = Config::load(&path).expect_err("missing");
    let ConfigError::Io { path: reported, .. } = &error else {
        panic!("expected Io, got {error}");
    };
    assert_eq!(reported, &path);
    let shown = error.to_string();
    assert!(
        shown.starts_with(&format!("cannot read {}: ", path.display())),
        "{shown}"
    );
    assert!(std::error::Error::source(&error).is_some());
}

// === capacity, strategy and tiers ===

#[test]
fn capacity_strategy_and_tier_default_when_absent() {
    let config = parse(&one_key());
    assert_eq!(config.strategy, Strategy::Weighted);
    assert_eq!(config.capacity.queue_timeout, DEFAULT_QUEUE_TIMEOUT);
    assert_eq!(config.capacity.max_queued, DEFAULT_MAX_QUEUED);
    assert_eq!(config.capacity.stale_after, DEFAULT_STALE_AFTER);
    assert_eq!(config.capacity.slow_start, DEFAULT_SLOW_START);
    assert_eq!(config.keys[0].tier, 0);
}

#[test]
fn capacity_strategy_and_tier_are_read() {
    let text = format!(
        "strategy = \"least-loaded\"\n[capacity]\nqueue_timeout = \"0s\"\nmax_queued = 0\n\
         stale_after = \"90s\"\nslow_start = \"0s\"\n{}tier = 2\n",
        one_key()
    );
    let config = parse(&text);
    assert_eq!(config.strategy, Strategy::LeastLoaded);
    assert_eq!(config.capacity.queue_timeout, Duration::ZERO);
    assert_eq!(config.capacity.max_queued, 0);
    assert_eq!(config.capacity.stale_after, Duration::from_secs(90));
    assert_eq!(config.capacity.slow_start, Duration::ZERO);
    assert_eq!(config.keys[0].tier, 2);
    let rr = parse(&format!("strategy = \"round-robin\"\n{}", one_key()));
    assert_eq!(rr.strategy, Strategy::RoundRobin);
}

#[test]
fn an_unknown_strategy_names_the_known_ones() {
    assert_problem(
        &format!("strategy = \"least_conn\"\n{}", one_key()),
        "strategy: \"least_conn\" is not a strategy; use one of \"weighted\", \"least-loaded\", \"round-robin\"",
    );
}

#[test]
fn a_stale_timeout_must_be_positive_and_a_tier_a_whole_number() {
    assert_problem(
        &format!("[capacity]\nstale_after = \"0s\"\n{}", one_key()),
        "capacity.stale_after: must be greater than 0",
    );
    assert_problem(
        &format!("{}tier = -1\n", one_key()),
        "keys[0] (\"a\").tier: must be between 0 and 4294967295, got -1",
    );
    assert_problem(
        &format!("{}tier = \"backup\"\n", one_key()),
        "keys[0] (\"a\").tier: must be a whole number, got a string",
    );
    assert_problem(
        &format!("[capacity]\nqueue_timeout = 5\n{}", one_key()),
        "capacity.queue_timeout: write durations as a string with a unit, e.g. \"30s\" (got the integer 5)",
    );
}

#[test]
fn the_probe_budget_is_read_and_checked() {
    let text = format!("{}[pins]\nprobe_rate = 2.5\nprobe_burst = 40\n", one_key());
    let config = Config::from_toml_str(&text, &no_env).expect("valid");
    assert_eq!((config.pins.probe_rate, config.pins.probe_burst), (2.5, 40));
    let defaults = Config::from_toml_str(&one_key(), &no_env).expect("valid");
    assert_eq!(
        (defaults.pins.probe_rate, defaults.pins.probe_burst),
        (DEFAULT_PROBE_RATE, DEFAULT_PROBE_BURST)
    );
    for (setting, problem) in [
        ("probe_rate = 0.0", "pins.probe_rate: must be > 0"),
        ("probe_rate = -1.0", "pins.probe_rate: must be > 0"),
        ("probe_rate = nan", "pins.probe_rate: must be > 0"),
        ("probe_rate = inf", "pins.probe_rate: must be > 0"),
        ("probe_rate = 2e6", "pins.probe_rate: must be > 0"),
        ("probe_burst = 15", "pins.probe_burst: must be >= 16"),
        ("probe_burst = 0", "pins.probe_burst: must be >= 16"),
        ("probe_burst = 2000000", "pins.probe_burst: must be >= 16"),
    ] {
        let text = format!("{}[pins]\n{setting}\n", one_key());
        let found = problems(&text);
        assert!(
            found.iter().any(|p| p.starts_with(problem)),
            "{setting}: {found:?}"
        );
    }
}

// === a key typed into the wrong field is never echoed ===

/// Where a value can be typed, as the TOML lines that put `value` there, and the field
/// name the error must still give.
fn placements(value: &str) -> Vec<(String, &'static str)> {
    let top = |field: &'static str| (format!("{field} = {value}\n{}", one_key()), field);
    let section = |table: &str, field: &'static str| {
        (
            format!("{}[{table}]\n{field} = {value}\n", one_key()),
            field,
        )
    };
    vec![
        top("listen"),
        top("strategy"),
        top("upstream"),
        top("keys_env"),
        top("data_dir"),
        top("upstream_ca"),
        top("upstream_proxy"),
        top("upstream_no_proxy"),
        top("refresh_interval"),
        section("failover", "max_attempts"),
        section("failover", "min_balance"),
        section("failover", "retry_unsure_submits"),
        section("failover", "busy_cooldown"),
        section("failover", "retry_budget_min"),
        section("capacity", "max_queued"),
        section("capacity", "queue_timeout"),
        section("pins", "max_pins"),
        section("pins", "durable"),
        section("limits", "max_body"),
        section("limits", "max_connections"),
        section("timeouts", "request"),
        section("observability", "key_headers"),
        section("scaling", "brake_balance"),
        (
            format!("[[keys]]\nname = {value}\nkey = \"{KEY_A}\"\n"),
            "name",
        ),
        (
            format!("[[keys]]\nkey = \"{KEY_A}\"\nweight = {value}\n"),
            "weight",
        ),
        (
            format!("[[keys]]\nkey = \"{KEY_A}\"\nthreads = {value}\n"),
            "threads",
        ),
        (
            format!("[[keys]]\nkey = \"{KEY_A}\"\ntier = {value}\n"),
            "tier",
        ),
    ]
}

/// The ways a secret ends up in a value: as a string, inside an array or an inline table.
fn wrappings(secret: &str) -> Vec<String> {
    vec![
        format!("\"{secret}\""),
        format!("'{secret}'"),
        format!("[\"{secret}\"]"),
        format!("{{ key = \"{secret}\" }}"),
        format!("\"${{{secret}}}\""),
    ]
}

fn assert_not_echoed(text: &str, secret: &str, field: &str) {
    let Err(error) = Config::from_toml_str(text, &no_env) else {
        // Some placements are valid (a key-shaped data_dir, say): nothing to show then.
        return;
    };
    for shown in [error.to_string(), format!("{error:?}")] {
        assert!(
            !shown.contains(secret),
            "the value leaked for {field}:\n{text}\n->\n{shown}"
        );
        // No run of the secret longer than a fingerprint shows.
        let longest =
            (0..secret.len().saturating_sub(8)).find(|&i| shown.contains(&secret[i..i + 9]));
        assert!(longest.is_none(), "a piece leaked for {field}:\n{shown}");
    }
    assert!(
        error.to_string().contains(field),
        "the error does not name {field}:\n{error}"
    );
}

#[test]
fn a_key_in_keys_env_is_not_echoed() {
    let secret = "0123456789abcdef0123456789abcdef";
    for value in [secret, "abcdef0123456789abcdef0123456789"] {
        let text = format!("keys_env = \"{value}\"\n");
        let error = error_with(&text, &no_env);
        let shown = error.to_string();
        assert!(!shown.contains(value), "{shown}");
        assert!(shown.contains("…"), "a fingerprint at most: {shown}");
    }
}

#[test]
fn type_errors_name_the_field_and_type_but_not_the_value() {
    let error = error_with(
        &format!("{}[pins]\nmax_pins = \"987654321000\"\n", one_key()),
        &no_env,
    );
    let shown = error.to_string();
    assert!(!shown.contains("987654321000"), "{shown}");
    assert!(shown.contains("max_pins = **************"), "{shown}");
    assert!(
        shown.ends_with("invalid type: string, expected usize"),
        "{shown}"
    );
    let error = error_with(&format!("keys_env = 987654321\n{}", one_key()), &no_env);
    let shown = error.to_string();
    assert!(!shown.contains("987654321"), "{shown}");
    assert!(shown.contains("keys_env = *********"), "{shown}");
    assert!(
        shown.ends_with("invalid type: integer, expected a string"),
        "{shown}"
    );
}

#[test]
fn a_pasted_key_as_a_field_or_table_name_is_not_echoed() {
    let secret = "0123456789abcdef0123456789abcdef";
    for text in [
        format!("{secret} = 1\n{}", one_key()),
        format!("{}[{secret}]\nx = 1\n", one_key()),
        format!("{}[failover]\n{secret} = 1\n", one_key()),
        format!("[[keys]]\nkey = \"{KEY_A}\"\n{secret} = 1\n"),
    ] {
        let error = error_with(&text, &no_env);
        for shown in [error.to_string(), format!("{error:?}")] {
            assert!(!shown.contains(secret), "{text}\n->\n{shown}");
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Any key-shaped secret, in any field, wrapped any way: the error names the field and
    /// shows at most a fingerprint.
    #[test]
    fn no_field_echoes_a_key_typed_into_it(
        secret in "[a-f0-9]{32}|[A-Za-z0-9]{16,40}|[a-z0-9]{8}-[a-z0-9]{4}-[a-z0-9]{4}-[a-z0-9]{12}",
    ) {
        for value in wrappings(&secret) {
            for (text, field) in placements(&value) {
                assert_not_echoed(&text, &secret, field);
            }
        }
    }
}

mod cluster;
mod exposure;
mod providers;
mod scaling;

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

//! No key value escapes: not in `Debug` or the summary, and not in the error for a key
//! typed into the wrong field.

use super::*;

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
         polling: interval 5s, first auto, keep_answers 10m (at most 100000), orphan_after 30s (20 polls a second)\n\
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

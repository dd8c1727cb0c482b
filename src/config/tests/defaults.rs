//! The defaults, and every setting read when it is given.

use super::*;

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

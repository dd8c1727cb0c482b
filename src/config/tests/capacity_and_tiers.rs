//! `[capacity]`, the selection strategy, tiers and the probe budget.

use super::*;

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
    let cheapest = parse(&format!("strategy = \"cheapest\"\n{}", one_key()));
    assert_eq!(cheapest.strategy, Strategy::Cheapest);
}

#[test]
fn an_unknown_strategy_names_the_known_ones() {
    assert_problem(
        &format!("strategy = \"least_conn\"\n{}", one_key()),
        "strategy: \"least_conn\" is not a strategy; use one of \"weighted\", \"least-loaded\", \"round-robin\", \"cheapest\", \"fastest\"",
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

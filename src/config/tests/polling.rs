//! `[polling]`: the defaults the issue names (5 s, the provider's advice first, answers kept
//! ten minutes), `"0s"` as the switch that turns shaping off, and a clear message for each
//! wrong value.

use super::*;

fn polling(body: &str) -> String {
    format!("{}[polling]\n{body}\n", one_key())
}

#[test]
fn the_defaults_shape_every_poll_as_the_services_advise() {
    let p = parse(&one_key()).polling;
    assert_eq!(p, Polling::default());
    assert_eq!(p.interval, Duration::from_secs(5));
    assert_eq!(p.first, FirstPoll::Auto);
    assert_eq!(p.keep_answers, Duration::from_secs(600));
    assert_eq!(p.keep_answers_max, 100_000);
    assert_eq!(p.orphan_after, Duration::from_secs(30));
    assert_eq!(p.orphan_polls_per_second, 20.0);
    assert!(p.shapes());
}

#[test]
fn every_setting_is_read() {
    let p = parse(&polling(
        "interval = \"2s\"\nfirst = \"1s\"\nkeep_answers = \"1m\"\nkeep_answers_max = 7\norphan_after = \"10s\"\norphan_polls_per_second = 2.5",
    ))
    .polling;
    assert_eq!(p.interval, Duration::from_secs(2));
    assert_eq!(p.first, FirstPoll::After(Duration::from_secs(1)));
    assert_eq!(p.keep_answers, Duration::from_secs(60));
    assert_eq!(p.keep_answers_max, 7);
    assert_eq!(p.orphan_after, Duration::from_secs(10));
    assert_eq!(p.orphan_polls_per_second, 2.5);
    assert_eq!(
        parse(&polling("first = \"auto\"")).polling.first,
        FirstPoll::Auto
    );
}

#[test]
fn an_interval_of_zero_turns_shaping_off() {
    let p = parse(&polling("interval = \"0s\"")).polling;
    assert!(!p.shapes());
}

#[test]
fn wrong_values_are_refused_with_the_field_named() {
    assert_problem(
        &polling("interval = 5"),
        "polling.interval: write durations as a string with a unit, e.g. \"30s\" (got the integer 5)",
    );
    assert_problem(
        &polling("first = 5"),
        "polling.first: must be \"auto\" or a duration such as \"5s\", got an integer",
    );
    assert_problem(
        &polling("orphan_after = \"0s\""),
        "polling.orphan_after: must be greater than 0",
    );
    for rate in ["0", "-1", "1e9", "nan"] {
        let problems = problems(&polling(&format!("orphan_polls_per_second = {rate}")));
        assert_eq!(problems.len(), 1, "{rate}: {problems:?}");
        assert!(
            problems[0].starts_with("polling.orphan_polls_per_second: must be > 0 and <= 10000"),
            "{rate}: {problems:?}"
        );
    }
    let unknown = error_with(&polling("intervall = \"5s\""), &no_env).to_string();
    assert!(
        unknown.contains("unknown field `intervall`, expected one of `interval`"),
        "{unknown}"
    );
}

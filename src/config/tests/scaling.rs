//! `[scaling]`: `brake_balance` is a finite number of 0 or more, refused otherwise with a
//! message naming the field, because a NaN or negative brake would silently never brake (or
//! always brake) the fleet an autoscaler sizes from `/scaling`.

use super::*;

fn brake(value: &str) -> String {
    format!("{}[scaling]\nbrake_balance = {value}\n", one_key())
}

#[test]
fn the_brake_defaults_to_zero_which_never_brakes() {
    assert_eq!(
        parse(&one_key()).scaling.brake_balance,
        DEFAULT_BRAKE_BALANCE
    );
    assert_eq!(DEFAULT_BRAKE_BALANCE, 0.0);
    let empty = format!("{}[scaling]\n", one_key());
    assert_eq!(parse(&empty).scaling.brake_balance, 0.0);
}

#[test]
fn zero_and_positive_brakes_are_accepted() {
    for (value, want) in [
        ("0", 0.0),
        ("0.0", 0.0),
        ("12.5", 12.5),
        ("5", 5.0),
        ("1e3", 1000.0),
    ] {
        assert_eq!(parse(&brake(value)).scaling.brake_balance, want, "{value}");
    }
}

#[test]
fn a_negative_zero_brake_is_zero() {
    // TOML has -0.0; it compares equal to 0, and must not show as "-0" in the summary or
    // the keyrelay_scaling_brake_balance gauge.
    let config = parse(&brake("-0.0"));
    assert!(
        config.scaling.brake_balance.is_sign_positive(),
        "{}",
        config.scaling.brake_balance
    );
    assert!(
        config
            .summary()
            .contains("\nscaling: brake_balance 0 (never brakes)\n"),
        "{}",
        config.summary()
    );
}

#[test]
fn the_summary_shows_the_brake() {
    let summary = parse(&brake("12.5")).summary();
    assert!(
        summary.contains("\nscaling: brake_balance 12.5\n"),
        "{summary}"
    );
}

#[test]
fn a_brake_that_is_not_a_finite_number_is_refused() {
    for (value, shown) in [
        ("nan", "NaN"),
        ("+nan", "NaN"),
        ("-nan", "NaN"),
        ("inf", "inf"),
        ("+inf", "inf"),
        ("-inf", "-inf"),
    ] {
        assert_problem(
            &brake(value),
            &format!("scaling.brake_balance: must be a finite number, got {shown}"),
        );
    }
}

#[test]
fn a_negative_brake_is_refused() {
    assert_problem(&brake("-1"), "scaling.brake_balance: must be >= 0, got -1");
    assert_problem(
        &brake("-0.01"),
        "scaling.brake_balance: must be >= 0, got -0.01",
    );
}

#[test]
fn a_brake_of_the_wrong_type_names_the_field() {
    for value in ["\"5\"", "true", "[5]"] {
        let error = error_with(&brake(value), &no_env);
        assert!(matches!(error, ConfigError::Parse(_)), "{value}: {error}");
        let shown = error.to_string();
        assert!(shown.contains("brake_balance"), "{value}: {shown}");
        assert!(shown.contains("expected f64"), "{value}: {shown}");
    }
}

#[test]
fn a_bad_brake_is_listed_with_the_other_problems() {
    let text = format!(
        "listen = \"nope\"\n{}[scaling]\nbrake_balance = -3\n",
        one_key()
    );
    assert_eq!(
        problems(&text),
        [
            "listen: \"nope\" is not an IP address and port such as \"127.0.0.1:8080\"",
            "scaling.brake_balance: must be >= 0, got -3",
        ]
    );
}

//! TOML parse errors: with a position, and with any key near them masked.

use super::*;

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

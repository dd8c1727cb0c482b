//! Unit tests for `proxy.toml` parsing and validation: every rule with its exact message,
//! the defaults, `${VAR}` and `keys_env`, and that no key value escapes. The helpers they
//! share are here; each concern has its file under `tests/`.

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

mod budgets;
mod capacity_and_tiers;
mod cluster;
mod defaults;
mod environment;
mod exposure;
mod key_entries;
mod load;
mod parse_errors;
mod polling;
mod providers;
mod scaling;
mod secrets;
mod sections;

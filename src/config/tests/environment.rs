//! Keys from the environment: `${VAR}` in the file, and `keys_env`.

use super::*;

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

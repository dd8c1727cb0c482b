//! Each key's entry: its name (given or by default), weight, threads and fields.

use super::*;

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

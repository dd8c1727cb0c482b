//! Every TOML file the project ships or keeps as a fixture is parsed here: `./proxy.toml`
//! must be valid with no environment, `tests/fixtures/config/valid/*.toml` must load, and
//! each `tests/fixtures/config/invalid/*.toml` must fail with the text its first line names.

use std::fs;
use std::path::{Path, PathBuf};

use keyrelay::config::{ConfigError, Failover, Limits, Observability, Pins, Scaling, Timeouts};
use keyrelay::Config;

/// Fixture keys carry "canary" where neither a default name nor a fingerprint reaches, so
/// finding it in any output means a key leaked.
const CANARY: &str = "canary";

/// The fixed environment fixtures see; the process environment is never read or changed.
fn fixture_env(name: &str) -> Option<String> {
    let value = match name {
        "KEYRELAY_TEST_KEY" => "envKKKKK-canary-0000000000000009",
        "KEYRELAY_TEST_KEYS" => {
            "envLLLLL-canary-0000000000000010, envMMMMM-canary-0000000000000011"
        }
        "KEYRELAY_TEST_EMPTY" => "",
        _ => return None,
    };
    Some(value.to_owned())
}

fn no_env(_: &str) -> Option<String> {
    None
}

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The `.toml` files of a fixture directory, sorted so failures are reported stably.
fn fixtures(kind: &str) -> Vec<PathBuf> {
    let dir = manifest_dir().join("tests/fixtures/config").join(kind);
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("readable directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    files.sort();
    files
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn key_names(config: &Config) -> Vec<&str> {
    config.keys.iter().map(|k| k.name.as_str()).collect()
}

fn assert_no_leak(what: &str, shown: &str) {
    assert!(
        !shown.contains(CANARY),
        "{what} shows a key value:\n{shown}"
    );
}

// === ./proxy.toml ===

fn shipped() -> String {
    read(&manifest_dir().join("proxy.toml"))
}

#[test]
fn shipped_proxy_toml_is_valid_with_no_environment_and_targets_the_simulator() {
    let config =
        Config::from_toml_str(&shipped(), &no_env).unwrap_or_else(|e| panic!("proxy.toml: {e}"));
    assert_eq!(config.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(config.upstream.as_str(), "http://127.0.0.1:9000");
    let keys: Vec<(&str, &str, f64, Option<u32>)> = config
        .keys
        .iter()
        .map(|k| (k.name.as_str(), k.key.expose(), k.weight, k.threads))
        .collect();
    assert_eq!(
        keys,
        [
            ("sim-a", "simkey-valid-0000000000000000001", 1.0, Some(5)),
            ("sim-b", "simkey-valid-0000000000000000002", 2.0, Some(5)),
        ]
    );
}

#[test]
fn shipped_proxy_toml_shows_the_defaults() {
    // The file documents the defaults by setting them; this keeps it honest when one moves.
    let config = Config::from_toml_str(&shipped(), &no_env).expect("valid");
    assert_eq!(
        config.refresh_interval,
        keyrelay::config::DEFAULT_REFRESH_INTERVAL
    );
    assert_eq!(
        format!("{:?}", config.failover),
        format!("{:?}", Failover::default())
    );
    assert_eq!(
        format!("{:?}", config.pins),
        format!("{:?}", Pins::default())
    );
    assert_eq!(
        format!("{:?}", config.limits),
        format!("{:?}", Limits::default())
    );
    assert_eq!(
        format!("{:?}", config.timeouts),
        format!("{:?}", Timeouts::default())
    );
    assert_eq!(
        format!("{:?}", config.observability),
        format!("{:?}", Observability::default())
    );
    assert_eq!(
        format!("{:?}", config.scaling),
        format!("{:?}", Scaling::default())
    );
}

#[test]
fn shipped_proxy_toml_summary_is_the_one_the_docs_show() {
    let config = Config::from_toml_str(&shipped(), &no_env).expect("valid");
    let summary = config.summary();
    let docs = read(&manifest_dir().join("docs/configuration.md"));
    assert!(
        docs.contains(&summary),
        "docs/configuration.md must show this summary:\n{summary}"
    );
}

#[test]
fn shipped_proxy_toml_loads_from_disk() {
    let config = Config::load(&manifest_dir().join("proxy.toml"))
        .unwrap_or_else(|e| panic!("proxy.toml: {e}"));
    assert_eq!(key_names(&config), ["sim-a", "sim-b"]);
}

#[test]
fn shipped_proxy_toml_switches_to_the_real_service_by_swapping_commented_lines() {
    let text = shipped();
    let mut switched = Vec::new();
    for line in text.lines() {
        match line {
            "upstream = \"http://127.0.0.1:9000\"" => {}
            "key = \"simkey-valid-0000000000000000001\"" => {}
            "key = \"simkey-valid-0000000000000000002\"" => {}
            "# upstream = \"https://ocr.captchaai.com\"" => switched.push(&line[2..]),
            "# key = \"${CAPTCHAAI_KEY_A}\"" | "# key = \"${CAPTCHAAI_KEY_B}\"" => {
                switched.push(&line[2..]);
            }
            other => switched.push(other),
        }
    }
    let switched = switched.join("\n");
    assert!(switched.contains("${CAPTCHAAI_KEY_A}"), "{switched}");
    let env = |name: &str| match name {
        "CAPTCHAAI_KEY_A" => Some("realAAAA-canary-0123456789abcdef".to_owned()),
        "CAPTCHAAI_KEY_B" => Some("realBBBB-canary-0123456789abcdef".to_owned()),
        _ => None,
    };
    let config = Config::from_toml_str(&switched, &env)
        .unwrap_or_else(|e| panic!("switched proxy.toml: {e}"));
    assert_eq!(config.upstream.as_str(), "https://ocr.captchaai.com");
    assert!(config.upstream.is_https());
    assert_eq!(
        config.keys[0].key.expose(),
        "realAAAA-canary-0123456789abcdef"
    );
    assert_eq!(key_names(&config), ["sim-a", "sim-b"]);
    // Without the variables it must fail, naming them.
    let error = Config::from_toml_str(&switched, &no_env).expect_err("variables unset");
    let shown = error.to_string();
    assert!(
        shown.contains("keys[0] (\"sim-a\").key: environment variable CAPTCHAAI_KEY_A is not set"),
        "{shown}"
    );
}

// === fixtures ===

#[test]
fn every_valid_fixture_loads() {
    let files = fixtures("valid");
    assert!(files.len() >= 6, "too few valid fixtures: {files:?}");
    for path in files {
        let config = Config::from_toml_str(&read(&path), &fixture_env)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!config.keys.is_empty(), "{}", path.display());
        assert_no_leak(&format!("{} summary", path.display()), &config.summary());
        assert_no_leak(&format!("{} Debug", path.display()), &format!("{config:?}"));
    }
}

#[test]
fn valid_fixtures_name_their_keys_as_documented() {
    let cases: [(&str, &[&str]); 7] = [
        ("minimal.toml", &["fixAAAAA"]),
        (
            "full.toml",
            &["client-a", "client.b_2", "envLLLLL", "envMMMMM"],
        ),
        ("env_key.toml", &["whole", "embedded"]),
        ("keys_env_only.toml", &["envLLLLL", "envMMMMM"]),
        ("keys_env_unset.toml", &["fixAAAAA"]),
        ("inline_keys.toml", &["a", "fixBBBBB"]),
        ("short_keys.toml", &["keys[0]", "keys[1]"]),
    ];
    let dir = manifest_dir().join("tests/fixtures/config/valid");
    for (file, names) in cases {
        let config = Config::from_toml_str(&read(&dir.join(file)), &fixture_env)
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(key_names(&config), names, "{file}");
    }
}

#[test]
fn every_invalid_fixture_fails_with_its_expected_message() {
    let files = fixtures("invalid");
    assert!(files.len() >= 14, "too few invalid fixtures: {files:?}");
    for path in files {
        let text = read(&path);
        let expect = text
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{}: first line must be `# expect: <text>`", path.display()))
            .trim_end();
        assert!(!expect.is_empty(), "{}: empty expectation", path.display());
        let error = match Config::from_toml_str(&text, &fixture_env) {
            Ok(_) => panic!("{}: loaded, expected an error", path.display()),
            Err(e) => e,
        };
        let shown = match &error {
            ConfigError::Invalid(problems) => format!("{error}\n{}", problems.join("\n")),
            other => other.to_string(),
        };
        assert!(
            shown.contains(expect),
            "{}: expected the error to contain\n  {expect}\ngot\n{shown}",
            path.display()
        );
        assert_no_leak(&format!("{} Display", path.display()), &shown);
        assert_no_leak(&format!("{} Debug", path.display()), &format!("{error:?}"));
    }
}

//! `provider` and `upstream` on `[[keys]]`: the default, every name, where each key's
//! requests go, and the messages for what is wrong.

use super::*;
use crate::provider::Provider;

fn key_with(extra: &str) -> String {
    format!("[[keys]]\nname = \"a\"\nkey = \"{KEY_A}\"\n{extra}\n")
}

#[test]
fn a_key_without_a_provider_is_captchaais_at_the_global_upstream() {
    let config = parse(&format!(
        "upstream = \"http://127.0.0.1:9/base\"\n{}",
        one_key()
    ));
    assert_eq!(config.keys[0].provider, Provider::CaptchaAi);
    assert_eq!(config.keys[0].upstream, config.upstream);
    let config = parse(&one_key());
    assert_eq!(
        config.keys[0].upstream.as_str(),
        "https://ocr.captchaai.com"
    );
}

#[test]
fn every_provider_is_read_and_sends_to_its_own_host_unless_told_otherwise() {
    for provider in Provider::ALL {
        let text = format!(
            "upstream = \"http://127.0.0.1:9\"\n{}",
            key_with(&format!("provider = \"{}\"", provider.name()))
        );
        let config = parse(&text);
        let key = &config.keys[0];
        assert_eq!(key.provider, provider);
        // CaptchaAI keys follow the global upstream (a simulator, a regional host);
        // the others go to their own service.
        let expected = if provider == Provider::CaptchaAi {
            "http://127.0.0.1:9"
        } else {
            provider.default_upstream()
        };
        assert_eq!(key.upstream.as_str(), expected, "{provider}");
    }
}

#[test]
fn a_keys_own_upstream_wins_for_any_provider() {
    for provider in ["captchaai", "2captcha", "RuCaptcha"] {
        let text = key_with(&format!(
            "provider = \"{provider}\"\nupstream = \"http://127.0.0.1:7/two/\""
        ));
        let config = parse(&text);
        assert_eq!(config.keys[0].upstream.as_str(), "http://127.0.0.1:7/two");
    }
}

#[test]
fn an_unknown_provider_names_the_known_ones() {
    assert_problem(
        &key_with("provider = \"anticaptcha\""),
        "keys[0] (\"a\").provider: \"anticaptcha\" is not a known provider; use one of \"captchaai\", \"2captcha\", \"rucaptcha\", \"capmonster\", \"solvecaptcha\"",
    );
    assert_problem(
        &key_with("provider = 2"),
        "keys[0] (\"a\").provider: must be a string, got an integer",
    );
}

#[test]
fn a_bad_key_upstream_is_named_without_its_value() {
    let shown = problems(&key_with("upstream = \"ftp://user:hunter2@example.com\""));
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert!(
        shown[0].starts_with("keys[0] (\"a\").upstream: "),
        "{shown:?}"
    );
    assert!(!shown[0].contains("hunter2"), "{shown:?}");
    assert_problem(
        &key_with("upstream = 5"),
        "keys[0] (\"a\").upstream: must be a string, got an integer",
    );
}

#[test]
fn a_pasted_key_in_provider_is_not_echoed() {
    let shown = problems(&key_with(&format!("provider = \"{KEY_B}\"")));
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_no_secret(&shown[0]);
}

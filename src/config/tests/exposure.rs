//! `[tls]`, `[forward]`, `[ca]`, `[access]` and `[admin]`: every rule with its message, the
//! exposure rule (no unauthenticated listener off loopback), and that no token escapes.

use super::*;

/// Tokens carry the same canary as the test keys: any output containing it leaked.
const TOKEN_A: &str = "tokAAAAA-canary-0123456789abcd11";
const TOKEN_B: &str = "tokBBBBB-canary-0123456789abcd12";

fn two_keys() -> String {
    format!(
        "[[keys]]\nname = \"a\"\nkey = \"{KEY_A}\"\n\n[[keys]]\nname = \"b\"\nkey = \"{KEY_B}\"\ntier = 1\n"
    )
}

fn token(name: &str, value: &str, extra: &str) -> String {
    format!("\n[[access.tokens]]\nname = \"{name}\"\ntoken = \"{value}\"\n{extra}\n")
}

// === the exposure rule ===

#[test]
fn no_section_keeps_todays_behaviour() {
    let config = parse(&one_key());
    assert!(config.tls.is_none());
    assert!(config.access.tokens.is_empty());
    assert!(!config.access.open);
    assert_eq!(config.forward.tunnel, Tunnel::All);
    assert!(config.forward.intercept.is_none());
    assert!(config.ca.files.is_none());
    assert!(config.admin.listen.is_none() && config.admin.token.is_none());
}

const ADMIN_TOKEN_MISSING: &str = "admin.token: missing; ";

#[test]
fn a_non_loopback_listener_needs_tokens_or_open() {
    let text = format!("listen = \"0.0.0.0:8080\"\n{}", one_key());
    let found = problems(&text);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].starts_with("listen: 0.0.0.0:8080 is not a loopback address, and no [[access.tokens]] are configured"),
        "{found:?}"
    );
    assert!(found[0].contains("access.open = true"), "{found:?}");
    assert!(found[1].starts_with(ADMIN_TOKEN_MISSING), "{found:?}");

    // Open, the proxy may listen anywhere, but the admin API then needs its token, even
    // on a loopback listener of its own: a relayed request reaches it from loopback.
    let open = format!("{text}\n[access]\nopen = true\n");
    let found = problems(&open);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with(&format!(
            "{ADMIN_TOKEN_MISSING}listen 0.0.0.0:8080 is not a loopback address, so the admin API cannot trust a caller for being on loopback"
        )),
        "{found:?}"
    );
    let found = problems(&format!("{open}\n[admin]\nlisten = \"127.0.0.1:9090\"\n"));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with(ADMIN_TOKEN_MISSING), "{found:?}");
    let config = parse(&format!(
        "{open}\n[admin]\nlisten = \"127.0.0.1:9090\"\ntoken = \"{TOKEN_B}\"\n"
    ));
    assert!(config.access.open);
    // With tokens the proxy may listen anywhere; the admin API then needs its token.
    let with_tokens = format!("{text}{}", token("t", TOKEN_A, ""));
    let found = problems(&with_tokens);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with(ADMIN_TOKEN_MISSING), "{found:?}");
    let config = parse(&format!("{with_tokens}\n[admin]\ntoken = \"{TOKEN_B}\"\n"));
    assert_eq!(config.access.tokens.len(), 1);
}

#[test]
fn tokens_make_the_admin_token_required_on_loopback_too() {
    // A token holder could otherwise tunnel or relay to the loopback admin listener.
    for admin in ["", "[admin]\nlisten = \"127.0.0.1:9090\"\n"] {
        let text = format!("{}{}{admin}", one_key(), token("t", TOKEN_A, ""));
        let found = problems(&text);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with(&format!(
                "{ADMIN_TOKEN_MISSING}[[access.tokens]] are configured, so the admin API cannot trust a caller for being on loopback"
            )),
            "{found:?}"
        );
        assert_no_secret(&found[0]);
        let fixed = if admin.is_empty() {
            format!("{text}[admin]\ntoken = \"{TOKEN_B}\"\n")
        } else {
            format!("{text}token = \"{TOKEN_B}\"\n")
        };
        assert_eq!(parse(&fixed).admin.token.unwrap().expose(), TOKEN_B);
    }
    // Without tokens, on loopback only, nothing is needed: callers are this host's.
    parse(&format!(
        "{}[admin]\nlisten = \"127.0.0.1:9090\"\n",
        one_key()
    ));
}

#[test]
fn loopback_listeners_need_nothing() {
    for listen in ["127.0.0.1:8080", "[::1]:8080", "127.0.0.2:0"] {
        parse(&format!(
            "listen = \"{listen}\"\n[tls]\nlisten = \"127.0.0.1:8443\"\n{}",
            one_key()
        ));
    }
}

#[test]
fn the_tls_listener_and_the_admin_listener_follow_the_rule_too() {
    let found = problems(&format!(
        "[tls]\nlisten = \"0.0.0.0:8443\"\n[admin]\nlisten = \"0.0.0.0:9090\"\n{}",
        one_key()
    ));
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].starts_with("tls.listen: 0.0.0.0:8443 is not a loopback address"));
    assert!(
        found[1].starts_with(&format!(
            "{ADMIN_TOKEN_MISSING}admin.listen 0.0.0.0:9090 is not a loopback address"
        )),
        "{found:?}"
    );
}

// === [tls], [forward], [ca] ===

#[test]
fn tls_needs_a_listen_address_and_both_files_or_none() {
    let found = problems(&format!("[tls]\ncert = \"c.pem\"\n{}", one_key()));
    assert_eq!(
        found,
        ["tls.listen: missing; [tls] needs an address such as \"127.0.0.1:8443\""]
    );
    let found = problems(&format!(
        "[tls]\nlisten = \"127.0.0.1:8443\"\ncert = \"c.pem\"\n[ca]\nkey = \"k.pem\"\n{}",
        one_key()
    ));
    assert_eq!(
        found,
        [
            "tls.key: missing; tls.cert needs the file of its private key",
            "ca.cert: missing; ca.key needs the file of its certificate"
        ]
    );
    let found = problems(&format!(
        "listen = \"127.0.0.1:8443\"\n[tls]\nlisten = \"127.0.0.1:8443\"\n{}",
        one_key()
    ));
    assert_eq!(found, ["tls.listen: must differ from listen"]);
    let found = problems(&format!("[tls]\nlisten = \"nowhere\"\n{}", one_key()));
    assert_eq!(
        found,
        ["tls.listen: \"nowhere\" is not an IP address and port such as \"127.0.0.1:8443\""]
    );
}

#[test]
fn forward_allow_and_tunnel_idle_are_read_and_bad_entries_named() {
    let config = parse(&format!(
        "[forward]\nallow = [\"db.internal:5432\", \"10.0.0.0/8:*\", \"[fd00::/8]:443\"]\n\
         [timeouts]\ntunnel_idle = \"90s\"\n{}",
        one_key()
    ));
    let shown: Vec<String> = config
        .forward
        .allow
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        shown,
        ["db.internal:5432", "10.0.0.0/8:*", "[fd00::/8]:443"]
    );
    assert_eq!(config.timeouts.tunnel_idle, Duration::from_secs(90));
    let defaults = parse(&one_key());
    assert!(defaults.forward.allow.is_empty());
    assert_eq!(defaults.timeouts.tunnel_idle, Duration::from_secs(300));

    let found = problems(&format!(
        "[forward]\nallow = [\"ok.example:443\", \"no-port.example\", \"::1:22\"]\n\
         [timeouts]\ntunnel_idle = \"0s\"\n{}",
        one_key()
    ));
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found[0].starts_with("timeouts.tunnel_idle"), "{found:?}");
    // Long values are shown masked, as any value that could be a secret.
    assert!(
        found[1].starts_with("forward.allow[1]: ") && found[1].contains(" is not host:port"),
        "{found:?}"
    );
    assert!(
        found[2].starts_with("forward.allow[2]: \"::1:22\""),
        "{found:?}"
    );
}

#[test]
fn tls_names_and_intercepted_hosts_are_host_names() {
    let config = parse(&format!(
        "[tls]\nlisten = \"127.0.0.1:8443\"\nnames = [\"Keyrelay.Internal\", \"10.0.0.5\", \"keyrelay.internal\"]\n\
         [forward]\nintercept = [\"OCR.captchaai.com\", \"captcha.example\"]\ntunnel = \"none\"\n{}",
        one_key()
    ));
    let tls = config.tls.expect("tls");
    assert_eq!(tls.names, ["keyrelay.internal", "10.0.0.5"]);
    assert_eq!(tls.files, None);
    assert_eq!(
        config.forward.intercept.as_deref(),
        Some(&["ocr.captchaai.com".to_owned(), "captcha.example".to_owned()][..])
    );
    assert_eq!(config.forward.tunnel, Tunnel::None);

    let found = problems(&format!(
        "[tls]\nlisten = \"127.0.0.1:8443\"\nnames = [\"https://x\"]\n\
         [forward]\nintercept = [\"x.test:443\"]\ntunnel = \"some\"\n{}",
        one_key()
    ));
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found[0].starts_with("tls.names[0]: \"https://x\" is not a host name"));
    assert_eq!(
        found[1],
        "forward.tunnel: \"some\" is not \"all\" or \"none\""
    );
    assert!(found[2].starts_with("forward.intercept[0]: \"x.test:443\" is not a host name"));
}

#[test]
fn certificate_paths_are_relative_to_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.toml");
    std::fs::write(
        &path,
        format!(
            "[tls]\nlisten = \"127.0.0.1:8443\"\ncert = \"tls/cert.pem\"\nkey = \"/etc/k.pem\"\n\
             [ca]\ncert = \"ca.pem\"\nkey = \"ca.key\"\n{}",
            one_key()
        ),
    )
    .unwrap();
    let config = Config::load(&path).unwrap();
    let tls = config.tls.unwrap().files.unwrap();
    let base = std::path::absolute(dir.path()).unwrap();
    assert_eq!(tls.cert, base.join("tls/cert.pem"));
    assert_eq!(tls.key, PathBuf::from("/etc/k.pem"));
    let ca = config.ca.files.unwrap();
    assert_eq!(
        (ca.cert, ca.key),
        (base.join("ca.pem"), base.join("ca.key"))
    );
}

// === [[access.tokens]] ===

#[test]
fn tokens_are_read_with_their_limits_and_variables() {
    let text = format!(
        "{}{}{}",
        two_keys(),
        token(
            "client-a",
            "${TOKEN_A}",
            "keys = [\"a\"]\ntiers = [1]\nmax_threads = 20\nmax_tunnels = 3"
        ),
        token("client-b", TOKEN_B, "")
    );
    let text = format!("{text}\n[admin]\ntoken = \"admin-token-0123456789\"\n");
    let config = parse_with(&text, &env_of(&[("TOKEN_A", TOKEN_A)]));
    let [a, b] = &config.access.tokens[..] else {
        panic!("two tokens expected");
    };
    assert_eq!(
        (a.name.as_str(), a.token.expose(), a.max_threads),
        ("client-a", TOKEN_A, Some(20))
    );
    assert_eq!(a.keys.as_deref(), Some(&["a".to_owned()][..]));
    assert_eq!(a.tiers.as_deref(), Some(&[1][..]));
    assert!(a.may_use(&config.keys[0]) && a.may_use(&config.keys[1]));
    assert_eq!(
        (b.keys.as_ref(), b.tiers.as_ref(), b.max_threads),
        (None, None, None)
    );
    assert_eq!((a.max_tunnels, b.max_tunnels), (3, DEFAULT_MAX_TUNNELS));
    assert!(b.may_use(&config.keys[0]));
    let only_a = TokenConfig {
        tiers: None,
        ..a.clone()
    };
    assert!(only_a.may_use(&config.keys[0]) && !only_a.may_use(&config.keys[1]));
    // Neither the config's Debug nor `keyrelay check`'s summary shows a token.
    for shown in [format!("{config:?}"), config.summary()] {
        assert_no_secret(&shown);
    }
    assert!(config
        .summary()
        .contains("access: tokens client-a, client-b"));
}

#[test]
fn every_token_problem_is_named_without_its_value() {
    let text = format!(
        "{}{}{}{}{}{}{}{}",
        two_keys(),
        token("dup", TOKEN_A, ""),
        token("dup", TOKEN_B, ""),
        token("again", TOKEN_A, ""),
        token("is-a-key", KEY_A, ""),
        token("bad name!", TOKEN_B, ""),
        token(
            "limits",
            "${UNSET}",
            "keys = [\"nope\"]\ntiers = [-1]\nmax_threads = 0\nmax_tunnels = -2"
        ),
        "\n[[access.tokens]]\nname = \"no-token\"\n"
    );
    let text = format!("{text}\n[admin]\ntoken = \"admin-token-0123456789\"\n");
    let found = problems(&text);
    let expected = [
        "access.tokens[1] (\"dup\").name: duplicate name, access.tokens[0] (\"dup\") has it too",
        "access.tokens[2] (\"again\").token: same token as access.tokens[0] (\"dup\")",
        "access.tokens[3] (\"is-a-key\").token: is the API key of keys \"a\"; a token must be a secret of its own",
        "access.tokens[4].name: may only contain A-Z, a-z, 0-9, '.', '_' and '-'",
        "access.tokens[5] (\"limits\").token: environment variable UNSET is not set",
        "access.tokens[5] (\"limits\").keys[0]: \"nope\" is not the name of a configured key",
        "access.tokens[5] (\"limits\").tiers[0]: must be 0 or more, got -1",
        "access.tokens[5] (\"limits\").max_threads: must be at least 1, got 0",
        "access.tokens[5] (\"limits\").max_tunnels: must be at least 1, got -2",
        "access.tokens[6] (\"no-token\").token: missing; write token = \"...\" or token = \"${VAR}\"",
    ];
    assert_eq!(found, expected);
}

#[test]
fn token_values_never_reach_a_parse_error() {
    // A token typed where a number goes, and an unknown field holding one.
    for text in [
        format!("{}\n[access]\nopen = \"{TOKEN_A}\"\n", one_key()),
        format!(
            "{}\n[[access.tokens]]\nname = \"x\"\ntokn = \"{TOKEN_A}\"\n",
            one_key()
        ),
        format!("{}\n[admin]\ntoken = {TOKEN_A}\n", one_key()),
    ] {
        error_with(&text, &no_env);
    }
}

#[test]
fn empty_or_spaced_tokens_are_refused() {
    let found = problems_with(
        &format!(
            "{}{}{}\n[admin]\ntoken = \"${{EMPTY}}\"\n",
            one_key(),
            token("a", "", ""),
            token("b", "two words", "")
        ),
        &env_of(&[("EMPTY", "")]),
    );
    assert_eq!(
        found,
        [
            "access.tokens[0] (\"a\").token: must not be empty",
            "access.tokens[1] (\"b\").token: must not contain whitespace or control characters",
            "admin.token: is empty after substituting ${EMPTY}",
        ]
    );
}

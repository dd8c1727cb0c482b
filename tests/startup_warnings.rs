//! What keyrelay says at every start about a setting that weakens it: `access.open = true`
//! serves whoever can reach its listeners, without a token, and is said so in a warning
//! each time, as docs/security.md promises.

mod common;

use common::*;

const KEY: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaa0001";

fn start_with(extra: &str) -> (Binary, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("proxy.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"0.0.0.0:0\"\nupstream = \"http://127.0.0.1:9\"\n[pins]\ndurable = false\n\
             [admin]\ntoken = \"admin-token-0123456789abcdef0123\"\n\
             [[keys]]\nname = \"a\"\nkey = \"{KEY}\"\n{extra}"
        ),
    )
    .unwrap();
    let config = config.to_string_lossy().into_owned();
    (Binary::spawn(&["--config", &config], &[]), dir)
}

#[test]
fn access_open_is_warned_about_at_every_start() {
    for start in 0..2 {
        let (mut proxy, _dir) = start_with("[access]\nopen = true\n");
        let line = proxy.wait_for_line("the access.open warning", |l| {
            l.contains("WARN") && l.contains("access.open = true")
        });
        assert!(line.contains("without a token"), "start {start}: {line}");
        assert!(line.contains("0.0.0.0:"), "names the listener: {line}");
        let log = proxy.stop();
        assert!(!log.contains(KEY), "{log}");
    }
}

#[test]
fn open_with_tokens_is_said_to_have_no_effect() {
    let (mut proxy, _dir) = start_with(
        "[access]\nopen = true\n[[access.tokens]]\nname = \"t\"\ntoken = \"client-token-0123456789abcdef012\"\n",
    );
    let line = proxy.wait_for_line("the access.open warning", |l| {
        l.contains("WARN") && l.contains("access.open = true")
    });
    assert!(line.contains("has no effect"), "{line}");
    drop(proxy.stop());
}

//! README.md cannot drift from the code: every command its shell blocks (and its inline
//! `keyrelay ...` / `cargo ...` spans) show is on a known list that names the test that runs
//! it, or the file that does; the Python snippet's request goes through a real proxy; the
//! TOML and YAML blocks agree with the code and the shipped files.

mod common;

use std::path::Path;

use common::*;

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn readme() -> String {
    repo_file("README.md")
}

/// The fenced blocks of `markdown` whose info string is one of `languages`, in order.
fn blocks(markdown: &str, languages: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut current, fence) {
            (None, Some(info)) => {
                let language = info.split_whitespace().next().unwrap_or_default();
                current = languages.contains(&language).then(String::new);
                if current.is_none() && !info.trim().is_empty() {
                    // A block we do not read: skip to its closing fence.
                    current = Some("\u{0}skip".to_owned());
                }
            }
            (Some(text), Some(_)) => {
                if !text.starts_with('\u{0}') {
                    found.push(std::mem::take(text));
                }
                current = None;
            }
            (Some(text), None) => {
                if !text.starts_with('\u{0}') {
                    text.push_str(line);
                    text.push('\n');
                }
            }
            (None, None) => {}
        }
    }
    found
}

/// Every command a shell block shows: one per non-empty line, without its `# comment`,
/// a line ending in `\` joined to the next, whitespace collapsed.
fn shell_commands(markdown: &str) -> Vec<String> {
    let mut commands = Vec::new();
    for block in blocks(markdown, &["sh", "bash", "shell", "console"]) {
        let mut pending = String::new();
        for line in block.lines() {
            let line = line.split(" #").next().unwrap_or_default();
            match line.trim_end().strip_suffix('\\') {
                Some(continued) => {
                    pending.push_str(continued);
                    pending.push(' ');
                }
                None => {
                    pending.push_str(line);
                    commands.push(std::mem::take(&mut pending));
                }
            }
        }
        commands.push(pending);
    }
    commands
        .iter()
        .map(|command| command.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|command| !command.is_empty() && !command.starts_with('#'))
        .collect()
}

/// Inline code spans that are commands: they start with `keyrelay ` or `cargo `.
fn inline_commands(markdown: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut in_block = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            continue;
        }
        for (i, span) in line.split('`').enumerate() {
            if i % 2 == 1 && (span.starts_with("keyrelay ") || span.starts_with("cargo ")) {
                found.push(span.to_owned());
            }
        }
    }
    found
}

/// Every command the README may show, and where it is run: `cli::<test>` in tests/cli.rs
/// (which reads the command's arguments from README.md itself), a file that runs it, or
/// `ci-as:<command>` where .ci/run runs a variant of it, said why beside the entry.
const KNOWN: &[(&str, &str)] = &[
    (
        "cargo run --release -- demo",
        "cli::demo_shows_rotation_failover_capacity_and_metrics",
    ),
    (
        "cargo run --release -- simulate",
        "cli::the_readme_first_run_works_from_a_relative_config",
    ),
    (
        "cargo run --release -- --config proxy.toml",
        "cli::the_readme_first_run_works_from_a_relative_config",
    ),
    (
        "keyrelay --config proxy.toml",
        "cli::the_readme_first_run_works_from_a_relative_config",
    ),
    (
        "keyrelay check --config proxy.toml",
        "cli::check_accepts_the_shipped_config_and_prints_the_pool_without_keys",
    ),
    (
        "keyrelay check --online --config proxy.toml",
        "file:tests/check_online.rs",
    ),
    (
        "keyrelay check",
        "cli::a_bare_keyrelay_without_a_config_says_what_to_do",
    ),
    ("keyrelay ctl budgets", "file:tests/ctl.rs"),
    (
        "keyrelay ca --config proxy.toml",
        "cli::ca_creates_the_ca_once_and_says_how_to_trust_it",
    ),
    (
        "HTTPS_PROXY=http://127.0.0.1:8080 REQUESTS_CA_BUNDLE=ca.pem SSL_CERT_FILE=ca.pem python solve.py",
        "file:tests/real_clients.rs",
    ),
    // Run as a service. systemctl needs systemd as PID 1, which CI lacks: tests/deploy.rs
    // runs what the unit runs instead (its proxy.toml and keys.env variables, READY=1 and
    // STOPPING=1 under Type=notify, SIGTERM's drain), tests/reload.rs the SIGHUP reload that
    // `systemctl reload` sends, and .ci/run `systemd-analyze verify` on the unit itself.
    (
        "install -m 0755 target/release/keyrelay /usr/local/bin/keyrelay",
        "file:tests/deploy.rs",
    ),
    ("install -d /etc/keyrelay", "file:tests/deploy.rs"),
    (
        "install -m 0644 deploy/systemd/proxy.toml /etc/keyrelay/proxy.toml",
        "file:tests/deploy.rs",
    ),
    (
        "install -m 0600 deploy/systemd/keys.env.example /etc/keyrelay/keys.env",
        "file:tests/deploy.rs",
    ),
    (
        "install -m 0644 deploy/systemd/keyrelay.service /etc/systemd/system/",
        "file:tests/deploy.rs",
    ),
    ("systemctl daemon-reload", "file:tests/deploy.rs"),
    ("systemctl enable --now keyrelay", "file:tests/deploy.rs"),
    ("systemctl reload keyrelay", "file:tests/reload.rs"),
    ("journalctl -u keyrelay -f", "file:tests/deploy.rs"),
    // Install the command. .ci/run runs each from the dev build it has already made, since
    // the release profile's fat LTO alone takes about 5 minutes on CI's 2 cores: `pipx
    // install .` under MATURIN_PEP517_ARGS="--profile dev --strip", `cargo install` with
    // `--debug --root target/ci-install`, and the wheel it installs into a fresh venv (and
    // runs `keyrelay demo` from) built with `--profile dev --strip` in place of `--release`.
    ("pipx install .", "file:.ci/run"),
    (
        "maturin build --release",
        "ci-as:maturin build --locked --profile dev --strip",
    ),
    ("pip install target/wheels/keyrelay-*.whl", "file:.ci/run"),
    ("cargo install --locked --path .", "file:.ci/run"),
    // Run in a container. CI has no Docker daemon: tests/deploy.rs runs the Dockerfile's
    // ENTRYPOINT, CMD, USER and VOLUMEs on the built binary, and checks that these commands
    // are the Dockerfile's and docs/deployment.md's, publish the port it exposes and mount
    // its volumes. Not checked: that the image builds (docs/deployment.md).
    ("docker build -t keyrelay .", "file:tests/deploy.rs"),
    (
        "docker run --rm -p 8080:8080 -v \"$PWD/etc:/etc/keyrelay:ro\" -v keyrelay-data:/var/lib/keyrelay --env-file keys.env keyrelay",
        "file:tests/deploy.rs",
    ),
    // The suite itself, and what CI runs around it.
    ("cargo test", "file:.ci/run"),
    ("cargo fmt --check", "file:.ci/run"),
    ("cargo clippy --all-targets -- -D warnings", "file:.ci/run"),
    ("cargo package", "file:.ci/run"),
    // Benchmarks are never run by the tests; the bench target must exist.
    ("cargo bench --bench hot_paths", "file:benches/hot_paths.rs"),
];

#[test]
fn every_readme_command_is_known_and_tested() {
    let text = readme();
    let mut commands = shell_commands(&text);
    commands.extend(inline_commands(&text));
    assert!(
        commands.len() >= 5,
        "the README's commands were not found: {commands:?}"
    );
    for command in &commands {
        assert!(
            KNOWN.iter().any(|(known, _)| known == command),
            "README.md shows `{command}`, which no test runs: add a test and list it in KNOWN"
        );
    }
    let cli = repo_file("tests/cli.rs");
    for (command, runner) in KNOWN {
        if let Some(test) = runner.strip_prefix("cli::") {
            assert!(
                cli.contains(&format!("fn {test}()")),
                "`{command}`: tests/cli.rs has no test {test}"
            );
        } else if let Some(file) = runner.strip_prefix("file:") {
            let body = repo_file(file);
            if file == ".ci/run" {
                assert!(body.contains(command), "`{command}` is not in .ci/run");
            }
        } else if let Some(variant) = runner.strip_prefix("ci-as:") {
            assert!(
                repo_file(".ci/run").contains(variant),
                "`{command}`: .ci/run does not run `{variant}`"
            );
        } else {
            panic!("`{command}`: unknown runner {runner}");
        }
    }
}

#[test]
fn the_drift_check_reads_blocks_and_inline_commands() {
    let sample = "intro `keyrelay check --x` and `keyrelay` and `cargo y`\n\
                  ```sh\nkeyrelay a   b   # note\n\n# comment\n\
                  docker run -v x \\\n    --rm y   # joined\n```\n\
                  ```python\nkeyrelay not-shell\n```\n\
                  ```\nplain\n```\n";
    assert_eq!(
        shell_commands(sample),
        ["keyrelay a b", "docker run -v x --rm y"]
    );
    assert_eq!(inline_commands(sample), ["keyrelay check --x", "cargo y"]);
}

/// The `requests.get` of the README's "after" snippet: its URL and its params, with the
/// Python names (`sitekey`, `url`) given values.
fn python_request(snippet: &str) -> (String, Vec<(String, String)>) {
    let call = snippet
        .split("requests.get(")
        .nth(1)
        .expect("a requests.get call");
    let url = call.split('"').nth(1).expect("a URL").to_owned();
    let params = call
        .split("params={")
        .nth(1)
        .and_then(|rest| rest.split('}').next())
        .expect("a params dict");
    let pairs = params
        .split(',')
        .filter_map(|pair| pair.split_once(':'))
        .map(|(name, value)| {
            let name = name.trim().trim_matches('"').to_owned();
            let value = value.trim();
            let value = match value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
                Some(literal) => literal.to_owned(),
                None if value.parse::<i64>().is_ok() => value.to_owned(),
                // A variable of the user's script: any value does.
                None => format!("{name}-value"),
            };
            (name, value)
        })
        .collect();
    (url, pairs)
}

#[tokio::test]
async fn the_python_snippet_request_is_solved_through_the_proxy() {
    let text = readme();
    let snippets = blocks(&text, &["python"]);
    assert_eq!(snippets.len(), 2, "a before and an after snippet");
    let shipped = keyrelay::Config::from_toml_str(&repo_file("proxy.toml"), &|_| None)
        .expect("the shipped proxy.toml is valid");
    let base = format!("http://{}", shipped.listen);

    let (before, _) = python_request(&snippets[0]);
    assert_eq!(
        before,
        format!("{}/in.php", keyrelay::config::DEFAULT_UPSTREAM)
    );
    let (after, params) = python_request(&snippets[1]);
    assert_eq!(
        after,
        format!("{base}/in.php"),
        "the proxy's listen address"
    );
    assert!(
        snippets[1].contains(&format!("base_url=\"{base}\"")),
        "{}",
        snippets[1]
    );
    let names: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["key", "method", "googlekey", "pageurl", "json"]);

    let h = Harness::three_keys().await;
    let query = serde_urlencoded::to_string(&params).expect("encodes");
    let answer = h.get(&format!("/in.php?{query}")).await;
    assert_eq!(answer.status, 200);
    let json = answer.json();
    assert_eq!(json["status"], 1, "{json}");
    let id = json["request"].to_string().trim_matches('"').to_owned();
    assert!(!id.is_empty() && id != "null", "{json}");
    // The poll the README says works unchanged, with the caller's own key.
    let poll = h
        .get(&format!(
            "/res.php?key={CALLER_KEY}&action=get&id={id}&json=1"
        ))
        .await;
    assert_eq!(poll.status, 200);
    assert!(
        matches!(poll.json()["status"].as_i64(), Some(0 | 1)),
        "{}",
        poll.text()
    );
    assert!(
        !poll.text().contains("ERROR_WRONG_CAPTCHA_ID"),
        "{}",
        poll.text()
    );
    h.stop().await;
}

#[test]
fn the_readme_config_block_is_valid() {
    let blocks = blocks(&readme(), &["toml"]);
    assert_eq!(blocks.len(), 1);
    let env = |name: &str| match name {
        "CAPTCHAAI_KEY_A" => Some("0123456789abcdef0123456789abcdef".to_owned()),
        "CAPTCHAAI_KEY_SPARE" => Some("fedcba9876543210fedcba9876543210".to_owned()),
        _ => None,
    };
    let config = keyrelay::Config::from_toml_str(&blocks[0], &env)
        .unwrap_or_else(|e| panic!("README.md's proxy.toml: {e}"));
    let keys: Vec<(&str, u32)> = config
        .keys
        .iter()
        .map(|k| (k.name.as_str(), k.tier))
        .collect();
    assert_eq!(keys, [("client-a", 0), ("spare", 1)]);
}

#[test]
fn the_readme_scrape_config_matches_the_shipped_one_and_the_listener() {
    let readme_yaml = blocks(&readme(), &["yaml"]).concat();
    let shipped_yaml = repo_file("docs/prometheus/prometheus.yml");
    let shipped = keyrelay::Config::from_toml_str(&repo_file("proxy.toml"), &|_| None)
        .expect("the shipped proxy.toml is valid");
    let target = format!("\"{}\"", shipped.listen);
    for line in readme_yaml.lines().map(str::trim).filter(|l| !l.is_empty()) {
        assert!(
            shipped_yaml.contains(line),
            "README's {line:?} is not in docs/prometheus/prometheus.yml"
        );
    }
    assert!(readme_yaml.contains(&target), "{readme_yaml}");
}

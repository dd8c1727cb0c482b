//! The real Python client libraries, run as a script would run them: finding a Python that
//! has them (`KEYRELAY_TEST_PYTHON`, else `python3`; `.ci/run` makes a pinned venv), and
//! running one of `tests/clients/` with only the environment it is given.

use std::path::Path;
use std::process::Command;

/// A 1×1 PNG: what the scripts upload as the image task.
pub const PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4,
    0x89, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0x00, 0x01, 0x00, 0x00,
    0x05, 0x00, 0x01, 0x0d, 0x0a, 0x2d, 0xb4, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae,
    0x42, 0x60, 0x82,
];

/// A Python that can import every one of `modules`: the one the variable `var` names,
/// else `python3`. None (the test skips) when it cannot, unless `CI` is set: there
/// `.ci/run` installs them, so a missing one is a failure.
pub fn python_with(var: &str, modules: &[&str]) -> Option<String> {
    let python = std::env::var(var).unwrap_or_else(|_| "python3".to_owned());
    let imports = format!("import {}", modules.join(", "));
    let found = Command::new(&python)
        .args(["-c", &imports])
        .output()
        .is_ok_and(|out| out.status.success());
    if found {
        return Some(python);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI is set but {python} cannot `{imports}` (.ci/run installs them)"
    );
    eprintln!("skipped: {python} cannot `{imports}`");
    None
}

/// Runs `tests/clients/<script>` with `args` and, beyond a clean proxy environment, `env`;
/// its JSON lines. Fails the test if the script fails.
pub async fn run_script(
    python: &str,
    script: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Vec<serde_json::Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(script);
    let mut command = Command::new(python);
    command.arg(&path).args(args);
    for name in [
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
        "NO_PROXY",
        "no_proxy",
    ] {
        command.env_remove(name);
    }
    for (name, value) in env {
        command.env(name, value);
    }
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("the script's thread")
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{} failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        path.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

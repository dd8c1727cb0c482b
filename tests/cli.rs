//! The command line as users meet it: help, version, `check` on the shipped and broken
//! configs, `demo` end to end, `ca` (the local CA and how to trust it), and the README's
//! first run (`simulate` beside `--config proxy.toml`, and a bare `keyrelay`) through the
//! real binary from a directory of its own. The README's commands are read from README.md itself, so that a command edited
//! there is a test that no longer finds it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

fn keyrelay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keyrelay"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("RUST_LOG")
        .output()
        .expect("keyrelay runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn help_lists_the_commands() {
    let out = keyrelay(&["--help"]);
    assert!(out.status.success());
    let text = stdout(&out);
    for word in ["check", "simulate", "demo", "ca", "--config"] {
        assert!(text.contains(word), "{word} missing from help:\n{text}");
    }
}

#[test]
fn version_prints_the_crate_version_and_commit() {
    let out = keyrelay(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        stdout(&out).trim(),
        format!(
            "keyrelay {} ({})",
            env!("CARGO_PKG_VERSION"),
            keyrelay::BUILD_COMMIT
        )
    );
}

/// Built from a checkout (as here and in CI), the commit is the checkout's HEAD.
#[test]
fn the_build_commit_is_the_checkouts_head() {
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("git runs");
    assert!(head.status.success(), "not a git checkout");
    assert_eq!(
        keyrelay::BUILD_COMMIT,
        String::from_utf8_lossy(&head.stdout).trim()
    );
}

#[test]
fn the_build_script_watches_only_paths_that_exist() {
    // A path that does not exist counts as changed on every build, so keyrelay would be
    // rebuilt (and, in release, relinked with fat LTO) by every cargo command.
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_keyrelay"));
    let build = bin.parent().expect("the profile's directory").join("build");
    let newest = std::fs::read_dir(&build)
        .expect("the build directory")
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("output"))
        .filter(|output| {
            output.exists()
                && output
                    .parent()
                    .and_then(|p| p.file_name())
                    .is_some_and(|n| n.to_string_lossy().starts_with("keyrelay-"))
        })
        .max_by_key(|output| std::fs::metadata(output).and_then(|m| m.modified()).ok())
        .expect("keyrelay's build script ran");
    let output = std::fs::read_to_string(&newest).unwrap();
    let watched: Vec<&str> = output
        .lines()
        .filter_map(|l| l.strip_prefix("cargo:rerun-if-changed="))
        .collect();
    for path in &watched {
        assert!(
            std::path::Path::new(path).exists(),
            "{path} is watched but missing:\n{output}"
        );
    }
    if std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(".git")
        .exists()
    {
        assert!(
            watched.iter().any(|p| p.ends_with("HEAD")),
            "a checkout's HEAD is watched:\n{output}"
        );
    }
}

#[test]
fn check_accepts_the_shipped_config_and_prints_the_pool_without_keys() {
    let out = keyrelay(&["check", "--config", "proxy.toml"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("sim-a") && text.contains("sim-b"), "{text}");
    for key in keyrelay::sim::DEFAULT_KEYS {
        assert!(!text.contains(key), "check printed a key:\n{text}");
        assert!(
            text.contains(&keyrelay::ApiKey::new(key).fingerprint()),
            "{text}"
        );
    }
}

/// `check` shows `[scaling]` like the other sections: the shipped config's brake is off, and
/// a set one is printed as written, so an operator sees the threshold `/scaling` brakes at.
#[test]
fn check_shows_the_scaling_brake() {
    let shipped = keyrelay(&["check", "--config", "proxy.toml"]);
    assert!(shipped.status.success(), "{}", stderr(&shipped));
    let text = stdout(&shipped);
    assert!(
        text.lines()
            .any(|l| l == "scaling: brake_balance 0 (never brakes)"),
        "{text}"
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("braked.toml");
    std::fs::write(
        &path,
        "upstream = \"http://127.0.0.1:9\"\n[[keys]]\nname = \"main\"\nkey = \"0123456789abcdef0123456789abcdef\"\n[scaling]\nbrake_balance = 2.75\n",
    )
    .unwrap();
    let out = keyrelay(&["check", "--config", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.lines().any(|l| l == "scaling: brake_balance 2.75"),
        "{text}"
    );
}

#[test]
fn check_rejects_a_broken_config_with_a_precise_message() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "upstream = \"http://127.0.0.1:9\"\n[[keys]]\nname = \"main\"\nkey = \"0123456789abcdef0123456789abcdef\"\nweight = 0\n",
    )
    .unwrap();
    let out = keyrelay(&["check", "--config", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let text = stderr(&out);
    assert!(
        text.contains("keys[0] (\"main\").weight: must be > 0"),
        "{text}"
    );
    assert!(
        text.contains(path.to_str().unwrap()),
        "names the file: {text}"
    );
    assert_eq!(text.matches("must be > 0").count(), 1, "said once: {text}");
    assert!(!text.contains("0123456789abcdef"), "{text}");
}

/// `upstream_ca` is named relative to the config file and read as keyrelay reads it at
/// start, so a missing or unusable bundle fails `check`, naming the file.
#[test]
fn check_reads_upstream_ca_beside_the_config_and_refuses_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.toml");
    std::fs::write(
        &path,
        "upstream = \"https://solver.internal\"\nupstream_ca = \"roots.pem\"\n[[keys]]\nname = \"main\"\nkey = \"0123456789abcdef0123456789abcdef\"\n",
    )
    .unwrap();
    let roots = std::path::absolute(dir.path().join("roots.pem")).unwrap();
    let check = || keyrelay(&["check", "--config", path.to_str().unwrap()]);

    let missing = check();
    assert!(!missing.status.success());
    let text = stderr(&missing);
    assert!(
        text.contains(&format!("upstream_ca {}: cannot read it", roots.display())),
        "{text}"
    );

    std::fs::write(&roots, "not a certificate\n").unwrap();
    let garbage = check();
    assert!(!garbage.status.success());
    assert!(
        stderr(&garbage).contains("no certificate in it"),
        "{}",
        stderr(&garbage)
    );

    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    std::fs::write(&roots, params.self_signed(&key).unwrap().pem()).unwrap();
    let good = check();
    assert!(good.status.success(), "{}", stderr(&good));
    let want = format!(
        "upstream_ca {}: trusted for https upstreams beside the Mozilla roots",
        roots.display()
    );
    assert!(
        stdout(&good).lines().any(|l| l == want),
        "{}",
        stdout(&good)
    );
}

/// `upstream_proxy` is shown by `check` with its user info masked, its password (here from
/// the environment) never, with the hosts it bypasses; a proxy URL keyrelay cannot use is
/// refused, saying why.
#[test]
fn check_shows_the_upstream_proxy_masked_and_refuses_an_unusable_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.toml");
    let write = |proxy: &str| {
        std::fs::write(
            &path,
            format!("upstream_proxy = \"{proxy}\"\nupstream_no_proxy = [\"localhost\", \"*.corp.internal\"]\n[[keys]]\nname = \"main\"\nkey = \"0123456789abcdef0123456789abcdef\"\n"),
        )
        .unwrap();
    };
    let check = || {
        Command::new(env!("CARGO_BIN_EXE_keyrelay"))
            .args(["check", "--config", path.to_str().unwrap()])
            .env_remove("RUST_LOG")
            .env("KR_PROXY_PASS", "s3cret-proxy-pw")
            .output()
            .expect("keyrelay runs")
    };

    write("http://relay:${KR_PROXY_PASS}@proxy.internal:3128");
    let good = check();
    assert!(good.status.success(), "{}", stderr(&good));
    let want = "upstream_proxy http://***@proxy.internal:3128: every upstream connection, and every forward-proxy tunnel or relay to another host, goes through it";
    assert!(
        stdout(&good).lines().any(|l| l == want),
        "{}",
        stdout(&good)
    );
    let direct =
        "upstream_no_proxy localhost, .corp.internal: dialled directly, not through upstream_proxy";
    assert!(
        stdout(&good).lines().any(|l| l == direct),
        "{}",
        stdout(&good)
    );

    for (proxy, why) in [
        (
            "https://relay:${KR_PROXY_PASS}@proxy.internal:3128",
            "TLS connection to the proxy",
        ),
        (
            "socks5://relay:${KR_PROXY_PASS}@proxy.internal:1080",
            "SOCKS proxies are not supported",
        ),
        (
            "http://relay:${KR_PROXY_PASS}@proxy.internal:3128/x",
            "no path or query",
        ),
    ] {
        write(proxy);
        let bad = check();
        assert!(!bad.status.success(), "{proxy}");
        assert!(stderr(&bad).contains(why), "{proxy}: {}", stderr(&bad));
        assert!(
            stderr(&bad).contains("***@proxy.internal"),
            "{}",
            stderr(&bad)
        );
    }
    for out in [good, check()] {
        let all = format!("{}{}", stdout(&out), stderr(&out));
        assert!(!all.contains("s3cret-proxy-pw"), "{all}");
    }
}

#[test]
fn check_reports_a_missing_file() {
    let out = keyrelay(&["check", "--config", "/nonexistent/proxy.toml"]);
    assert!(!out.status.success());
    let text = stderr(&out);
    assert!(text.contains("/nonexistent/proxy.toml"), "{text}");
    assert_eq!(
        text.matches("os error 2").count(),
        1,
        "cause printed once: {text}"
    );
}

#[test]
fn demo_shows_rotation_failover_capacity_and_metrics() {
    let out = keyrelay(&["demo"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for expected in [
        "served by",
        "failover: 'revoked' answered ERROR_KEY_DOES_NOT_EXIST",
        "key 'drained' benched: threadsinfo shows free threads",
        "a JSON API client (createTask / getTaskResult",
        "as an in.php submit (method=base64)",
        "getTaskResult   ready, solution.text tok-",
        "a burst: 25 scripts submit at once",
        "spare    at most ",
        "25 of 25 solved;",
        "the service answered \"no free thread\" 0 times",
        "final pool state",
        "keyrelay_keys_active 3",
        "keyrelay_key_up{key=\"heavy\"} 1",
        // The outage: CaptchaAI down, new tasks at 2captcha, no key cooled for it, and the
        // tasks made before polled with their own keys once it is back.
        "then CaptchaAI goes down (connections refused)",
        "provider captchaai is down",
        "CaptchaAI keys cooled for the outage: none",
        "provider captchaai answers again",
        "keyrelay_provider_outages_total{provider=\"captchaai\"} 1",
        "keyrelay_provider_up{provider=\"captchaai\"} 1",
    ] {
        assert!(
            text.contains(expected),
            "{expected:?} missing from the demo:\n{text}"
        );
    }
    assert!(
        !text.contains("demo-steady-0000"),
        "the demo printed a key:\n{text}"
    );
    // The JSON client's task is polled with the key that made it.
    let json_task = text
        .split("in the same pool:")
        .nth(1)
        .expect("the JSON client's section");
    let word_after = |marker: &str| {
        json_task
            .split(marker)
            .nth(1)
            .and_then(|rest| rest.split([',', ' ', '\n']).next())
            .unwrap_or_default()
    };
    let served = word_after("served by ");
    assert!(!served.is_empty(), "{json_task}");
    assert_eq!(served, word_after("polled with "), "{json_task}");
    let outage = text
        .split("then CaptchaAI goes down")
        .nth(1)
        .and_then(|rest| rest.split("CaptchaAI is back").next())
        .unwrap_or_default();
    let outage_tasks = outage.lines().filter(|l| l.contains("outage task")).count();
    let on_backup = outage
        .lines()
        .filter(|l| l.contains("served by spare"))
        .count();
    assert_eq!(
        (outage_tasks, on_backup),
        (5, 5),
        "every outage task at 2captcha:\n{text}"
    );
    let earlier: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("earlier task"))
        .collect();
    assert_eq!(earlier.len(), 2, "{text}");
    assert!(
        earlier
            .iter()
            .all(|l| l.contains("its own key  token tok-")),
        "{text}"
    );
    // The backup key takes no task while the primaries have room: none in the first act.
    let first_act = text.split("a burst:").next().unwrap_or_default();
    assert!(!first_act.contains("served by spare"), "{text}");
    for line in text.lines().filter(|l| l.contains("threads at once")) {
        let peak: u32 = line
            .split_whitespace()
            .nth(3)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no peak in {line:?}"));
        assert!(peak <= 5, "a key exceeded its threads: {line}");
    }
}

#[test]
fn the_demo_runs_on_one_thread_and_on_several() {
    // One thread takes tokio's current-thread runtime, more its multi-threaded one: the
    // whole demo (failover, a queued burst, refreshes) must work on both.
    for threads in ["1", "3"] {
        let out = keyrelay(&["--threads", threads, "demo"]);
        assert!(
            out.status.success(),
            "--threads {threads}: {}",
            stderr(&out)
        );
        assert!(
            stdout(&out).contains("25 of 25 solved;"),
            "--threads {threads}:\n{}",
            stdout(&out)
        );
    }
}

#[test]
fn zero_threads_is_refused_with_a_message() {
    let out = keyrelay(&["--threads", "0", "check"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--threads"), "{}", stderr(&out));
}

#[test]
fn json_logs_are_one_object_per_line() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.toml");
    std::fs::write(
        &path,
        "listen = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:9\"\nrefresh_interval = \"1h\"\n[[keys]]\nname = \"only\"\nkey = \"0123456789abcdef0123456789abcdef\"\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_keyrelay"))
        .args(["--config", path.to_str().unwrap(), "--log-format", "json"])
        .args(["--threads", "2"])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Every line is a JSON object; the start line carries the bound address.
    let mut start = None;
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(20)) {
        let parsed: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        if parsed["fields"]["message"] == "keyrelay listening" {
            start = Some((line, parsed));
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let (first, line) = start.expect("keyrelay logged its start");
    assert_eq!(line["level"], "INFO");
    assert_eq!(
        line["fields"]["threads"], 2,
        "--threads 2 is logged: {first}"
    );
    assert!(line["fields"]["addr"]
        .as_str()
        .unwrap()
        .starts_with("127.0.0.1:"));
    assert!(!first.contains("0123456789abcdef"));
}

// === the README's first run ===

/// How long any one step of a started binary may take: generous for a loaded CI machine,
/// bounded so a hang fails the test instead of stalling it.
const STEP: Duration = Duration::from_secs(20);

/// The arguments after `--` of the `cargo run --release -- ...` line of README.md whose
/// arguments start with `first`: the test runs exactly what the README shows.
fn readme_args(first: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md");
    let line = readme
        .lines()
        .filter_map(|l| l.trim().strip_prefix("cargo run --release -- "))
        .map(|rest| rest.split('#').next().unwrap_or_default().trim())
        .find(|args| args.split_whitespace().next() == Some(first))
        .unwrap_or_else(|| panic!("README.md shows no `cargo run --release -- {first} ...`"));
    line.split_whitespace().map(str::to_owned).collect()
}

/// A started binary with its stdout and stderr lines on channels, killed when dropped.
struct Running {
    child: Child,
    out: Receiver<String>,
    err: Receiver<String>,
    seen: String,
}

impl Running {
    fn start(dir: &Path, args: &[String]) -> Running {
        let mut child = Command::new(env!("CARGO_BIN_EXE_keyrelay"))
            .args(args)
            .current_dir(dir)
            .env_remove("RUST_LOG")
            .env_remove("KEYRELAY_THREADS")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("keyrelay starts");
        let out = lines_of(child.stdout.take().expect("piped"));
        let err = lines_of(child.stderr.take().expect("piped"));
        Running {
            child,
            out,
            err,
            seen: String::new(),
        }
    }

    /// The first line on stdout (`from_stdout`) or stderr that contains `what`.
    fn line_with(&mut self, what: &str, from_stdout: bool) -> String {
        let deadline = Instant::now() + STEP;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let lines = if from_stdout { &self.out } else { &self.err };
            match lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push_str(&line);
                    self.seen.push('\n');
                    if line.contains(what) {
                        return line;
                    }
                }
                Err(_) => panic!("no line with {what:?}; output so far:\n{}", self.seen),
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lines_of(pipe: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// One HTTP/1.1 GET with `Connection: close`: status code and body.
fn http_get(addr: &str, target: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(STEP))?;
    write!(
        stream,
        "GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// Polls `/healthz` until it answers 200, for at most [`STEP`].
fn wait_healthy(addr: &str) {
    let deadline = Instant::now() + STEP;
    loop {
        if let Ok((200, body)) = http_get(addr, "/healthz") {
            assert_eq!(body, "ok\n");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{addr}/healthz never answered 200"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `keyrelay simulate` as the README starts it, on an ephemeral port instead of 9000; its
/// address, from the line it prints.
fn start_simulator(dir: &Path) -> (Running, String) {
    let mut args = readme_args("simulate");
    args.extend(["--listen".to_owned(), "127.0.0.1:0".to_owned()]);
    let mut sim = Running::start(dir, &args);
    let line = sim.line_with("simulated CaptchaAI on http://", true);
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("an address")
        .to_owned();
    assert!(
        !addr.ends_with(":0"),
        "the simulator printed its configured port, not the bound one: {line}"
    );
    for key in keyrelay::sim::DEFAULT_KEYS {
        sim.line_with(key, true);
    }
    (sim, addr)
}

/// The shipped proxy.toml, unchanged but for an ephemeral listen port and the simulator's
/// address, written as `proxy.toml` in `dir`.
fn write_shipped_config(dir: &Path, sim_addr: &str) {
    let shipped = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("proxy.toml"))
        .expect("proxy.toml");
    let listen = "listen = \"127.0.0.1:8080\"\n";
    let upstream = "upstream = \"http://127.0.0.1:9000\"\n";
    assert!(
        shipped.contains(listen) && shipped.contains(upstream),
        "{shipped}"
    );
    let text = shipped
        .replacen(listen, "listen = \"127.0.0.1:0\"\n", 1)
        .replacen(upstream, &format!("upstream = \"http://{sim_addr}\"\n"), 1);
    std::fs::write(dir.join("proxy.toml"), text).expect("write proxy.toml");
}

/// Starts keyrelay in `dir` with `args`, waits for it to be healthy, and has it solve one
/// task on the simulator the way the README's Python snippet asks for one.
fn serve_one_task(dir: &Path, args: &[String]) {
    let mut proxy = Running::start(dir, args);
    let line = proxy.line_with("keyrelay listening", false);
    let addr = line
        .split("addr=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no addr in {line:?}"))
        .to_owned();
    wait_healthy(&addr);
    let (status, body) = http_get(
        &addr,
        "/in.php?key=0123456789abcdef0123456789abcdef&method=userrecaptcha&googlekey=site&pageurl=https://example.com&json=1",
    )
    .expect("the submit is answered");
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).expect("a JSON answer");
    assert_eq!(answer["status"], 1, "{body}; log:\n{}", proxy.seen);
    // Pins are journalled next to the config, as the README says.
    assert!(
        dir.join("pins.journal").is_file(),
        "no pins.journal in {}",
        dir.display()
    );
    assert!(
        !proxy.seen.contains("cannot open the pin journal"),
        "{}",
        proxy.seen
    );
}

#[test]
fn the_readme_first_run_works_from_a_relative_config() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_sim, sim_addr) = start_simulator(dir.path());
    write_shipped_config(dir.path(), &sim_addr);
    let args = readme_args("--config");
    assert_eq!(
        args,
        ["--config", "proxy.toml"],
        "the README's relative path"
    );
    serve_one_task(dir.path(), &args);
}

#[test]
fn a_bare_keyrelay_serves_the_proxy_toml_of_its_directory() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_sim, sim_addr) = start_simulator(dir.path());
    write_shipped_config(dir.path(), &sim_addr);
    serve_one_task(dir.path(), &[]);
}

#[test]
fn a_bare_keyrelay_without_a_config_says_what_to_do() {
    let dir = tempfile::tempdir().expect("temp dir");
    for args in [&[][..], &["check"][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_keyrelay"))
            .args(args)
            .current_dir(dir.path())
            .env_remove("RUST_LOG")
            .output()
            .expect("keyrelay runs");
        assert!(!out.status.success(), "{args:?}");
        let text = stderr(&out);
        for hint in ["no proxy.toml in ", "--config PATH", "keyrelay demo"] {
            assert!(
                text.contains(hint),
                "{args:?}: {hint:?} missing from:\n{text}"
            );
        }
        assert_eq!(text.lines().count(), 1, "one line: {text}");
    }
}

#[test]
fn an_explicit_missing_config_is_named_without_the_hint() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = Command::new(env!("CARGO_BIN_EXE_keyrelay"))
        .args(["--config", "proxy.toml"])
        .current_dir(dir.path())
        .output()
        .expect("keyrelay runs");
    assert!(!out.status.success());
    let text = stderr(&out);
    assert!(
        text.starts_with("error: cannot read proxy.toml: "),
        "{text}"
    );
    assert!(!text.contains("keyrelay demo"), "{text}");
}

/// A key typed into the wrong field of a running keyrelay's proxy.toml: the reload is
/// rejected, and the logged error names the field but shows at most a fingerprint.
#[test]
fn a_rejected_reload_logs_no_value_typed_into_the_wrong_field() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_sim, sim_addr) = start_simulator(dir.path());
    write_shipped_config(dir.path(), &sim_addr);
    let mut proxy = Running::start(
        dir.path(),
        &["--config".to_owned(), "proxy.toml".to_owned()],
    );
    proxy.line_with("keyrelay listening", false);
    let good = std::fs::read_to_string(dir.path().join("proxy.toml")).expect("read");
    let secret = "0123456789abcdef0123456789abcdef";
    let edits = [
        ("keys_env", format!("keys_env = \"{secret}\"\n{good}")),
        (
            "max_attempts",
            good.replacen(
                "max_attempts = 3",
                &format!("max_attempts = \"{secret}\""),
                1,
            ),
        ),
        (
            "listen",
            good.replacen(
                "listen = \"127.0.0.1:0\"",
                &format!("listen = \"{secret}\""),
                1,
            ),
        ),
    ];
    for (field, text) in edits {
        assert_ne!(text, good, "{field}: the edit applies");
        std::fs::write(dir.path().join("proxy.toml"), &text).expect("write");
        let line = proxy.line_with("config reload rejected", false);
        // A parse error spans lines (toml's excerpt): the field is on one of the next ones.
        if !line.contains(field) {
            proxy.line_with(field, false);
        }
        assert!(
            !proxy.seen.contains(secret),
            "{field}: logged the value:\n{}",
            proxy.seen
        );
        assert!(!proxy.seen.contains("0123456789abcdef"), "{}", proxy.seen);
    }
}

/// A valid config in `dir` (`proxy.toml`), whose data dir is `dir` itself.
fn write_ca_config(dir: &Path) -> String {
    write_shipped_config(dir, "127.0.0.1:9");
    dir.join("proxy.toml").to_str().unwrap().to_owned()
}

#[test]
fn ca_creates_the_ca_once_and_says_how_to_trust_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_ca_config(dir.path());
    let out = keyrelay(&["ca", "--config", &config]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let cert = dir.path().join("ca.pem");
    let key = dir.path().join("ca.key");
    assert!(text.contains("generated just now"), "{text}");
    for expected in [
        format!("REQUESTS_CA_BUNDLE={}", cert.display()),
        format!("SSL_CERT_FILE={}", cert.display()),
        format!("NODE_EXTRA_CA_CERTS={}", cert.display()),
        "update-ca-certificates".to_owned(),
        format!("Keep the CA's private key secret: {}", key.display()),
    ] {
        assert!(text.contains(&expected), "{expected} missing:\n{text}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
    let (cert_before, key_before) = (std::fs::read(&cert).unwrap(), std::fs::read(&key).unwrap());
    assert!(!text.contains(&String::from_utf8_lossy(&key_before).into_owned()));

    // Run again: the same CA, found rather than made.
    let again = keyrelay(&["ca", "--config", &config]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(stdout(&again).contains("(existing)"), "{}", stdout(&again));
    assert_eq!(std::fs::read(&cert).unwrap(), cert_before);
    assert_eq!(std::fs::read(&key).unwrap(), key_before);
}

#[test]
fn ca_pem_writes_the_certificate_alone() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_ca_config(dir.path());
    let out = keyrelay(&["ca", "--config", &config, "--pem"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(
        text,
        std::fs::read_to_string(dir.path().join("ca.pem")).unwrap()
    );
    assert!(text.starts_with("-----BEGIN CERTIFICATE-----\n"), "{text}");
    assert!(
        text.trim_end().ends_with("-----END CERTIFICATE-----"),
        "{text}"
    );
    assert!(!text.contains("PRIVATE KEY"), "{text}");
}

#[test]
fn ca_refuses_half_a_pair_naming_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_ca_config(dir.path());
    assert!(keyrelay(&["ca", "--config", &config]).status.success());
    std::fs::remove_file(dir.path().join("ca.key")).unwrap();
    let out = keyrelay(&["ca", "--config", &config, "--pem"]);
    assert!(!out.status.success());
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    let text = stderr(&out);
    assert!(
        text.contains(&dir.path().join("ca.key").display().to_string()),
        "{text}"
    );
    assert!(!dir.path().join("ca.key").exists(), "a new key was made");
}

#[test]
fn simulate_plays_other_providers_under_their_prefixes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let args: Vec<String> = [
        "simulate",
        "--listen",
        "127.0.0.1:0",
        "--provider",
        "2captcha",
        "--provider",
        "RuCaptcha",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let mut sim = Running::start(dir.path(), &args);
    let line = sim.line_with("simulated 2captcha on http://", true);
    let base = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("an address")
        .to_owned();
    let (addr, prefix) = base.split_once('/').expect("a prefix");
    assert_eq!(prefix, "2captcha");
    sim.line_with("simulated rucaptcha on http://", true);
    let key = keyrelay::sim::DEFAULT_KEYS[0];
    let threads = format!("res.php?key={key}&action=threadsinfo&json=1");
    let (_, at_root) = http_get(addr, &format!("/{threads}")).expect("CaptchaAI answers");
    assert!(at_root.contains("\"threads\""), "{at_root}");
    let (_, there) = http_get(addr, &format!("/2captcha/{threads}")).expect("2captcha answers");
    assert!(there.contains("ERROR_BAD_PARAMETERS"), "{there}");
    let (_, bls) = http_get(addr, &format!("/rucaptcha/in.php?key={key}&method=bls"))
        .expect("rucaptcha answers");
    assert_eq!(bls, "ERROR_NO_SUCH_METHOD");

    let out = keyrelay(&["simulate", "--provider", "nope"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("unknown provider \"nope\""), "{err}");
    assert!(err.contains("\"2captcha\""), "{err}");
}

//! The shipped deployment files work as shipped, as far as that can be checked without an
//! image builder or a service manager: the Dockerfile's command line, user, paths and
//! signals run on the built binary, and the `docker` commands the docs show fit it;
//! keyrelay speaks systemd's readiness protocol (`Type=notify`); each `deploy/*/proxy.toml`
//! is valid with exactly the variables its unit or manifest provides; and the Python
//! wheel's `pyproject.toml` says what Cargo.toml says. `.ci/run` checks the rest
//! (systemd-analyze verify, the manifests against the Kubernetes schemas, the installs);
//! docs/deployment.md says what is not checked.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use keyrelay::Config;

const KEY: &str = "simkey-deploy-0000000000000000001";

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The JSON-array argument of the Dockerfile instruction `name` (`ENTRYPOINT`, `CMD`,
/// `VOLUME`): exec form only, which is what makes SIGTERM reach keyrelay as PID 1.
fn dockerfile_array(dockerfile: &str, name: &str) -> Vec<String> {
    let line = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("the Dockerfile has no {name}"));
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("{name} {line} is not a JSON array (exec form): {e}"))
}

/// The `USER uid:gid` of the Dockerfile's last stage.
fn dockerfile_user(dockerfile: &str) -> (u32, u32) {
    let user = dockerfile
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("the Dockerfile sets USER");
    let (uid, gid) = user.trim().split_once(':').expect("USER is uid:gid");
    (
        uid.parse().expect("numeric uid"),
        gid.parse().expect("numeric gid"),
    )
}

/// A GET over a fresh connection: (status, body).
fn http_get(addr: &str, target: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect to keyrelay");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read the answer");
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let body = answer
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    (status, body)
}

fn signal(process: &Binary, name: &str) {
    let sent = Command::new("kill")
        .args([name, &process.pid().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success(), "kill {name}");
}

/// The uid a running process has, from /proc.
fn uid_of(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let line = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .expect("Uid line");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn running_as_root() -> bool {
    uid_of(std::process::id()) == 0
}

/// Maps an absolute path of the image (`/etc/keyrelay/proxy.toml`) into `root`.
fn in_root(root: &Path, image_path: &str) -> PathBuf {
    root.join(image_path.trim_start_matches('/'))
}

fn chown_tree(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            chown_tree(&entry.unwrap().path(), uid, gid);
        }
    }
}

#[test]
fn the_image_command_line_serves_as_its_user_keeps_state_in_the_volume_and_drains_on_sigterm() {
    let dockerfile = repo_file("Dockerfile");
    let entrypoint = dockerfile_array(&dockerfile, "ENTRYPOINT");
    let cmd = dockerfile_array(&dockerfile, "CMD");
    let volumes = dockerfile_array(&dockerfile, "VOLUME");
    let (uid, gid) = dockerfile_user(&dockerfile);
    assert_eq!(entrypoint, ["/usr/local/bin/keyrelay"]);
    assert_ne!(uid, 0, "the image must not run as root");
    assert_eq!(volumes, ["/etc/keyrelay", "/var/lib/keyrelay"]);
    let config_at = cmd
        .iter()
        .position(|a| a == "--config")
        .map(|i| cmd[i + 1].clone())
        .expect("CMD passes --config");
    assert!(config_at.starts_with("/etc/keyrelay/"), "{config_at}");

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let sim = runtime.block_on(sim_with(&[KEY]));
    let root = tempfile::tempdir().unwrap();
    let config_path = in_root(root.path(), &config_at);
    let data_dir = in_root(root.path(), "/var/lib/keyrelay");
    std::fs::create_dir_all(config_path.parent().unwrap()).unwrap();
    std::fs::create_dir_all(&data_dir).unwrap();
    // What an operator mounts: data_dir set to the image's state volume.
    std::fs::write(
        &config_path,
        format!(
            "listen = \"127.0.0.1:0\"\nupstream = \"{}\"\ndata_dir = \"{}\"\n\
             [[keys]]\nname = \"a\"\nkey = \"${{CAPTCHAAI_KEY}}\"\n",
            sim.url(),
            data_dir.display()
        ),
    )
    .unwrap();

    // The image's user where this test can switch to it (as root, with setpriv); else the
    // unprivileged user the test already runs as, which is what the check is about.
    let as_root = running_as_root();
    let mut command = if as_root {
        chown_tree(root.path(), uid, gid);
        let mut c = Command::new("setpriv");
        c.args([
            &format!("--reuid={uid}"),
            &format!("--regid={gid}"),
            "--clear-groups",
            "--",
        ]);
        c.arg(env!("CARGO_BIN_EXE_keyrelay"));
        c
    } else {
        Command::new(env!("CARGO_BIN_EXE_keyrelay"))
    };
    // The image's CMD, with its paths moved into the temp root.
    command
        .args(cmd.iter().map(|a| match a.strip_prefix('/') {
            Some(_) => in_root(root.path(), a).into_os_string(),
            None => a.into(),
        }))
        .env("CAPTCHAAI_KEY", KEY)
        // The image's WORKDIR is the state volume, which the process may write.
        .current_dir(&data_dir);
    let mut proxy = Binary::start(command);
    let addr = proxy.wait_for_addr();
    let process_uid = uid_of(proxy.pid());
    if as_root {
        assert_eq!(process_uid, uid, "keyrelay runs as the image's USER");
    } else {
        assert_ne!(process_uid, 0);
    }

    assert_eq!(http_get(&addr, "/healthz").0, 200);
    assert_eq!(http_get(&addr, "/readyz").0, 200);
    let (status, body) = http_get(
        &addr,
        "/in.php?key=caller&method=userrecaptcha&googlekey=g&pageurl=https://a.test",
    );
    assert_eq!(status, 200);
    assert!(body.starts_with("OK|"), "submit answered {body:?}");
    // The pins journal (and nothing else of keyrelay's) goes to the state volume.
    assert!(
        data_dir.join("pins.journal").exists(),
        "no pins.journal in data_dir; log:\n{}",
        proxy.log
    );

    signal(&proxy, "-TERM");
    proxy.wait_for_line("the drain", |l| l.contains("drained"));
    let status = proxy.wait_exit(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "SIGTERM is a clean exit");
    runtime.block_on(sim.shutdown());
}

/// A service manager's end of `NOTIFY_SOCKET`: a datagram socket in a temp dir.
struct NotifySocket {
    socket: UnixDatagram,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl NotifySocket {
    fn bind() -> NotifySocket {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        // A bound on each wait, not a guess at how long keyrelay takes.
        socket
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        NotifySocket {
            socket,
            path,
            _dir: dir,
        }
    }

    fn next(&self) -> String {
        let mut buf = [0u8; 4096];
        let n = self
            .socket
            .recv(&mut buf)
            .expect("a notification before the timeout");
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }
}

fn write_config(dir: &Path, sim: &keyrelay::sim::SimHandle) -> PathBuf {
    let path = dir.join("proxy.toml");
    std::fs::write(
        &path,
        format!(
            "listen = \"127.0.0.1:0\"\nupstream = \"{}\"\n[[keys]]\nname = \"a\"\nkey = \"{KEY}\"\n",
            sim.url()
        ),
    )
    .unwrap();
    path
}

#[tokio::test(flavor = "multi_thread")]
async fn under_type_notify_keyrelay_says_ready_once_listening_and_stopping_at_sigterm() {
    let sim = sim_with(&[KEY]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &sim);
    let notify = NotifySocket::bind();
    let mut proxy = Binary::spawn(
        &["--config", config.to_str().unwrap()],
        &[("NOTIFY_SOCKET", notify.path.to_str().unwrap())],
    );
    let ready = tokio::task::block_in_place(|| notify.next());
    assert_eq!(ready, "READY=1\n");
    // READY means it serves: the listening line was written before, and /healthz answers.
    let addr = tokio::task::block_in_place(|| proxy.wait_for_addr());
    assert_eq!(
        tokio::task::block_in_place(|| http_get(&addr, "/healthz")).0,
        200
    );

    signal(&proxy, "-TERM");
    let stopping = tokio::task::block_in_place(|| notify.next());
    assert_eq!(stopping, "STOPPING=1\n");
    let status = tokio::task::block_in_place(|| proxy.wait_exit(Duration::from_secs(20)));
    assert_eq!(status.code(), Some(0));
    // Nothing after STOPPING: a second READY would tell systemd the drain was a restart.
    notify.socket.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 64];
    assert!(
        notify.socket.recv(&mut buf).is_err(),
        "a message after STOPPING=1"
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_notify_socket_nobody_listens_on_is_logged_and_keyrelay_serves_anyway() {
    let sim = sim_with(&[KEY]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &sim);
    let missing = dir.path().join("no-such.sock");
    let mut proxy = Binary::spawn(
        &["--config", config.to_str().unwrap()],
        &[("NOTIFY_SOCKET", missing.to_str().unwrap())],
    );
    let addr = tokio::task::block_in_place(|| proxy.wait_for_addr());
    tokio::task::block_in_place(|| {
        proxy.wait_for_line("the notify warning", |l| {
            l.contains("cannot notify the service manager")
        })
    });
    assert_eq!(
        tokio::task::block_in_place(|| http_get(&addr, "/healthz")).0,
        200
    );
    sim.shutdown().await;
}

/// Parses a shipped `proxy.toml`, answering every `${VAR}` it asks for, and returns the
/// config and the names it asked for.
fn load_with_any_env(path: &str) -> (Config, Vec<String>) {
    let asked = std::cell::RefCell::new(Vec::new());
    let env = |name: &str| {
        asked.borrow_mut().push(name.to_owned());
        Some(match name {
            "CAPTCHAAI_KEYS" => "deploy-test-key-one-000001,deploy-test-key-two-000002".into(),
            _ => format!("deploy-test-value-for-{name}"),
        })
    };
    let config =
        Config::from_toml_str(&repo_file(path), &env).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut asked = asked.into_inner();
    asked.sort();
    asked.dedup();
    (config, asked)
}

#[test]
fn the_systemd_proxy_toml_uses_the_state_directory_and_only_variables_keys_env_sets() {
    let (config, asked) = load_with_any_env("deploy/systemd/proxy.toml");
    assert_eq!(
        config.data_dir.as_deref(),
        Some(Path::new("/var/lib/keyrelay"))
    );
    assert_eq!(config.keys.len(), 2, "the keys come from keys_env");
    let unit = repo_file("deploy/systemd/keyrelay.service");
    assert!(unit.contains("StateDirectory=keyrelay\n"));
    assert!(unit.contains("EnvironmentFile=/etc/keyrelay/keys.env\n"));
    assert!(unit.contains("ExecStart=/usr/local/bin/keyrelay --config /etc/keyrelay/proxy.toml\n"));
    let example = repo_file("deploy/systemd/keys.env.example");
    for name in &asked {
        assert!(
            example.lines().any(|l| l.starts_with(&format!("{name}="))),
            "proxy.toml reads {name}, which keys.env.example does not set"
        );
    }
}

#[test]
fn the_kubernetes_proxy_toml_is_cluster_mode_and_every_variable_comes_from_the_secret() {
    let (config, asked) = load_with_any_env("deploy/kubernetes/proxy.toml");
    assert!(config.cluster.is_some(), "two replicas need [cluster]");
    assert_eq!(
        config.data_dir.as_deref(),
        Some(Path::new("/var/lib/keyrelay"))
    );
    assert_eq!(config.listen.port(), 8080);
    let manifest = repo_file("deploy/kubernetes/keyrelay.yaml");
    for name in &asked {
        let at = manifest
            .find(&format!("- name: {name}\n"))
            .unwrap_or_else(|| panic!("proxy.toml reads {name}, which keyrelay.yaml does not set"));
        assert!(
            manifest[at..]
                .lines()
                .nth(2)
                .is_some_and(|l| l.contains("secretKeyRef")),
            "{name} must come from a secretKeyRef"
        );
    }
    assert!(
        asked.len() >= 3,
        "keys, worker token, admin token: {asked:?}"
    );
}

#[test]
fn the_binary_loads_no_library_the_image_lacks() {
    // The image has glibc (base-nossl) and the libgcc_s the Dockerfile copies; nothing else.
    let provided = [
        "linux-vdso.so.1",
        "libgcc_s.so.1",
        "libm.so.6",
        "libc.so.6",
        "libpthread.so.0",
        "libdl.so.2",
        "librt.so.1",
    ];
    let out = Command::new("ldd")
        .arg(env!("CARGO_BIN_EXE_keyrelay"))
        .output()
        .expect("ldd runs");
    let listing = String::from_utf8(out.stdout).unwrap();
    let libraries: Vec<&str> = listing
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| !name.contains("ld-linux"))
        .collect();
    assert!(libraries.contains(&"libc.so.6"), "{listing}");
    for library in libraries {
        assert!(
            provided.contains(&library),
            "keyrelay loads {library}, which the image does not ship:\n{listing}"
        );
    }
    assert!(repo_file("Dockerfile").contains("libgcc_s.so.1"));
}

/// The `docker …` commands a file shows (in the Dockerfile, in its comments), each with its
/// `\` continuation lines joined and whitespace collapsed.
fn docker_commands(text: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut pending: Option<String> = None;
    for line in text.lines() {
        let line = line.trim_start().trim_start_matches('#').trim();
        let command = match pending.as_mut() {
            Some(command) => command,
            None if line.starts_with("docker ") => pending.insert(String::new()),
            None => continue,
        };
        command.push(' ');
        match line.strip_suffix('\\') {
            Some(continued) => command.push_str(continued),
            None => {
                command.push_str(line);
                let whole = pending.take().unwrap_or_default();
                commands.push(whole.split_whitespace().collect::<Vec<_>>().join(" "));
            }
        }
    }
    commands
}

#[test]
fn the_docker_commands_shown_build_this_image_publish_its_port_and_mount_its_volumes() {
    // No Docker daemon runs in CI, so the commands the README shows cannot be run; they are
    // checked against the Dockerfile instead, whose command line the test above runs.
    let dockerfile = repo_file("Dockerfile");
    let shown = docker_commands(&dockerfile);
    for doc in ["README.md", "docs/deployment.md"] {
        assert_eq!(
            docker_commands(&repo_file(doc)),
            shown,
            "{doc} shows other docker commands than the Dockerfile's header"
        );
    }
    let [build, run] = &shown[..] else {
        panic!("the Dockerfile's header shows a build and a run: {shown:?}");
    };
    assert_eq!(build, "docker build -t keyrelay .");
    let args: Vec<&str> = run.split_whitespace().collect();
    assert_eq!(args[..2], ["docker", "run"]);
    assert_eq!(
        args.last(),
        Some(&"keyrelay"),
        "runs the image built: {run}"
    );
    let after = |flag: &str| -> Vec<&str> {
        args.windows(2)
            .filter(|pair| pair[0] == flag)
            .map(|pair| pair[1].trim_matches('"'))
            .collect()
    };
    let exposed = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("EXPOSE "))
        .expect("the Dockerfile exposes a port")
        .trim();
    let published: Vec<&str> = after("-p")
        .iter()
        .filter_map(|p| p.rsplit(':').next())
        .collect();
    assert_eq!(published, [exposed], "{run}");
    let mounted: Vec<&str> = after("-v")
        .iter()
        .filter_map(|v| v.split(':').nth(1))
        .collect();
    assert_eq!(mounted, dockerfile_array(&dockerfile, "VOLUME"), "{run}");
    assert!(
        after("-v").iter().any(|v| v.ends_with(":/etc/keyrelay:ro")),
        "the config is mounted read-only: {run}"
    );
    assert_eq!(after("--env-file"), ["keys.env"], "{run}");
}

#[test]
fn the_python_wheel_is_the_binary_with_cargo_tomls_metadata() {
    // pyproject.toml repeats what Cargo.toml says of the package (maturin takes only the
    // version from Cargo.toml here, `dynamic`), so the two must not drift apart.
    let pyproject: toml::Table = toml::from_str(&repo_file("pyproject.toml")).unwrap();
    let cargo: toml::Table = toml::from_str(&repo_file("Cargo.toml")).unwrap();
    let project = &pyproject["project"];
    let package = &cargo["package"];
    for field in ["name", "description", "license", "readme", "keywords"] {
        assert_eq!(project.get(field), package.get(field), "{field}");
    }
    assert!(
        project.get("version").is_none(),
        "the version is Cargo.toml's"
    );
    assert_eq!(project["dynamic"], toml::Value::from(vec!["version"]));
    let maturin = &pyproject["tool"]["maturin"];
    assert_eq!(maturin["bindings"].as_str(), Some("bin"));
    let backend = &pyproject["build-system"];
    assert_eq!(backend["build-backend"].as_str(), Some("maturin"));
}

//! `keyrelay ctl` as operators meet it: the real binary against a running keyrelay (in
//! process, or the real binary too), finding the admin API from `--config` or `--url`, the
//! token from the config or `KEYRELAY_ADMIN_TOKEN`, printing a table or one line, and
//! exiting non-zero with a clear message on every failure.

mod common;

use std::net::SocketAddr;
use std::process::{Command, Output};

use common::{config_for, sim_with, KEY_A, KEY_B, KEY_C};
use keyrelay::pool::AdminHold;
use keyrelay::server::Listeners;
use keyrelay::sim::SimHandle;
use keyrelay::App;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

const TOKEN: &str = "ctl-test-admin-token-77";

/// `keyrelay ctl ARGS` with `env` (and no inherited admin token), run off the runtime.
async fn ctl(args: &[&str], env: &[(&str, &str)]) -> Output {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_keyrelay"))
            .arg("ctl")
            .args(&args)
            .env_remove("RUST_LOG")
            .env_remove("KEYRELAY_ADMIN_TOKEN")
            .envs(env)
            .output()
            .expect("keyrelay runs")
    })
    .await
    .unwrap()
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// keyrelay in process with keys a, b, c and `token` as its admin token; a config file
/// naming its address (and `token`, if `token_in_file`) for ctl to read.
struct Running {
    sim: SimHandle,
    app: App,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Running {
    async fn start(token: Option<&str>, token_in_file: bool) -> Running {
        let sim = sim_with(&[KEY_A, KEY_B, KEY_C]).await;
        let mut config = config_for(
            &sim,
            &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0), ("c", KEY_C, 1.0)],
        );
        config.admin.token = token.map(keyrelay::CallerToken::new);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = App::with_seed(config, 7).unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(keyrelay::server::run_with(
            Listeners::new(listener),
            app.clone(),
            async {
                let _ = stopped.await;
            },
        ));
        let dir = tempfile::tempdir().unwrap();
        // What ctl reads; the keys' variables are deliberately unset in its environment.
        let mut text = format!(
            "listen = \"{addr}\"\nupstream = \"{}\"\n[[keys]]\nname = \"a\"\nkey = \"${{CTL_TEST_UNSET_KEY}}\"\n",
            sim.url()
        );
        if let (Some(token), true) = (token, token_in_file) {
            text.push_str(&format!("[admin]\ntoken = \"{token}\"\n"));
        }
        std::fs::write(dir.path().join("proxy.toml"), text).unwrap();
        let running = Running {
            sim,
            app,
            addr,
            dir,
            stop: Some(stop),
            server: Some(server),
        };
        let app = running.app.clone();
        common::eventually("startup refresh", move || {
            app.snapshot()
                .pool
                .keys()
                .iter()
                .all(|k| k.stats.balance().is_some())
        })
        .await;
        running
    }

    fn config(&self) -> String {
        self.dir.path().join("proxy.toml").display().to_string()
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.server.take().unwrap().await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn keys_prints_a_table_found_from_the_config() {
    let k = Running::start(Some(TOKEN), true).await;
    let config = k.config();
    let o = ctl(&["--config", &config, "keys"], &[]).await;
    assert!(o.status.success(), "{}", err(&o));
    let text = out(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("NAME") && lines[0].contains("HOLD"),
        "{text}"
    );
    assert_eq!(lines.len(), 4, "{text}");
    for (line, name, key) in [(1, "a", KEY_A), (2, "b", KEY_B), (3, "c", KEY_C)] {
        assert!(lines[line].starts_with(name), "{text}");
        assert!(
            lines[line].contains("active") && lines[line].contains("10.00"),
            "{text}"
        );
        assert!(
            lines[line].contains(&keyrelay::ApiKey::new(key).fingerprint()),
            "{text}"
        );
        assert!(!text.contains(key), "a key printed: {text}");
    }
    assert!(!text.contains(TOKEN) && !err(&o).contains(TOKEN));
    k.stop().await;
}

#[tokio::test]
async fn budgets_prints_a_line_per_token_or_says_there_are_none() {
    // No caller tokens here: the command says so rather than printing an empty table.
    let k = Running::start(Some(TOKEN), true).await;
    let config = k.config();
    let o = ctl(&["--config", &config, "budgets"], &[]).await;
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o), "no caller tokens are configured\n");
    k.stop().await;
    // With tokens, each one's line: tests/budgets.rs checks the figures.
    let rows = vec![keyrelay::admin::BudgetRow {
        token: "client-a".into(),
        spend: 41.7,
        thread_hours: 12.25,
        period_secs: 30 * 86_400,
        budget_kind: Some("spend".into()),
        budget: Some(50.0),
        used: Some(0.834),
        soft: Some(0.8),
    }];
    assert_eq!(
        keyrelay::ctl::budget_table(&rows),
        "TOKEN     SPEND    THREAD-HOURS  PERIOD  BUDGET  USED\nclient-a  41.7000  12.25         30days  50      83%\n"
    );
}

#[tokio::test]
async fn disable_drain_enable_and_refresh_print_one_line_each() {
    let k = Running::start(Some(TOKEN), false).await;
    let url = k.url();
    let env = [("KEYRELAY_ADMIN_TOKEN", TOKEN)];
    let o = ctl(&["--url", &url, "disable", "a"], &env).await;
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o).lines().count(), 1);
    assert!(
        out(&o).starts_with(
            "a: disabled (hold was -); active, out of rotation, balance 10.00, threads 0/5"
        ),
        "{}",
        out(&o)
    );
    assert_eq!(k.app.admin_hold("a"), Some(AdminHold::Disabled));
    let o = ctl(&["--url", &url, "drain", "a"], &env).await;
    assert!(
        out(&o).starts_with("a: draining (hold was disabled)"),
        "{}",
        out(&o)
    );
    assert_eq!(k.app.admin_hold("a"), Some(AdminHold::Draining));
    let o = ctl(&["--url", &url, "enable", "a"], &env).await;
    assert!(
        out(&o).starts_with("a: enabled (hold was draining); active, in rotation"),
        "{}",
        out(&o)
    );
    assert_eq!(k.app.admin_hold("a"), None);
    k.sim.set_balance(KEY_B, 33.5);
    let o = ctl(&["--url", &url, "refresh", "b"], &env).await;
    assert!(o.status.success(), "{}", err(&o));
    assert!(
        out(&o).starts_with("b: refreshed; active, in rotation, balance 33.50"),
        "{}",
        out(&o)
    );
    k.sim.set_balance(KEY_C, 4.0);
    let o = ctl(&["--url", &url, "refresh"], &env).await;
    assert!(o.status.success(), "{}", err(&o));
    let c = out(&o)
        .lines()
        .find(|l| l.starts_with('c'))
        .unwrap_or_default()
        .to_owned();
    assert!(c.contains("4.00"), "{}", out(&o));
    k.stop().await;
}

#[tokio::test]
async fn every_failure_exits_non_zero_with_what_to_do() {
    let k = Running::start(Some(TOKEN), false).await;
    let url = k.url();
    let good = [("KEYRELAY_ADMIN_TOKEN", TOKEN)];
    // No token, then a wrong one.
    let o = ctl(&["--url", &url, "keys"], &[]).await;
    assert!(!o.status.success());
    assert!(
        err(&o).contains("refused the token") && err(&o).contains("set KEYRELAY_ADMIN_TOKEN"),
        "{}",
        err(&o)
    );
    let o = ctl(
        &["--url", &url, "disable", "a"],
        &[("KEYRELAY_ADMIN_TOKEN", "nope")],
    )
    .await;
    assert!(!o.status.success());
    assert!(
        err(&o).contains("wrong admin token") && err(&o).contains("is not the running keyrelay's"),
        "{}",
        err(&o)
    );
    assert!(
        !err(&o).contains("nope"),
        "the token is not echoed: {}",
        err(&o)
    );
    assert_eq!(k.app.admin_hold("a"), None);
    // No such key.
    let o = ctl(&["--url", &url, "drain", "nobody"], &good).await;
    assert!(!o.status.success());
    assert!(
        err(&o).contains("no configured key is named \"nobody\""),
        "{}",
        err(&o)
    );
    // Something that is not keyrelay's admin API (the simulator).
    let sim = k.sim.url();
    let o = ctl(&["--url", &sim, "keys"], &good).await;
    assert!(!o.status.success());
    assert!(err(&o).contains("not keyrelay's admin API"), "{}", err(&o));
    // Nothing listening.
    let free = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let o = ctl(&["--url", &format!("http://{free}"), "keys"], &good).await;
    assert!(!o.status.success());
    assert!(
        err(&o).contains(&format!("keyrelay is not running at http://{free}")),
        "{}",
        err(&o)
    );
    // A URL ctl cannot use, and a config it cannot read.
    let o = ctl(&["--url", "https://127.0.0.1:1", "keys"], &good).await;
    assert!(!o.status.success());
    assert!(err(&o).contains("ctl speaks plain http"), "{}", err(&o));
    let o = ctl(&["--config", "/nonexistent/proxy.toml", "keys"], &good).await;
    assert!(!o.status.success());
    assert!(
        err(&o).contains("cannot read /nonexistent/proxy.toml"),
        "{}",
        err(&o)
    );
    k.stop().await;
}

#[tokio::test]
async fn the_binary_serves_admin_listen_and_logs_who_did_what() {
    let sim = sim_with(&[KEY_A]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.toml");
    std::fs::write(
        &path,
        format!(
            "listen = \"127.0.0.1:0\"\nupstream = \"{}\"\nrefresh_interval = \"1h\"\n\
             [pins]\ndurable = false\n\
             [admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"${{KEYRELAY_ADMIN_TOKEN}}\"\n\
             [[keys]]\nname = \"only\"\nkey = \"{KEY_A}\"\n",
            sim.url()
        ),
    )
    .unwrap();
    let path = path.display().to_string();
    let mut binary = common::Binary::spawn(
        &["--config", &path, "--threads", "1"],
        &[("KEYRELAY_ADMIN_TOKEN", TOKEN)],
    );
    let proxy = binary.wait_for_addr();
    let line = binary.wait_for_line("the admin address", |l| l.contains("admin API listening"));
    let admin = line
        .split("admin=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no admin address in {line}"))
        .to_owned();
    assert_ne!(admin, proxy);
    let o = ctl(
        &["--url", &format!("http://{admin}"), "disable", "only"],
        &[("KEYRELAY_ADMIN_TOKEN", TOKEN)],
    )
    .await;
    assert!(o.status.success(), "{}\n{}", err(&o), binary.log);
    let logged = binary.wait_for_line("the admin action", |l| l.contains("admin action"));
    for part in [
        "by=\"admin\"",
        "auth=\"token\"",
        "peer=127.0.0.1:",
        "action=\"disable\"",
        "key=\"only\"",
    ] {
        assert!(logged.contains(part), "{part} missing: {logged}");
    }
    // The proxy's listener no longer serves the operator endpoints.
    let o = ctl(
        &["--url", &format!("http://{proxy}"), "keys"],
        &[("KEYRELAY_ADMIN_TOKEN", TOKEN)],
    )
    .await;
    assert!(!o.status.success());
    let log = binary.stop();
    assert!(!log.contains(TOKEN), "the token in the log:\n{log}");
    assert!(!log.contains(KEY_A), "a key in the log:\n{log}");
}

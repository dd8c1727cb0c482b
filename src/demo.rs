//! `keyrelay demo`: the simulator and the proxy in one process, a pool with a healthy key, a
//! heavier key, a key revoked mid-run, a key that runs out of balance and a backup key, and
//! a script-like workload driven through the proxy, narrated as it happens: one task at a
//! time first, then a burst of scripts at once, more than the pool has threads.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tokio::sync::broadcast::error::TryRecvError;
use tokio::time::Instant;

use crate::app::{App, Event};
use crate::config::{Config, KeyConfig, Upstream};
use crate::health::StateKind;
use crate::sim::{SimHandle, SimKey, SimKeyState, Simulator};

type DemoError = Box<dyn std::error::Error + Send + Sync>;

/// The demo's keys: (name, simulator key, weight). Fake keys, 32 characters like real ones.
const KEYS: [(&str, &str, f64); 4] = [
    ("steady", "demo-steady-00000000000000000001", 1.0),
    ("heavy", "demo-heavy-000000000000000000002", 2.0),
    ("revoked", "demo-revoked-0000000000000000003", 1.0),
    ("drained", "demo-drained-0000000000000000004", 1.0),
];

/// The backup key: tier 1, so it takes tasks only while the others are out or full.
const SPARE: (&str, &str) = ("spare", "demo-spare-000000000000000000005");

/// Threads of every demo key.
const THREADS: u32 = 5;

/// Scripts submitting at once in the burst: more than the pool's free threads.
const BURST: usize = 25;

/// Seed for key selection.
const DEMO_SEED: u64 = 2026;

/// Upper bound on tasks, in case the random picks are slow to reach the failing keys.
const MAX_TASKS: usize = 40;
/// Tasks to run at least, so the pool's steady state shows after the failures.
const MIN_TASKS: usize = 12;

/// What a caller's script sends as its key; keyrelay replaces it.
const SCRIPT_KEY: &str = "the-scripts-own-key-is-ignored-0";

/// Runs the demo and writes its narration to stdout.
///
/// # Errors
/// Only if a local socket cannot be bound or the proxy cannot be built.
pub async fn run() -> Result<(), DemoError> {
    let sim = Simulator::new()
        .key(sim_key(KEYS[0].1, 10.0, 0.01))
        .key(sim_key(KEYS[1].1, 10.0, 0.01))
        .key(sim_key(KEYS[2].1, 10.0, 0.01))
        // Enough for two tasks: the third submit finds the account empty.
        .key(sim_key(KEYS[3].1, 10.0, 4.0))
        .key(sim_key(SPARE.1, 10.0, 0.01))
        .polls_to_ready(2)
        .spawn()
        .await?;
    let upstream = Upstream::parse(&sim.url()).map_err(|e| format!("simulator url: {e}"))?;
    let mut keys: Vec<KeyConfig> = KEYS
        .iter()
        .map(|(name, key, weight)| {
            let mut k = KeyConfig::new(name, key, upstream.clone());
            k.weight = *weight;
            k.threads = Some(THREADS);
            k
        })
        .collect();
    let mut spare = KeyConfig::new(SPARE.0, SPARE.1, upstream.clone());
    spare.threads = Some(THREADS);
    spare.tier = 1;
    keys.push(spare);
    let mut config = Config::for_keys(upstream, keys);
    // Long enough for every script of the burst to get a thread as others finish.
    config.capacity.queue_timeout = Duration::from_secs(30);
    // Seeded, so every run tells the same story.
    let app = App::with_seed(config, DEMO_SEED)?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let proxy_addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(crate::server::run(listener, app.clone(), async {
        let _ = stopped.await;
    }));

    println!("keyrelay demo");
    println!("  simulated CaptchaAI  {}", sim.url());
    println!("  keyrelay proxy       http://{proxy_addr}");
    println!(
        "  pool: steady (weight 1), heavy (weight 2), revoked (weight 1), drained (weight 1),"
    );
    println!("        spare (tier 1: a backup, used only while the others are out or full)");
    println!("        {THREADS} threads each");
    println!();

    let mut events = app.subscribe();
    wait_for_first_refresh(&app).await;
    println!("startup refresh read every key's balance; all five keys are in rotation.");
    sim.set_state(KEYS[2].1, SimKeyState::Unknown);
    println!("the service now rejects 'revoked' (ERROR_KEY_DOES_NOT_EXIST); keyrelay has not noticed yet.");
    println!("'drained' holds balance for two tasks.");
    println!();

    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let base = format!("http://{proxy_addr}");
    let names: HashMap<&str, &str> = KEYS
        .iter()
        .map(|(n, k, _)| (*k, *n))
        .chain([(SPARE.1, SPARE.0)])
        .collect();
    let mut served: HashMap<String, usize> = HashMap::new();
    let (mut saw_revoked, mut saw_drained) = (false, false);

    for n in 1..=MAX_TASKS {
        if n > MIN_TASKS && saw_revoked && saw_drained {
            break;
        }
        let outcome = solve_one(&client, &base, n).await;
        match outcome {
            Ok((task_id, token)) => {
                let owner = sim
                    .task_owner(task_id)
                    .and_then(|k| names.get(k.as_str()).copied())
                    .unwrap_or("?");
                *served.entry(owner.to_owned()).or_default() += 1;
                println!("task {n:>2}  id {task_id}  served by {owner:<8}  token {token}");
            }
            Err(e) => println!("task {n:>2}  failed: {e}"),
        }
        for line in drain_events(&mut events, &mut saw_revoked, &mut saw_drained) {
            println!("{line}");
        }
    }

    println!();
    burst(&app, &sim, &client, &base, &names, &mut served).await;

    println!();
    println!("final pool state");
    print!("{}", pool_table(&app, &sim, &served));
    println!();
    println!("/metrics (pool health)");
    let metrics = app.render_metrics();
    for line in metrics.lines().filter(|l| {
        l.starts_with("keyrelay_keys_active")
            || l.starts_with("keyrelay_keys_configured")
            || l.starts_with("keyrelay_key_up")
            || l.starts_with("keyrelay_failovers_total")
            || l.starts_with("keyrelay_key_threads_in_use")
            || l.starts_with("keyrelay_pool_full_total")
    }) {
        println!("  {line}");
    }

    let _ = stop.send(());
    let _ = server.await;
    sim.shutdown().await;
    Ok(())
}

/// The second act: `BURST` scripts at once against the keys still in rotation, more than
/// they have threads. No key is handed a task beyond its threads: the backup takes the
/// overflow, and the rest wait in keyrelay's queue until a thread frees.
async fn burst(
    app: &App,
    sim: &SimHandle,
    client: &Client<HttpConnector, Full<Bytes>>,
    base: &str,
    names: &HashMap<&str, &str>,
    served: &mut HashMap<String, usize>,
) {
    let snapshot = app.snapshot();
    let now = Instant::now();
    let primaries: Vec<&str> = snapshot
        .pool
        .keys()
        .iter()
        .filter(|k| k.tier == 0 && snapshot.pool.in_rotation(k, now))
        .map(|k| k.name.as_str())
        .collect();
    println!(
        "a burst: {BURST} scripts submit at once. {} have {} threads between them, spare {THREADS} more.",
        primaries.join(" and "),
        primaries.len() as u32 * THREADS
    );
    let metrics = app.metrics();
    let busy_answers = || -> u64 {
        snapshot
            .pool
            .keys()
            .iter()
            .map(|k| metrics.submits(&k.name, "key_full"))
            .sum()
    };
    let busy_before = busy_answers();
    let results = join_all((1..=BURST).map(|n| solve_one(client, base, 100 + n))).await;
    let mut solved = 0;
    for result in results {
        match result {
            Ok((task_id, _)) => {
                solved += 1;
                let owner = sim
                    .task_owner(task_id)
                    .and_then(|k| names.get(k.as_str()).copied())
                    .unwrap_or("?");
                *served.entry(owner.to_owned()).or_default() += 1;
            }
            Err(e) => println!("  a script failed: {e}"),
        }
    }
    for key in snapshot.pool.keys() {
        if snapshot.pool.in_rotation(key, Instant::now()) {
            let peak = sim.peak_threads(key.key.expose());
            println!(
                "  {:<8} at most {peak} of its {THREADS} threads at once",
                key.name
            );
        }
    }
    let waited = metrics
        .queue_wait
        .with_label_values(&[crate::metrics::WaitResult::Admitted.label()])
        .get_sample_count();
    println!(
        "  {solved} of {BURST} solved; {waited} waited in keyrelay's queue for a thread; \
         the service answered \"no free thread\" {} times",
        busy_answers() - busy_before
    );
}

fn sim_key(key: &str, balance: f64, cost: f64) -> SimKey {
    let mut k = SimKey::valid(key);
    k.balance = balance;
    k.cost = cost;
    k
}

/// Waits, boundedly, until the startup refresh has read every key's balance.
async fn wait_for_first_refresh(app: &App) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let snapshot = app.snapshot();
        if snapshot
            .pool
            .keys()
            .iter()
            .all(|k| k.stats.balance().is_some())
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Submits one reCAPTCHA task and polls it to its token, as a script would.
async fn solve_one(
    client: &Client<HttpConnector, Full<Bytes>>,
    base: &str,
    n: usize,
) -> Result<(u64, String), DemoError> {
    let submit = format!(
        "{base}/in.php?key={SCRIPT_KEY}&method=userrecaptcha&googlekey=demo-sitekey&pageurl=https://example.com/{n}&json=1"
    );
    let answer = get_json(client, &submit).await?;
    if answer["status"] != 1 {
        return Err(format!("submit answered {answer}").into());
    }
    let task_id = match &answer["request"] {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.parse().ok(),
        _ => None,
    }
    .ok_or_else(|| format!("submit answered no task id: {answer}"))?;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let poll = format!("{base}/res.php?key={SCRIPT_KEY}&action=get&id={task_id}&json=1");
        let answer = get_json(client, &poll).await?;
        if answer["status"] == 1 {
            let token = answer["request"].as_str().unwrap_or_default().to_owned();
            return Ok((task_id, token));
        }
        if answer["request"] != "CAPCHA_NOT_READY" {
            return Err(format!("poll answered {answer}").into());
        }
    }
    Err("task not solved after 20 polls".into())
}

async fn get_json(
    client: &Client<HttpConnector, Full<Bytes>>,
    url: &str,
) -> Result<serde_json::Value, DemoError> {
    let response = client.get(url.parse()?).await?;
    let body = response.into_body().collect().await?.to_bytes();
    Ok(serde_json::from_slice(&body)?)
}

/// Turns pending events into narration lines, printed under the task they concern.
fn drain_events(
    events: &mut tokio::sync::broadcast::Receiver<Event>,
    saw_revoked: &mut bool,
    saw_drained: &mut bool,
) -> Vec<String> {
    let mut lines = Vec::new();
    loop {
        match events.try_recv() {
            Ok(Event::Failover { key, reason }) => lines.push(format!(
                "          failover: '{key}' answered {reason}; the task moved to another key"
            )),
            Ok(Event::KeyState {
                key,
                from,
                to,
                reason,
            }) => {
                let what = match (from, to, reason) {
                    (StateKind::Active, StateKind::Cooling, Some("ERROR_ZERO_BALANCE")) => {
                        "is out of rotation while keyrelay reads its threadsinfo"
                    }
                    (_, StateKind::Benched, Some("ERROR_ZERO_BALANCE")) => {
                        "benched: threadsinfo shows free threads, so the account is empty, not busy"
                    }
                    (_, StateKind::Benched, _) => "benched until a refresh shows it usable",
                    (_, StateKind::Cooling, _) => "cooling down",
                    (_, StateKind::Active, _) => "back in rotation",
                };
                if key == KEYS[2].0 && to == StateKind::Benched {
                    *saw_revoked = true;
                }
                if key == KEYS[3].0 && to == StateKind::Benched {
                    *saw_drained = true;
                }
                let reason = reason.unwrap_or("-");
                lines.push(format!("          key '{key}' {what} ({reason})"));
            }
            Ok(Event::Pinned { .. }) => {}
            Err(TryRecvError::Lagged(_)) => continue,
            Err(_) => break,
        }
    }
    lines
}

fn pool_table(app: &App, sim: &SimHandle, served: &HashMap<String, usize>) -> String {
    let snapshot = app.snapshot();
    let pool = &snapshot.pool;
    let now = Instant::now();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  {:<8}  {:<7}  {:<24}  {:>7}  {:>6}  {:>14}",
        "KEY", "STATE", "REASON", "WEIGHT", "TASKS", "SIM BALANCE"
    );
    for key in pool.keys() {
        let view = pool.health(key, now);
        let state = if view.state == StateKind::Active && !pool.in_rotation(key, now) {
            "low-bal"
        } else {
            view.state.label()
        };
        let balance = sim
            .balance(key.key.expose())
            .map_or("?".to_owned(), |b| format!("{b:.2}"));
        let _ = writeln!(
            out,
            "  {:<8}  {:<7}  {:<24}  {:>7}  {:>6}  {:>14}",
            key.name,
            state,
            view.reason.unwrap_or("-"),
            key.weight,
            served.get(&key.name).copied().unwrap_or(0),
            balance
        );
    }
    let _ = writeln!(
        out,
        "  {} of {} keys in rotation",
        pool.active_count(now),
        pool.keys().len()
    );
    out
}

//! `keyrelay demo`: the simulator and the proxy in one process, a pool with a healthy key, a
//! heavier key, a key revoked mid-run, a key that runs out of balance (all at a simulated
//! CaptchaAI) and a backup key at a simulated 2captcha, and a script-like workload driven
//! through the proxy, narrated as it happens: one task at a time first, then a burst of
//! scripts at once, more than the pool has threads, then a CaptchaAI outage that moves the
//! new tasks to 2captcha while the tasks made before wait for CaptchaAI's return.

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
use crate::captcha::ServiceCode;
use crate::config::{Config, KeyConfig, Upstream};
use crate::health::{Reason, StateKind};
use crate::provider::Provider;
use crate::sim::{SimHandle, SimKey, SimKeyState, Simulator};

type DemoError = Box<dyn std::error::Error + Send + Sync>;

/// The demo's keys: (name, simulator key, weight). Fake keys, 32 characters like real ones.
const KEYS: [(&str, &str, f64); 4] = [
    ("steady", "demo-steady-00000000000000000001", 1.0),
    ("heavy", "demo-heavy-000000000000000000002", 2.0),
    ("revoked", "demo-revoked-0000000000000000003", 1.0),
    ("drained", "demo-drained-0000000000000000004", 1.0),
];

/// The backup key, at 2captcha: tier 1, so it takes tasks only while the others are out or
/// full, or CaptchaAI is down.
const SPARE: (&str, &str) = ("spare", "demo-spare-000000000000000000005");

/// Threads of every demo key.
const THREADS: u32 = 5;

/// Scripts submitting at once in the burst: more than the pool's free threads.
const BURST: usize = 25;

/// Seed for key selection.
const DEMO_SEED: u64 = 2026;

/// How often a demo script polls one task before it gives up: 20 ms apart, a second in all,
/// ten of keyrelay's polling intervals.
const POLLS: usize = 50;

/// The demo's `[polling] interval`: 5 s compressed, as the demo's solve times are.
const DEMO_POLL_INTERVAL: Duration = Duration::from_millis(100);

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
        .polls_to_ready(2)
        .spawn()
        .await?;
    let backup = Simulator::new()
        .provider(Provider::TwoCaptcha)
        .key(sim_key(SPARE.1, 10.0, 0.01))
        .polls_to_ready(2)
        .spawn()
        .await?;
    let sims = Sims {
        captchaai: sim,
        twocaptcha: backup,
    };
    let sim = &sims.captchaai;
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
    let backup_upstream =
        Upstream::parse(&sims.twocaptcha.url()).map_err(|e| format!("simulator url: {e}"))?;
    let mut spare = KeyConfig::new(SPARE.0, SPARE.1, backup_upstream);
    spare.provider = Provider::TwoCaptcha;
    spare.threads = Some(THREADS);
    spare.tier = 1;
    keys.push(spare);
    let mut config = Config::for_keys(upstream, keys);
    // Long enough for every script of the burst to get a thread as others finish.
    config.capacity.queue_timeout = Duration::from_secs(30);
    // The demo's time is compressed: its tasks are solved in milliseconds and its scripts
    // poll every 20 ms, so polls are shaped at 100 ms and from the submit on, where real
    // scripts are held to 5 s and the provider's first-poll advice.
    config.polling.interval = DEMO_POLL_INTERVAL;
    config.polling.first = crate::config::FirstPoll::After(Duration::ZERO);
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
    println!("  simulated 2captcha   {}", sims.twocaptcha.url());
    println!("  keyrelay proxy       http://{proxy_addr}");
    println!(
        "  pool: steady (weight 1), heavy (weight 2), revoked (weight 1), drained (weight 1),"
    );
    println!("        at CaptchaAI; spare at 2captcha (tier 1: a backup, used only while the");
    println!("        others are out or full, or CaptchaAI is down)");
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
                let owner = sims.owner(task_id, &names);
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
    json_client(&sims, &client, &base, &names, &mut served).await;

    println!();
    burst(&app, &sims, &client, &base, &names, &mut served).await;

    println!();
    outage(
        &app,
        &sims,
        &client,
        &base,
        &names,
        &mut served,
        &mut events,
    )
    .await;

    println!();
    println!("final pool state");
    print!("{}", pool_table(&app, &sims, &served));
    let polls = app.metrics();
    println!();
    println!(
        "shaped polling: the scripts polled every 20 ms; keyrelay asked the service at most every {} ms per task and answered the rest itself: {} polls relayed, {} answered by keyrelay.",
        DEMO_POLL_INTERVAL.as_millis(),
        polls.polls_upstream.get(),
        polls.polls_locally.get()
    );
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
            || l.starts_with("keyrelay_provider_up")
            || l.starts_with("keyrelay_provider_outages_total")
            || l.starts_with("keyrelay_polls_total")
    }) {
        println!("  {line}");
    }

    let _ = stop.send(());
    let _ = server.await;
    sims.captchaai.shutdown().await;
    sims.twocaptcha.shutdown().await;
    Ok(())
}

/// The demo's two simulated services.
struct Sims {
    captchaai: SimHandle,
    twocaptcha: SimHandle,
}

impl Sims {
    /// The name of the key that made a task, at whichever service has it.
    fn owner<'a>(&self, task_id: u64, names: &HashMap<&str, &'a str>) -> &'a str {
        self.captchaai
            .task_owner(task_id)
            .or_else(|| self.twocaptcha.task_owner(task_id))
            .and_then(|k| names.get(k.as_str()).copied())
            .unwrap_or("?")
    }

    /// The service that holds `key`'s account.
    fn of(&self, key: &str) -> &SimHandle {
        if key == SPARE.1 {
            &self.twocaptcha
        } else {
            &self.captchaai
        }
    }
}

/// The third act: CaptchaAI goes down. Tasks made just before stay pinned to their keys;
/// new tasks go to 2captcha at once, without a CaptchaAI key being cooled for the outage;
/// once CaptchaAI answers again, the earlier tasks are polled there and new tasks go back.
async fn outage(
    app: &App,
    sims: &Sims,
    client: &Client<HttpConnector, Full<Bytes>>,
    base: &str,
    names: &HashMap<&str, &str>,
    served: &mut HashMap<String, usize>,
    events: &mut tokio::sync::broadcast::Receiver<Event>,
) {
    let (mut saw_revoked, mut saw_drained) = (true, true);
    let mut earlier = Vec::new();
    for n in 1..=2 {
        match submit_one(client, base, 200 + n).await {
            Ok(task_id) => earlier.push(task_id),
            Err(e) => println!("  a submit failed: {e}"),
        }
    }
    let at = earlier
        .iter()
        .map(|id| format!("{id} at {}", sims.owner(*id, names)))
        .collect::<Vec<_>>()
        .join(", ");
    println!("an outage: two tasks are submitted ({at}) and not yet polled; then CaptchaAI goes down (connections refused).");
    sims.captchaai.go_down().await;
    for n in 1..=5 {
        match solve_one(client, base, 300 + n).await {
            Ok((task_id, _)) => {
                let owner = sims.owner(task_id, names);
                *served.entry(owner.to_owned()).or_default() += 1;
                println!("  outage task {n}  id {task_id}  served by {owner}");
            }
            Err(e) => println!("  outage task {n}  failed: {e}"),
        }
        for line in drain_events(events, &mut saw_revoked, &mut saw_drained) {
            println!("{line}");
        }
    }
    let snapshot = app.snapshot();
    let now = Instant::now();
    let cooled: Vec<&str> = snapshot
        .pool
        .keys()
        .iter()
        .filter(|k| k.provider == Provider::CaptchaAi)
        .filter(|k| snapshot.pool.health(k, now).reason == Some(Reason::Transient))
        .map(|k| k.name.as_str())
        .collect();
    println!(
        "  CaptchaAI keys cooled for the outage: {}",
        if cooled.is_empty() {
            "none".to_owned()
        } else {
            cooled.join(", ")
        }
    );
    if let Err(e) = sims.captchaai.come_back().await {
        println!("  CaptchaAI could not come back: {e}");
        return;
    }
    println!("CaptchaAI is back; the next balance refresh of a CaptchaAI key gets an answer.");
    if let Some(key) = snapshot
        .pool
        .keys()
        .iter()
        .find(|k| k.provider == Provider::CaptchaAi)
    {
        crate::refresh::refresh_key(app, key, snapshot.config.timeouts.refresh).await;
    }
    for line in drain_events(events, &mut saw_revoked, &mut saw_drained) {
        println!("{line}");
    }
    for task_id in earlier {
        match poll_to_token(client, base, task_id).await {
            Ok((token, key)) => {
                println!("  earlier task {task_id}  polled with {key}, its own key  token {token}")
            }
            Err(e) => println!("  earlier task {task_id}  failed: {e}"),
        }
    }
    match solve_one(client, base, 400).await {
        Ok((task_id, _)) => {
            let owner = sims.owner(task_id, names);
            *served.entry(owner.to_owned()).or_default() += 1;
            println!("  a new task  id {task_id}  served by {owner}");
        }
        Err(e) => println!("  a new task failed: {e}"),
    }
}

/// The second act: `BURST` scripts at once against the keys still in rotation, more than
/// they have threads. No key is handed a task beyond its threads: the backup takes the
/// overflow, and the rest wait in keyrelay's queue until a thread frees.
async fn burst(
    app: &App,
    sims: &Sims,
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
                let owner = sims.owner(task_id, names);
                *served.entry(owner.to_owned()).or_default() += 1;
            }
            Err(e) => println!("  a script failed: {e}"),
        }
    }
    for key in snapshot.pool.keys() {
        if snapshot.pool.in_rotation(key, Instant::now()) {
            let peak = sims.of(key.key.expose()).peak_threads(key.key.expose());
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

/// A client of the JSON task API (as `anticaptchaofficial` sends it) next to the `in.php`
/// scripts: its image task goes to a key of the same pool, and its poll to that key.
async fn json_client(
    sims: &Sims,
    client: &Client<HttpConnector, Full<Bytes>>,
    base: &str,
    names: &HashMap<&str, &str>,
    served: &mut HashMap<String, usize>,
) {
    println!("a JSON API client (createTask / getTaskResult, as anticaptchaofficial sends them) in the same pool:");
    let create = serde_json::json!({
        "clientKey": SCRIPT_KEY,
        "task": {"type": "ImageToTextTask", "body": "aGVsbG8=", "numeric": 1},
    });
    let created = match post_json(client, &format!("{base}/createTask"), &create).await {
        Ok((created, _)) => created,
        Err(e) => return println!("  createTask failed: {e}"),
    };
    let Some(task_id) = created["taskId"].as_u64() else {
        return println!("  createTask answered {created}");
    };
    let owner = sims.owner(task_id, names);
    *served.entry(owner.to_owned()).or_default() += 1;
    println!("  createTask      taskId {task_id}  served by {owner}, as an in.php submit (method=base64)");
    let poll = serde_json::json!({"clientKey": SCRIPT_KEY, "taskId": task_id});
    for _ in 0..POLLS {
        tokio::time::sleep(Duration::from_millis(20)).await;
        match post_json(client, &format!("{base}/getTaskResult"), &poll).await {
            Ok((answer, key)) if answer["status"] == "ready" => {
                let text = answer["solution"]["text"].as_str().unwrap_or_default();
                return println!(
                    "  getTaskResult   ready, solution.text {text}, polled with {key}"
                );
            }
            Ok((answer, _)) if answer["status"] == "processing" => {}
            Ok((answer, _)) => return println!("  getTaskResult answered {answer}"),
            Err(e) => return println!("  getTaskResult failed: {e}"),
        }
    }
    println!("  the task was not solved after {POLLS} polls");
}

/// A JSON API call: its answer, and the key keyrelay served it with (`X-Keyrelay-Key`).
async fn post_json(
    client: &Client<HttpConnector, Full<Bytes>>,
    url: &str,
    body: &serde_json::Value,
) -> Result<(serde_json::Value, String), DemoError> {
    let request = hyper::Request::post(url)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))?;
    answer_and_key(client.request(request).await?).await
}

/// A JSON answer, and the name of the key keyrelay sent its request with
/// (`X-Keyrelay-Key`; `?` for an answer keyrelay made itself).
async fn answer_and_key(
    response: hyper::Response<hyper::body::Incoming>,
) -> Result<(serde_json::Value, String), DemoError> {
    let key = response
        .headers()
        .get("x-keyrelay-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?")
        .to_owned();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((serde_json::from_slice(&body)?, key))
}

/// Submits one reCAPTCHA task and polls it to its token, as a script would.
async fn solve_one(
    client: &Client<HttpConnector, Full<Bytes>>,
    base: &str,
    n: usize,
) -> Result<(u64, String), DemoError> {
    let task_id = submit_one(client, base, n).await?;
    let (token, _) = poll_to_token(client, base, task_id).await?;
    Ok((task_id, token))
}

/// Submits one reCAPTCHA task and returns its id.
async fn submit_one(
    client: &Client<HttpConnector, Full<Bytes>>,
    base: &str,
    n: usize,
) -> Result<u64, DemoError> {
    let submit = format!(
        "{base}/in.php?key={SCRIPT_KEY}&method=userrecaptcha&googlekey=demo-sitekey&pageurl=https://example.com/{n}&json=1"
    );
    let answer = get_json(client, &submit).await?;
    if answer["status"] != 1 {
        return Err(format!("submit answered {answer}").into());
    }
    match &answer["request"] {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.parse().ok(),
        _ => None,
    }
    .ok_or_else(|| format!("submit answered no task id: {answer}").into())
}

/// Polls a task until its token, as a script would; returns the token and the name of the
/// key keyrelay polled with (`X-Keyrelay-Key`).
async fn poll_to_token(
    client: &Client<HttpConnector, Full<Bytes>>,
    base: &str,
    task_id: u64,
) -> Result<(String, String), DemoError> {
    for _ in 0..POLLS {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let poll = format!("{base}/res.php?key={SCRIPT_KEY}&action=get&id={task_id}&json=1");
        let (answer, key) = answer_and_key(client.get(poll.parse()?).await?).await?;
        if answer["status"] == 1 {
            let token = answer["request"].as_str().unwrap_or_default().to_owned();
            return Ok((token, key));
        }
        if answer["request"] != "CAPCHA_NOT_READY" {
            return Err(format!("poll answered {answer}").into());
        }
    }
    Err(format!("task not solved after {POLLS} polls").into())
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
                const ZERO_BALANCE: Option<Reason> = Some(Reason::Service(ServiceCode::ZERO_BALANCE));
                let what = match (from, to, reason) {
                    (StateKind::Active, StateKind::Cooling, ZERO_BALANCE) => {
                        "is out of rotation while keyrelay reads its threadsinfo"
                    }
                    (_, StateKind::Benched, ZERO_BALANCE) => {
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
                let reason = reason.map_or("-", Reason::label);
                lines.push(format!("          key '{key}' {what} ({reason})"));
            }
            Ok(Event::Provider { provider, up }) => lines.push(if up {
                format!("          provider {provider} answers again; its keys take tasks again")
            } else {
                format!("          provider {provider} is down: its keys take no new task while another provider's can")
            }),
            Ok(Event::Pinned { .. }) => {}
            Err(TryRecvError::Lagged(_)) => continue,
            Err(_) => break,
        }
    }
    lines
}

fn pool_table(app: &App, sims: &Sims, served: &HashMap<String, usize>) -> String {
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
        let balance = sims
            .of(key.key.expose())
            .balance(key.key.expose())
            .map_or("?".to_owned(), |b| format!("{b:.2}"));
        let _ = writeln!(
            out,
            "  {:<8}  {:<7}  {:<24}  {:>7}  {:>6}  {:>14}",
            key.name,
            state,
            view.reason.map_or("-", Reason::label),
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

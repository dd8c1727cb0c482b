//! What the pool costs its users, against the simulator: scripts that poll every second
//! for tasks the service takes 10 to 30 seconds to solve, through keyrelay with shaped
//! polling (the default) and without (`[polling] interval = "0s"`); then tasks whose
//! callers left right after the submit. Run by `bench/economics.sh`, which documents the
//! knobs; it prints a Markdown table and whether each of issue 40's goals is met:
//!
//! - upstream polls per solved task: at most the mean solve time over `interval`, plus one;
//! - answer latency added (from the moment the service had the solution to the moment the
//!   script got it): at most one `interval`;
//! - thread-seconds held per abandoned task: at most its solve time plus `orphan_after`
//!   plus one `interval`.
//!
//! It measures counts and time, not CPU: a dev build is as good as a release one.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use keyrelay::config::{Config, FirstPoll, KeyConfig, Polling, Upstream};
use keyrelay::sim::{SimHandle, SimKey, Simulator};
use keyrelay::App;
use tokio::net::TcpListener;
use tokio::time::Instant;

const KEY: &str = "econ-key-000000000000000000000001";

fn env_secs(name: &str, default: u64) -> Duration {
    Duration::from_secs(
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Settings {
    scripts: usize,
    duration: Duration,
    solve_min: Duration,
    solve_max: Duration,
    abandoned: usize,
    orphan_after: Duration,
}

/// One script's finished tasks: (upstream-visible solve moment, moment it got the answer).
#[derive(Default)]
struct Observed {
    solved: usize,
    added: Vec<Duration>,
}

async fn sim(settings: &Settings) -> SimHandle {
    let mut key = SimKey::valid(KEY);
    key.threads = 10_000;
    key.balance = 1e9;
    Simulator::new()
        .key(key)
        .polls_to_ready(0)
        .solve_time(settings.solve_min, settings.solve_max)
        .spawn()
        .await
        .expect("the simulator binds 127.0.0.1:0")
}

fn config(sim: &SimHandle, polling: Polling) -> Config {
    let upstream = Upstream::parse(&sim.url()).expect("the simulator's url");
    let mut key = KeyConfig::new("econ", KEY, upstream.clone());
    key.threads = Some(10_000);
    let mut config = Config::for_keys(upstream, vec![key]);
    config.polling = polling;
    config
}

async fn start(config: Config) -> (App, String, tokio::sync::oneshot::Sender<()>) {
    let app = App::new(config).expect("keyrelay builds");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(keyrelay::server::run(listener, app.clone(), async {
        let _ = stopped.await;
    }));
    (app, base, stop)
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

async fn get(client: &HttpClient, url: &str) -> String {
    let uri = url.parse().expect("a url");
    match client.get(uri).await {
        Ok(response) => match response.into_body().collect().await {
            Ok(body) => String::from_utf8_lossy(&body.to_bytes()).into_owned(),
            Err(_) => String::new(),
        },
        Err(_) => String::new(),
    }
}

async fn submit(client: &HttpClient, base: &str) -> Option<u64> {
    let answer = get(
        client,
        &format!("{base}/in.php?key=any&method=userrecaptcha&googlekey=s&pageurl=https://x.test"),
    )
    .await;
    answer.strip_prefix("OK|")?.trim().parse().ok()
}

/// One script: submit, poll every second until solved, again, until `until`.
async fn script(client: HttpClient, base: String, sim: SimHandle, until: Instant) -> Observed {
    let mut seen = Observed::default();
    while Instant::now() < until {
        let Some(id) = submit(&client, &base).await else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let answer = get(
                &client,
                &format!("{base}/res.php?key=any&action=get&id={id}"),
            )
            .await;
            if answer.starts_with("OK|") {
                let got = Instant::now();
                if let Some(ready) = sim.ready_at(id) {
                    seen.added.push(got.saturating_duration_since(ready));
                }
                seen.solved += 1;
                break;
            }
            if answer != "CAPCHA_NOT_READY" {
                break;
            }
        }
    }
    seen
}

fn upstream_polls(sim: &SimHandle) -> usize {
    sim.received()
        .iter()
        .filter(|r| r.path == "/res.php" && r.action.as_deref() == Some("get"))
        .count()
}

struct Row {
    mode: &'static str,
    solved: usize,
    polls: usize,
    mean_solve: Duration,
    added_mean: Duration,
    added_max: Duration,
}

async fn polling_run(settings: &Settings, mode: &'static str, polling: Polling) -> Row {
    let sim = sim(settings).await;
    let (_app, base, stop) = start(config(&sim, polling)).await;
    let until = Instant::now() + settings.duration;
    let scripts: Vec<_> = (0..settings.scripts)
        .map(|_| {
            let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
            tokio::spawn(script(client, base.clone(), sim.clone(), until))
        })
        .collect();
    let mut solved = 0;
    let mut added = Vec::new();
    for script in scripts {
        if let Ok(seen) = script.await {
            solved += seen.solved;
            added.extend(seen.added);
        }
    }
    let polls = upstream_polls(&sim);
    let _ = stop.send(());
    sim.shutdown().await;
    let mean = |values: &[Duration]| {
        let n = u32::try_from(values.len().max(1)).unwrap_or(u32::MAX);
        values.iter().sum::<Duration>() / n
    };
    Row {
        mode,
        solved,
        polls,
        mean_solve: (settings.solve_min + settings.solve_max) / 2,
        added_mean: mean(&added),
        added_max: added.iter().max().copied().unwrap_or_default(),
    }
}

/// Tasks submitted and never polled: the thread-seconds keyrelay counts them in use, per
/// task, integrated every 100 ms until none is left (or a bound of ten minutes).
async fn abandoned_run(settings: &Settings) -> f64 {
    let sim = sim(settings).await;
    let polling = Polling {
        orphan_after: settings.orphan_after,
        ..Polling::default()
    };
    let (app, base, stop) = start(config(&sim, polling)).await;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let mut submitted = 0;
    for _ in 0..settings.abandoned {
        if submit(&client, &base).await.is_some() {
            submitted += 1;
        }
    }
    let mut held = 0.0f64;
    let step = Duration::from_millis(100);
    let bound = Instant::now() + Duration::from_secs(600);
    let mut last = Instant::now();
    loop {
        tokio::time::sleep(step).await;
        let now = Instant::now();
        let snapshot = app.snapshot();
        let in_use: u32 = snapshot
            .pool
            .keys()
            .iter()
            .map(|k| snapshot.pool.load(k).in_use())
            .sum();
        held += f64::from(in_use) * (now - last).as_secs_f64();
        last = now;
        if in_use == 0 || now > bound {
            break;
        }
    }
    let _ = stop.send(());
    sim.shutdown().await;
    held / f64::from(u32::try_from(submitted.max(1)).unwrap_or(u32::MAX))
}

#[tokio::main]
async fn main() {
    let settings = Settings {
        scripts: env_count("ECON_SCRIPTS", 100),
        duration: env_secs("ECON_DURATION", 60),
        solve_min: env_secs("ECON_SOLVE_MIN", 10),
        solve_max: env_secs("ECON_SOLVE_MAX", 30),
        abandoned: env_count("ECON_ABANDONED", 50),
        orphan_after: env_secs("ECON_ORPHAN_AFTER", 30),
    };
    let shaped = Polling {
        first: FirstPoll::Auto,
        ..Polling::default()
    };
    let interval = shaped.interval;
    let mut rows = Vec::new();
    for (mode, polling) in [
        ("shaped (default)", shaped),
        ("relayed (interval 0s)", Polling::off()),
    ] {
        eprintln!(
            "[economics] {mode}: {} scripts polling every 1 s for {:?}",
            settings.scripts, settings.duration
        );
        rows.push(polling_run(&settings, mode, polling).await);
    }
    eprintln!(
        "[economics] {} tasks abandoned after their submit",
        settings.abandoned
    );
    let held = abandoned_run(&settings).await;

    println!("| polling | tasks solved | upstream polls | polls per solved task | goal | answer latency added, mean / max | goal |");
    println!("| --- | --: | --: | --: | --: | --: | --: |");
    let poll_goal = settings_goal(&rows[0], interval);
    for row in &rows {
        let per_task = row.polls as f64 / row.solved.max(1) as f64;
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.2} s / {:.2} s | {:.0} s |",
            row.mode,
            row.solved,
            row.polls,
            per_task,
            poll_goal,
            row.added_mean.as_secs_f64(),
            row.added_max.as_secs_f64(),
            interval.as_secs_f64()
        );
    }
    let held_goal =
        ((settings.solve_min + settings.solve_max) / 2 + settings.orphan_after + interval)
            .as_secs_f64();
    println!();
    println!("| abandoned tasks | thread-seconds held per task | goal (mean solve + orphan_after + interval) |");
    println!("| --- | --: | --: |");
    println!(
        "| {} | {:.1} | {:.1} |",
        settings.abandoned, held, held_goal
    );
    let shaped = &rows[0];
    let met = (shaped.polls as f64 / shaped.solved.max(1) as f64) <= poll_goal
        && shaped.added_max <= interval + Duration::from_secs(1)
        && held <= held_goal;
    println!();
    println!("goals met: {met}");
}

/// Issue 40's goal for upstream polls per solved task: the mean solve time over the
/// interval, plus one.
fn settings_goal(row: &Row, interval: Duration) -> f64 {
    row.mean_solve.as_secs_f64() / interval.as_secs_f64() + 1.0
}

//! Pins survive restarts: a clean stop and a `kill -9` both keep every task whose submit was
//! answered, and a damaged journal is recovered from, never fatal.

mod common;

use common::*;
use http_body_util::BodyExt;
use hyper::body::Bytes;
use std::path::Path;

/// Writes a proxy.toml for `sim` in `dir`; pins go to `dir` too (the default data_dir).
fn write_config(dir: &Path, sim_url: &str) -> std::path::PathBuf {
    let path = dir.join("proxy.toml");
    std::fs::write(
        &path,
        format!(
            "listen = \"127.0.0.1:0\"\nupstream = \"{sim_url}\"\nrefresh_interval = \"1h\"\n\
             [[keys]]\nname = \"a\"\nkey = \"{KEY_A}\"\n[[keys]]\nname = \"b\"\nkey = \"{KEY_B}\"\n\
             [[keys]]\nname = \"c\"\nkey = \"{KEY_C}\"\n"
        ),
    )
    .unwrap();
    path
}

async fn get(
    client: &hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Full<Bytes>,
    >,
    url: String,
) -> String {
    let response = client.get(url.parse().unwrap()).await.expect("answered");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

fn client() -> hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    http_body_util::Full<Bytes>,
> {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

/// A simulator with room for every task, a config in a temp dir (the journal goes there too),
/// and the tasks submitted through a binary that has since been stopped.
struct Stopped {
    sim: keyrelay::sim::SimHandle,
    dir: tempfile::TempDir,
    config: std::path::PathBuf,
    tasks: Vec<u64>,
}

impl Stopped {
    fn args(&self) -> [&str; 2] {
        ["--config", self.config.to_str().unwrap()]
    }

    fn journal(&self) -> std::path::PathBuf {
        self.dir.path().join("pins.journal")
    }

    /// Starts the binary again; returns it, its address and its "pin journal replayed" line.
    fn restart(&self) -> (Binary, String, String) {
        let mut proxy = Binary::spawn(&self.args(), &[]);
        let addr = proxy.wait_for_addr();
        let replay = proxy
            .log
            .lines()
            .find(|l| l.contains("pin journal replayed"))
            .unwrap_or_else(|| panic!("no replay line:\n{}", proxy.log))
            .to_owned();
        (proxy, addr, replay)
    }

    /// Polls each of `tasks` once through `addr` and checks that every poll reached the
    /// simulator once, with the key that created its task.
    async fn polled_with_their_keys(&self, addr: &str, tasks: &[u64]) {
        let client = client();
        self.sim.clear_received();
        for id in tasks {
            let answer = get(
                &client,
                format!("http://{addr}/res.php?key={CALLER_KEY}&action=get&id={id}"),
            )
            .await;
            assert_eq!(answer, "CAPCHA_NOT_READY", "task {id}");
        }
        let polls: Vec<_> = self
            .sim
            .received()
            .into_iter()
            .filter(|r| r.action.as_deref() == Some("get"))
            .collect();
        assert_eq!(polls.len(), tasks.len(), "one poll per task, no probe");
        for r in polls {
            let id: u64 = r
                .params
                .iter()
                .find(|(k, _)| k == "id")
                .unwrap()
                .1
                .parse()
                .unwrap();
            assert_eq!(
                r.key,
                self.sim.task_owner(id),
                "task {id} polled with its creating key"
            );
        }
    }
}

/// Submits `n` tasks through a fresh binary and stops it with `signal`.
async fn submit_then_stop(signal: &str, n: usize) -> Stopped {
    // Enough threads that no submit is refused for want of one.
    let mut sim = keyrelay::sim::Simulator::new();
    for key in [KEY_A, KEY_B, KEY_C] {
        sim = sim.key(keyrelay::sim::SimKey {
            threads: 100,
            ..keyrelay::sim::SimKey::valid(key)
        });
    }
    let sim = sim.spawn().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &sim.url());
    let args = ["--config", config.to_str().unwrap()];
    let client = client();

    let mut proxy = Binary::spawn(&args, &[]);
    let addr = proxy.wait_for_addr();
    let mut tasks = Vec::new();
    for _ in 0..n {
        let answer = get(
            &client,
            format!(
                "http://{addr}/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p"
            ),
        )
        .await;
        let id: u64 = answer
            .strip_prefix("OK|")
            .expect("accepted")
            .parse()
            .unwrap();
        tasks.push(id);
    }
    let killed = std::process::Command::new("kill")
        .args([signal, &proxy.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    proxy.wait_exit(std::time::Duration::from_secs(20));
    Stopped {
        sim,
        dir,
        config,
        tasks,
    }
}

/// Submits `n` tasks, stops the binary with `signal`, restarts it, and checks that every
/// task is polled with the key that created it.
async fn survive(signal: &str, n: usize) {
    let stopped = submit_then_stop(signal, n).await;
    let (proxy, addr, replay) = stopped.restart();
    assert!(replay.contains(&format!("loaded={n}")), "{replay}");
    stopped.polled_with_their_keys(&addr, &stopped.tasks).await;
    let log = proxy.stop();
    assert!(!log.contains(KEY_A), "no key in the log");
}

/// Each record of a journal as written by the format in `src/pins/journal/record.rs`: its
/// byte range and, for a PIN2 of a numeric id, the id.
fn records(journal: &[u8]) -> Vec<(std::ops::Range<usize>, u64)> {
    let mut records = Vec::new();
    let mut at = 0;
    while at < journal.len() {
        let len = u32::from_le_bytes(journal[at..at + 4].try_into().unwrap()) as usize;
        let payload = &journal[at + 8..at + 8 + len];
        assert_eq!(&payload[..2], [0x03, 0x00], "a PIN2 of a numeric id");
        let id = u64::from_le_bytes(payload[2..10].try_into().unwrap());
        records.push((at..at + 8 + len, id));
        at += 8 + len;
    }
    records
}

#[tokio::test]
async fn pins_survive_a_clean_restart() {
    survive("-TERM", 30).await;
}

#[tokio::test]
async fn pins_survive_kill_minus_9() {
    survive("-KILL", 30).await;
}

#[tokio::test]
async fn bad_bytes_cost_only_the_records_they_hit() {
    let stopped = submit_then_stop("-KILL", 40).await;
    let mut journal = std::fs::read(stopped.journal()).unwrap();
    let on_disk = records(&journal);
    assert_eq!(
        on_disk.iter().map(|(_, id)| *id).collect::<Vec<_>>(),
        stopped.tasks
    );
    // The byte of the example, inside the 11th record, and a length byte of the 30th.
    let hits = [300, on_disk[29].0.start];
    for at in hits {
        journal[at] ^= 0x01;
    }
    std::fs::write(stopped.journal(), &journal).unwrap();
    let damaged: Vec<usize> = hits
        .iter()
        .map(|at| {
            on_disk
                .iter()
                .position(|(span, _)| span.contains(at))
                .unwrap()
        })
        .collect();
    let skipped: usize = damaged.iter().map(|i| on_disk[*i].0.len()).sum();

    let (proxy, addr, replay) = stopped.restart();
    assert!(replay.contains("loaded=38"), "{replay}");
    let warning = proxy
        .log
        .lines()
        .find(|l| l.contains("pin journal has corrupt or torn records"))
        .unwrap_or_else(|| panic!("no damage report:\n{}", proxy.log));
    assert!(
        warning.contains(&format!("skipped_bytes={skipped}"))
            && warning.contains("damaged_regions=2"),
        "{warning}"
    );
    // The compaction at start rewrote the journal with the 38 pins and without the damage.
    assert_eq!(
        records(&std::fs::read(stopped.journal()).unwrap()).len(),
        38
    );
    let lost: Vec<u64> = damaged.iter().map(|i| stopped.tasks[*i]).collect();
    let kept: Vec<u64> = stopped
        .tasks
        .iter()
        .copied()
        .filter(|id| !lost.contains(id))
        .collect();
    stopped.polled_with_their_keys(&addr, &kept).await;
    // The two lost pins are found again by the owner probe.
    for id in lost {
        let answer = get(
            &client(),
            format!("http://{addr}/res.php?key={CALLER_KEY}&action=get&id={id}"),
        )
        .await;
        assert_eq!(answer, "CAPCHA_NOT_READY", "task {id}");
    }
    drop(proxy);
}

#[tokio::test]
async fn a_damaged_journal_is_recovered_from() {
    let sim = sim_with(&[KEY_A, KEY_B, KEY_C]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &sim.url());
    std::fs::write(
        dir.path().join("pins.journal"),
        b"\x07\x00\x00\x00garbage that is no journal",
    )
    .unwrap();
    let mut proxy = Binary::spawn(&["--config", config.to_str().unwrap()], &[]);
    let addr = proxy.wait_for_addr();
    let answer = get(
        &client(),
        format!("http://{addr}/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p"),
    )
    .await;
    assert!(answer.starts_with("OK|"), "{answer}");
    let log = proxy.stop();
    assert!(
        log.contains("pin journal has corrupt or torn records") && log.contains("loaded=0"),
        "the recovery is logged:\n{log}"
    );
}

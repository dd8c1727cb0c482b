//! Shaped polling across replicas on a real redis-server (`[polling]`, docs/polling.md): a
//! task's upstream polls are counted fleet-wide, whichever replica its callers reach, and a
//! final answer one replica kept is answered by every other without asking the service.
//! Skipped (passing) where redis-server is missing, as the other cluster tests are.

mod common;

use std::time::Duration;

use common::redis_server::Redis;
use common::replicas::*;
use common::*;
use keyrelay::config::{FirstPoll, Polling};

const HOUR: Duration = Duration::from_secs(3600);

/// Two replicas whose polls go upstream at once and then once an hour, fleet-wide.
async fn two_shaped_replicas(redis: &Redis, sim: &keyrelay::sim::SimHandle) -> Vec<Harness> {
    let mut replicas = Vec::new();
    for name in ["kr-1", "kr-2"] {
        let mut config = replica_config(sim, redis, name);
        config.polling = Polling {
            interval: HOUR,
            first: FirstPoll::After(Duration::ZERO),
            ..Polling::default()
        };
        replicas.push(Harness::start_without_refresh_wait(sim.clone(), config).await);
    }
    for replica in &replicas {
        wait_shared(replica).await;
    }
    wait_fleet(&replicas, 2).await;
    replicas
}

fn upstream_polls(sim: &keyrelay::sim::SimHandle, id: u64) -> usize {
    let id = id.to_string();
    sim.received()
        .iter()
        .filter(|r| r.path == "/res.php" && r.action.as_deref() == Some("get"))
        .filter(|r| r.params.iter().any(|(n, v)| n == "id" && *v == id))
        .count()
}

async fn poll_text(via: &Harness, id: u64) -> String {
    via.get(&format!("/res.php?key=callerkey&action=get&id={id}"))
        .await
        .text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tasks_upstream_polls_are_counted_across_the_fleet() {
    let Some(redis) = Redis::start() else { return };
    let sim = sim().await;
    let replicas = two_shaped_replicas(&redis, &sim).await;
    let (id, _) = submit(&replicas[0]).await;
    // polls_to_ready(2): the first upstream poll is not ready; callers alternate replicas.
    for round in 0..6 {
        let text = poll_text(&replicas[round % 2], id).await;
        assert_eq!(text, "CAPCHA_NOT_READY", "round {round}");
    }
    assert_eq!(
        upstream_polls(&sim, id),
        1,
        "one upstream poll in the interval, fleet-wide"
    );
    assert!(round_trips(&replicas[1], "poll") >= 1.0);
    for replica in replicas {
        replica.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_final_answer_kept_by_one_replica_is_answered_by_every_other() {
    let Some(redis) = Redis::start() else { return };
    let sim = sim().await;
    let replicas = two_shaped_replicas(&redis, &sim).await;
    let (id, _) = submit(&replicas[0]).await;
    // Two upstream polls: through kr-1, then (the turn key forgotten, as an interval that
    // passed would be) through kr-2, which gets the answer.
    assert_eq!(poll_text(&replicas[0], id).await, "CAPCHA_NOT_READY");
    let _: i64 = redis::cmd("DEL")
        .arg(format!("keyrelay:turn:{id}"))
        .query(&mut redis.conn())
        .expect("DEL");
    let solved = poll_text(&replicas[1], id).await;
    assert!(solved.starts_with("OK|"), "{solved}");
    assert_eq!(upstream_polls(&sim, id), 2);
    // kr-1, which created the task, never saw its answer: the fleet's copy gives it, and
    // the thread kr-1 held for it comes back.
    let app = replicas[0].app.clone();
    let mut conn = redis.conn();
    eventually("kr-2 shared the kept answer", move || {
        redis::cmd("EXISTS")
            .arg(format!("keyrelay:kept:{id}"))
            .query::<i64>(&mut conn)
            .expect("EXISTS")
            == 1
    })
    .await;
    for _ in 0..3 {
        assert_eq!(poll_text(&replicas[0], id).await, solved);
        assert_eq!(poll_text(&replicas[1], id).await, solved);
    }
    assert_eq!(
        upstream_polls(&sim, id),
        2,
        "no replica asked the service again"
    );
    let in_use: u32 = app
        .snapshot()
        .pool
        .keys()
        .iter()
        .map(|k| app.snapshot().pool.load(k).in_use())
        .sum();
    assert_eq!(in_use, 0, "kr-1 gave the task's thread back");
    for replica in replicas {
        replica.stop().await;
    }
}

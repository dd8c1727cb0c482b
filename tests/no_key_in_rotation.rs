//! A bug the fault tests surfaced (now fixed): a submit that found no key in rotation
//! could claim "all 0 attempts failed upstream".

mod common;

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::Duration;

use common::*;
use keyrelay::health::HealthEvent;
use keyrelay::sim::{SimKey, Simulator};

/// keyrelay decides that no key is in rotation and words its answer at two different
/// instants (`proxy::submit`: the candidates, then `exhausted`). A key that came back in
/// between (a cooldown ending, a refresh restoring it) used to turn "no key in rotation"
/// (ERROR_ZERO_BALANCE, on which the SDK waits) into ERROR_SERVER_ERROR "all 0 attempts
/// failed upstream", though nothing was sent. Here a thread takes the lone key out and puts
/// it back as fast as it can while submits run, so many of them straddle a change; every
/// answer must still be a task id or exactly "no key in rotation".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_that_tried_no_key_says_so() {
    const SUBMITS: usize = 300;
    const FLIPS_AT_MOST: usize = 20_000_000;
    const NO_KEY: &str = "keyrelay has no key in rotation (1 configured); retry later";
    // Threads to spare: the tasks are never polled.
    let sim = Simulator::new()
        .key(SimKey {
            threads: 10_000,
            ..SimKey::valid(KEY_A)
        })
        .spawn()
        .await
        .expect("simulator binds 127.0.0.1:0");
    let config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    let h = Harness::start(sim, config).await;
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let flipper = {
        let (app, stop) = (h.app.clone(), stop.clone());
        let key = app.snapshot().pool.keys()[0].clone();
        std::thread::spawn(move || {
            let out = HealthEvent::Cool {
                reason: keyrelay::health::Reason::of_code("MAX_USER_TURN"),
                duration: Duration::from_secs(3600),
            };
            for _ in 0..FLIPS_AT_MOST {
                if stop.load(SeqCst) {
                    break;
                }
                app.record_health(&key, out);
                app.record_health(&key, HealthEvent::Restore);
            }
        })
    };
    let submit =
        format!("/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p&json=1");
    let mut refused = Vec::new();
    for _ in 0..SUBMITS {
        let json = h.get(&submit).await.json();
        if json["status"] != 1 {
            refused.push(json);
        }
    }
    stop.store(true, SeqCst);
    flipper.join().expect("the flipping thread ends");
    let mislabelled: Vec<_> = refused
        .iter()
        .filter(|json| json["error_text"] != NO_KEY)
        .collect();
    assert!(!refused.is_empty(), "no submit ever met the key out");
    assert!(
        mislabelled.is_empty(),
        "{} of {} submits refused for want of a key were answered otherwise, e.g. {}",
        mislabelled.len(),
        refused.len(),
        mislabelled[0]
    );
    h.stop().await;
}

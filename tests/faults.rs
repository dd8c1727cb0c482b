//! Fault injection (issue 4, section 6): a steady workload of JSON and plain callers runs
//! through the proxy while the upstream fails every key (a 5xx storm, answers slower than
//! the timeout, connection resets), and each test checks what the callers got, what became
//! of the keys, and that traffic returned to normal by itself. The upstream down and back
//! is `faults_upstream_down.rs`; the workload and the script every one of them follows are
//! `common/fault_load.rs` and `common/fault_script.rs`.

mod common;

use std::time::Duration;

use common::fault_load::*;
use common::fault_script::*;
use common::*;
use keyrelay::sim::{FaultKind, FaultTarget};

#[tokio::test]
async fn a_5xx_storm_on_every_key_answers_everyone_and_benches_no_key() {
    let h = pool().await;
    let report = run(
        &h,
        async {
            let submits = fault(FaultTarget::Submit, FaultKind::Status(502), None);
            let polls = fault(FaultTarget::Poll, FaultKind::Status(503), None);
            h.sim.add_fault("*", submits);
            h.sim.add_fault("*", polls);
        },
        async { h.sim.clear_faults() },
    )
    .await;
    // A 5xx says the upstream did not take the task, so each submit moved on to the next key
    // until none was left to try.
    assert_fault_answers(
        &report,
        &[Refusal::AllAttemptsFailed, Refusal::NoKeyInRotation],
    );
    let metrics = h.metrics().await;
    // Every key was either tried by a submit under the fault or cooled by 5xx answers.
    for (key, _) in KEYS {
        assert!(
            key_errors(&metrics, key, "http_5xx") >= 1.0,
            "no 5xx counted for key {key}:\n{metrics}"
        );
    }
    assert!(errors(&metrics, "http_5xx") >= report.least_failed_attempts());
    h.stop().await;
}

#[tokio::test]
async fn an_upstream_slower_than_the_timeout_is_answered_in_time() {
    const SLOW: Duration = Duration::from_secs(1);
    let sim = roomy_sim().await;
    let mut config = pool_config(&sim);
    config.timeouts.request = Duration::from_millis(300);
    let h = Harness::start(sim, config).await;
    let report = run(
        &h,
        async {
            let slow = fault(FaultTarget::Any, FaultKind::Delay(SLOW), None);
            h.sim.add_fault("*", slow);
        },
        async { h.sim.clear_faults() },
    )
    .await;
    // A submit that timed out may have reached the upstream and created a task, so keyrelay
    // answers ERROR_SERVER_ERROR and does not send it again; a poll that timed out on every
    // retry answers CAPCHA_NOT_READY.
    assert_fault_answers(
        &report,
        &[Refusal::MayHaveArrived("timeout"), Refusal::NoKeyInRotation],
    );
    for e in report.wholly_faulty().filter(|e| e.kind == Kind::Submit) {
        assert!(
            e.took < SLOW,
            "a submit waited for the slow upstream: {e:?}"
        );
    }
    assert!(
        in_php_received(&h) <= report.submits_tried(),
        "a submit that timed out was sent again"
    );
    let metrics = h.metrics().await;
    assert!(errors(&metrics, "timeout") >= report.least_failed_attempts());
    h.stop().await;
}

#[tokio::test]
async fn connection_resets_are_answered_and_no_submit_is_sent_twice() {
    let h = pool().await;
    let report = run(
        &h,
        async {
            let reset = fault(FaultTarget::Any, FaultKind::Reset, None);
            h.sim.add_fault("*", reset);
        },
        async { h.sim.clear_faults() },
    )
    .await;
    // The upstream read each request before closing: a submit may have created its task.
    assert_fault_answers(
        &report,
        &[
            Refusal::MayHaveArrived("no_answer"),
            Refusal::NoKeyInRotation,
        ],
    );
    assert!(
        in_php_received(&h) <= report.submits_tried(),
        "a submit whose connection was reset was sent again"
    );
    let metrics = h.metrics().await;
    assert!(errors(&metrics, "no_answer") >= report.least_failed_attempts());
    h.stop().await;
}

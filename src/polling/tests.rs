use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::*;
use crate::config::{FirstPoll, Polling};

const S: Duration = Duration::from_secs(1);

/// A submit's provider and method.
const SUBMIT: (crate::provider::Provider, &str) = (crate::provider::Provider::CaptchaAi, "base64");

fn task(n: u64) -> TaskId {
    TaskId::Num(n)
}

fn settings() -> Polling {
    Polling::default()
}

fn solved(text: &str) -> Kept {
    Kept::of(Bytes::from(format!("OK|{text}")), false).expect("a solution is final")
}

#[test]
fn no_upstream_poll_before_the_first_delay_then_one_per_interval() {
    let shaper = PollShaper::default();
    let p = settings();
    let t0 = Instant::now();
    shaper.opened(&p, &task(1), SUBMIT, 5 * S, t0);
    for at in [0, 1, 4] {
        assert_eq!(
            shaper.gate(&p, &task(1), t0 + at * S),
            Gate::NotYet,
            "{at}s"
        );
    }
    assert_eq!(shaper.gate(&p, &task(1), t0 + 5 * S), Gate::Upstream);
    // A script polling every second: the next upstream poll waits a whole interval.
    for at in 6..10 {
        assert_eq!(
            shaper.gate(&p, &task(1), t0 + at * S),
            Gate::NotYet,
            "{at}s"
        );
    }
    assert_eq!(shaper.gate(&p, &task(1), t0 + 10 * S), Gate::Upstream);
    // A caller who polls late is relayed at once, not made to wait.
    assert_eq!(shaper.gate(&p, &task(1), t0 + 60 * S), Gate::Upstream);
}

#[test]
fn a_fixed_first_delay_overrides_the_providers_advice() {
    let shaper = PollShaper::default();
    let t0 = Instant::now();
    let p = Polling {
        first: FirstPoll::After(2 * S),
        ..settings()
    };
    shaper.opened(&p, &task(1), SUBMIT, 15 * S, t0);
    assert_eq!(shaper.gate(&p, &task(1), t0 + S), Gate::NotYet);
    assert_eq!(shaper.gate(&p, &task(1), t0 + 2 * S), Gate::Upstream);
    let p = Polling {
        first: FirstPoll::After(Duration::ZERO),
        ..settings()
    };
    shaper.opened(&p, &task(2), SUBMIT, 15 * S, t0);
    assert_eq!(shaper.gate(&p, &task(2), t0), Gate::Upstream);
    assert_eq!(shaper.gate(&p, &task(2), t0 + S), Gate::NotYet);
}

#[test]
fn of_two_callers_polling_at_once_one_goes_upstream() {
    let shaper = Arc::new(PollShaper::default());
    let p = settings();
    let t0 = Instant::now();
    shaper.opened(&p, &task(1), SUBMIT, Duration::ZERO, t0);
    let gates: Vec<Gate> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| scope.spawn(|| shaper.gate(&p, &task(1), t0 + S)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(gates.iter().filter(|g| **g == Gate::Upstream).count(), 1);
    assert_eq!(gates.iter().filter(|g| **g == Gate::NotYet).count(), 7);
}

#[test]
fn a_task_without_a_turn_goes_upstream_then_is_shaped() {
    // Created before a restart, or by another replica: nothing says when it was submitted.
    let shaper = PollShaper::default();
    let p = settings();
    let t0 = Instant::now();
    assert_eq!(shaper.gate(&p, &task(9), t0), Gate::Upstream);
    assert_eq!(shaper.gate(&p, &task(9), t0 + S), Gate::NotYet);
    assert_eq!(shaper.gate(&p, &task(9), t0 + 5 * S), Gate::Upstream);
}

#[test]
fn a_final_answer_is_kept_and_ends_the_cadence() {
    let shaper = PollShaper::default();
    let p = settings();
    let t0 = Instant::now();
    shaper.opened(&p, &task(1), SUBMIT, Duration::ZERO, t0);
    assert_eq!(shaper.gate(&p, &task(1), t0), Gate::Upstream);
    shaper.finished(&p, &task(1), solved("abc"), t0 + S);
    assert_eq!(shaper.counts(), (0, 1));
    for at in [1, 2, 599] {
        match shaper.gate(&p, &task(1), t0 + S + at * S) {
            Gate::Kept(kept) => assert_eq!(kept.verdict, Verdict::Solved("abc".into())),
            other => panic!("{at}s: {other:?}"),
        }
    }
    // Past keep_answers (10 minutes) the service is asked again.
    assert_eq!(
        shaper.gate(&p, &task(1), t0 + S + p.keep_answers),
        Gate::Upstream
    );
}

#[test]
fn an_interval_of_zero_relays_every_poll_and_keeps_nothing() {
    let shaper = PollShaper::default();
    let p = Polling::off();
    assert!(!p.shapes());
    let t0 = Instant::now();
    shaper.opened(&p, &task(1), SUBMIT, 15 * S, t0);
    for at in [0, 0, 1] {
        assert_eq!(shaper.gate(&p, &task(1), t0 + at * S), Gate::Upstream);
    }
    shaper.finished(&p, &task(1), solved("x"), t0);
    assert_eq!(shaper.gate(&p, &task(1), t0 + S), Gate::Upstream);
    assert_eq!(shaper.counts(), (0, 0));
}

#[test]
fn past_keep_answers_max_the_oldest_answers_go_first() {
    let shaper = PollShaper::default();
    let p = Polling {
        keep_answers_max: 3,
        ..settings()
    };
    let t0 = Instant::now();
    for n in 1..=5 {
        shaper.finished(&p, &task(n), solved(&n.to_string()), t0 + n as u32 * S);
    }
    assert_eq!(shaper.counts().1, 3);
    let now = t0 + 6 * S;
    for n in 1..=2 {
        assert_eq!(shaper.gate(&p, &task(n), now), Gate::Upstream, "{n}");
    }
    for n in 3..=5 {
        assert!(
            matches!(shaper.gate(&p, &task(n), now), Gate::Kept(_)),
            "{n}"
        );
    }
}

#[test]
fn the_sweep_drops_answers_past_their_time_and_forgets_silent_tasks() {
    let shaper = PollShaper::default();
    let p = settings();
    let t0 = Instant::now();
    shaper.finished(&p, &task(1), solved("a"), t0);
    shaper.finished(&p, &task(2), solved("b"), t0 + 5 * 60 * S);
    shaper.opened(&p, &task(3), SUBMIT, S, t0);
    shaper.opened(&p, &task(4), SUBMIT, S, t0 + 5 * 60 * S);
    assert_eq!(shaper.counts(), (2, 2));
    shaper.sweep(&p, 6 * 60 * S, t0 + 10 * 60 * S);
    assert_eq!(shaper.counts(), (1, 1));
    assert!(matches!(
        shaper.gate(&p, &task(2), t0 + 10 * 60 * S),
        Gate::Kept(_)
    ));
}

#[test]
fn a_kept_answer_is_replayed_verbatim_in_its_own_format_and_translated_in_the_other() {
    let json = Kept::of(
        Bytes::from_static(br#"{"status":1,"request":"03AGdBq25","user_agent":"Mozilla"}"#),
        false,
    )
    .unwrap();
    assert!(json.json);
    let same = json.answer(true);
    assert_eq!(same.body, json.body);
    assert_eq!(same.content_type, "application/json");
    assert_eq!(&json.answer(false).body[..], b"OK|03AGdBq25");

    let plain = Kept::of(Bytes::from_static(b"OK|abc"), false).unwrap();
    assert!(!plain.json);
    assert_eq!(&plain.answer(false).body[..], b"OK|abc");
    assert_eq!(
        &plain.answer(true).body[..],
        br#"{"status":1,"request":"abc"}"#
    );

    let failed = Kept::of(Bytes::from_static(b"ERROR_CAPTCHA_UNSOLVABLE"), false).unwrap();
    assert_eq!(
        failed.verdict,
        Verdict::Failed("ERROR_CAPTCHA_UNSOLVABLE".into())
    );
    let as_json: serde_json::Value = serde_json::from_slice(&failed.answer(true).body).unwrap();
    assert_eq!(as_json["status"], 0);
    assert_eq!(as_json["request"], "ERROR_CAPTCHA_UNSOLVABLE");
}

#[test]
fn only_final_answers_are_kept() {
    for body in [
        &b"CAPCHA_NOT_READY"[..],
        br#"{"status":0,"request":"CAPCHA_NOT_READY"}"#,
        b"<html>502</html>",
        b"",
        b"12.5",
    ] {
        assert_eq!(
            Kept::of(Bytes::copy_from_slice(body), false),
            None,
            "{}",
            String::from_utf8_lossy(body)
        );
    }
}

#[test]
fn an_ids_item_is_kept_as_the_answer_of_its_task() {
    let solved = Kept::of_item("abc");
    assert_eq!(solved.verdict, Verdict::Solved("abc".into()));
    assert_eq!(&solved.answer(false).body[..], b"OK|abc");
    assert_eq!(solved.item(), "abc");
    let failed = Kept::of_item("ERROR_CAPTCHA_UNSOLVABLE");
    assert_eq!(
        failed.verdict,
        Verdict::Failed("ERROR_CAPTCHA_UNSOLVABLE".into())
    );
    assert_eq!(&failed.answer(false).body[..], b"ERROR_CAPTCHA_UNSOLVABLE");
    assert_eq!(failed.item(), "ERROR_CAPTCHA_UNSOLVABLE");
}

#[test]
fn an_orphan_is_a_task_of_ours_nobody_polled_for_orphan_after_whose_turn_has_come() {
    let shaper = PollShaper::default();
    let p = settings();
    let t0 = Instant::now();
    shaper.opened(&p, &task(1), SUBMIT, 5 * S, t0);
    shaper.opened(&p, &task(2), SUBMIT, 5 * S, t0 + 10 * S);
    // Polled here but made elsewhere (another replica, or before a restart): never ours.
    assert_eq!(shaper.gate(&p, &task(3), t0), Gate::Upstream);
    assert!(shaper.orphans_due(&p, t0 + 29 * S, 10).is_empty());
    assert_eq!(shaper.orphans_due(&p, t0 + 30 * S, 10), vec![task(1)]);
    // A caller's poll makes it no orphan for another orphan_after.
    shaper.gate(&p, &task(1), t0 + 31 * S);
    assert!(shaper.orphans_due(&p, t0 + 39 * S, 10).is_empty());
    // The longest waiting for its turn first.
    assert_eq!(
        shaper.orphans_due(&p, t0 + 61 * S, 10),
        vec![task(2), task(1)]
    );
    // Polled by keyrelay: its next turn is an interval away, and it stays an orphan.
    shaper.orphan_polled(&p, &task(1), t0 + 61 * S);
    assert_eq!(shaper.orphans_due(&p, t0 + 62 * S, 10), vec![task(2)]);
    assert_eq!(
        shaper.orphans_due(&p, t0 + 66 * S, 10),
        vec![task(2), task(1)]
    );
    // The limit takes the longest waiting first.
    assert_eq!(shaper.orphans_due(&p, t0 + 66 * S, 1), vec![task(2)]);
    assert!(shaper.orphans_due(&p, t0 + 66 * S, 0).is_empty());
    // A final answer ends it.
    shaper.finished(&p, &task(2), solved("x"), t0 + 66 * S);
    assert_eq!(shaper.orphans_due(&p, t0 + 99 * S, 10), vec![task(1)]);
}

#[test]
fn with_shaping_off_a_polled_task_is_no_orphan_and_an_orphan_is_polled_every_5s() {
    let shaper = PollShaper::default();
    let p = Polling::off();
    let t0 = Instant::now();
    shaper.opened(&p, &task(1), SUBMIT, 15 * S, t0);
    shaper.gate(&p, &task(1), t0 + 20 * S);
    assert!(shaper.orphans_due(&p, t0 + 49 * S, 10).is_empty());
    assert_eq!(shaper.orphans_due(&p, t0 + 50 * S, 10), vec![task(1)]);
    shaper.orphan_polled(&p, &task(1), t0 + 50 * S);
    assert!(shaper.orphans_due(&p, t0 + 54 * S, 10).is_empty());
    assert_eq!(shaper.orphans_due(&p, t0 + 55 * S, 10), vec![task(1)]);
}

#[test]
fn the_pace_averages_its_rate_and_never_sends_twice_it_in_a_second() {
    let t0 = Instant::now();
    let mut pace = Pace::new(t0);
    assert_eq!(pace.take(20.0, t0), 0, "a start is no burst");
    // A second at 20 a second: 20.
    assert_eq!(pace.take(20.0, t0 + S), 20);
    // Unused polls wait in the bucket, which holds one second's worth.
    pace.give_back(20, 20.0);
    assert_eq!(pace.take(20.0, t0 + 2 * S), 20, "the bucket is full");
    // A long quiet spell fills it no further.
    assert_eq!(pace.take(20.0, t0 + 60 * S), 20);
    // Sent each quarter second over ten seconds: 50 a second at most, 200 on average.
    let mut pace = Pace::new(t0);
    let mut sent = Vec::new();
    for quarter in 1..=40u32 {
        sent.push(pace.take(20.0, t0 + quarter * S / 4));
    }
    let total: usize = sent.iter().sum();
    assert!((195..=200).contains(&total), "{total}");
    for second in sent.chunks(4) {
        assert!(second.iter().sum::<usize>() <= 40, "{sent:?}");
    }
    // Below one a second: one poll every other second.
    let mut pace = Pace::new(t0);
    let slow: usize = (1..=10u32).map(|s| pace.take(0.5, t0 + s * S)).sum();
    assert_eq!(slow, 5);
}

#[test]
fn a_task_of_ours_says_where_and_when_it_began_when_it_ends() {
    let shaper = PollShaper::default();
    let p = settings();
    let t0 = Instant::now();
    shaper.opened(
        &p,
        &task(1),
        (crate::provider::Provider::TwoCaptcha, " UserReCaptcha"),
        S,
        t0,
    );
    shaper.opened(&p, &task(2), SUBMIT, S, t0);
    let origin = shaper
        .finished(&p, &task(1), solved("x"), t0 + 20 * S)
        .expect("ours");
    assert_eq!(origin.submitted, t0);
    assert_eq!(origin.provider, crate::provider::Provider::TwoCaptcha);
    assert_eq!(&*origin.method, "userrecaptcha");
    assert_eq!(
        shaper.forget(&task(2)).map(|o| o.method),
        Some("base64".into())
    );
    // Polled here, made elsewhere: no origin.
    shaper.gate(&p, &task(3), t0);
    assert_eq!(shaper.finished(&p, &task(3), solved("y"), t0), None);
}

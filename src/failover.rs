//! Failover policy, pure: what an upstream outcome does to the key that produced it, whether
//! the task moves on (to another key, or off a host that refused the connection), how long to
//! back off, and which failure the caller finally sees.
//! `captcha::classify` says what an answer means; this module says what keyrelay does.

use std::time::Duration;

use rand::Rng;

use crate::captcha::{Outcome, ServiceCode, ThreadsInfo};
use crate::config::Failover;
use crate::health::{HealthEvent, Reason, StateKind};

/// How long a key that answered `ERROR_ZERO_BALANCE` stays out while its `threadsinfo` is
/// read to tell "all threads busy" from "no plan". The check replaces this state when it
/// finishes; the bound only matters if the check itself never completes.
pub const ZERO_BALANCE_CHECK: Duration = Duration::from_secs(60);

/// What happens to the task after an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Give this answer to the caller.
    Answer,
    /// Try the next key now.
    Failover,
    /// Try again after a backoff: on the next key for a submit, on the same key for a poll.
    Backoff,
    /// Try a key behind another upstream now: this attempt's host:port refused the
    /// connection ([`Reach::Refused`]), and would refuse every key behind it. No backoff:
    /// waiting makes another host no likelier to answer.
    OtherUpstream,
}

/// Whether an attempt reached its upstream's host:port. A connection refused (or never made:
/// unreachable, a failed TLS handshake) before anything was written is about the host, not
/// the key that was to be sent, so it tells the policy something a 5xx or a timeout does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Connected: the upstream answered, or failed once the request may have been written.
    Connected,
    /// Refused or unreachable before the request was written.
    Refused,
}

/// The decision for one attempt.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    pub health: Option<HealthEvent>,
    pub next: Next,
    /// A read keyrelay makes itself, in the background, to settle what the answer means.
    pub check: Option<Check>,
}

/// A request keyrelay makes with a key, itself, before it acts on a verdict that came in
/// answer to a caller's request. The caller chose that request's bytes; keyrelay chooses
/// these, so only they may take a key out of rotation for long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// After `ERROR_ZERO_BALANCE`: a read of keyrelay's own settles what it meant, as the
    /// key's provider uses the code (`captcha::ZeroBalance`): `threadsinfo` tells "all
    /// threads busy" from "no plan" ([`settle_zero_balance`]), or `getbalance` tells
    /// whether the money ran out ([`settle_no_funds`]).
    ZeroBalance,
    /// After a key-unusable verdict (`ERROR_WRONG_USER_KEY`, `ERROR_KEY_DOES_NOT_EXIST`,
    /// `ERROR_IP_NOT_ALLOWED`, …): `getbalance` confirms it before the key is benched.
    Unusable { reason: Reason },
}

/// How a [`Check::Unusable`] ended, for `keyrelay_key_checks_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckResult {
    /// keyrelay's own read was rejected too: the key is benched.
    Confirmed,
    /// keyrelay's own read was answered: the verdict was about the caller's request.
    Refuted,
    /// keyrelay's own read got no answer: nothing changes.
    Inconclusive,
    /// A check of the key began moments ago: not asked again.
    Skipped,
}

impl CheckResult {
    pub const ALL: [CheckResult; 4] = [
        CheckResult::Confirmed,
        CheckResult::Refuted,
        CheckResult::Inconclusive,
        CheckResult::Skipped,
    ];

    pub fn label(self) -> &'static str {
        match self {
            CheckResult::Confirmed => "confirmed",
            CheckResult::Refuted => "refuted",
            CheckResult::Inconclusive => "inconclusive",
            CheckResult::Skipped => "skipped",
        }
    }
}

/// What the pool allows a transient failure to do to its key right now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ejection {
    /// Whether a run of transient failures may cool this key: not for a lone key, and not
    /// when the share of keys already cooled for transient faults is at its limit.
    pub allowed: bool,
    /// Cooldown jitter factor, near 1.
    pub jitter: f64,
}

impl Ejection {
    /// For outcomes that are not transient, which never consult it.
    pub const IRRELEVANT: Ejection = Ejection {
        allowed: false,
        jitter: 1.0,
    };

    /// Decides for a pool of `pool_size` keys of which `ejected` are cooling for transient
    /// faults now. Jitter is drawn from `rng` in [0.8, 1.2].
    pub fn decide(
        policy: &Failover,
        ejected: usize,
        pool_size: usize,
        rng: &mut impl Rng,
    ) -> Ejection {
        let share_after = (ejected + 1) as f64 / pool_size.max(1) as f64;
        Ejection {
            allowed: pool_size > 1 && share_after <= policy.max_transient_ejection,
            jitter: rng.random_range(0.8..=1.2),
        }
    }
}

/// Decides what a submit (`in.php`, `solve.php`) outcome means. `reason` is why the answer
/// failed (the upstream's error code, or the HTTP failure), where it was an answer; `reach`
/// says whether a failure got as far as a connection.
pub fn on_submit(
    outcome: Outcome,
    reason: Option<Reason>,
    reach: Reach,
    policy: &Failover,
    ejection: Ejection,
) -> Decision {
    // Only a failed answer is classified unusable, unfunded or full, and every failed answer
    // has a reason; `OtherCode` is for a table that should ever say so of another.
    let code = reason.unwrap_or(Reason::OtherCode);
    let (health, next) = match outcome {
        Outcome::Success => (Some(HealthEvent::Success), Next::Answer),
        // The caller's request is at fault: the same request fails on any key.
        Outcome::CallerError => (Some(HealthEvent::Success), Next::Answer),
        // The egress IP is banned: another key would only deepen the ban, and the key itself
        // did nothing wrong.
        Outcome::IpBanned => (None, Next::Answer),
        // Not benched here: a caller's request can fail over, but only keyrelay's own
        // evidence (the `Check::Unusable` read) can bench a key.
        Outcome::KeyUnusable => (None, Next::Failover),
        Outcome::ZeroBalance => (
            Some(HealthEvent::Cool {
                reason: code,
                duration: ZERO_BALANCE_CHECK,
            }),
            Next::Failover,
        ),
        Outcome::KeyFull => (
            Some(HealthEvent::Cool {
                reason: code,
                duration: policy.busy_cooldown,
            }),
            Next::Failover,
        ),
        // Still counted against the key as any transient failure is (and against its
        // provider, by the caller): in a pool of one provider, cooling the keys behind a
        // host that keeps refusing is what spares later submits the wasted attempt (within
        // the ejection cap).
        Outcome::Transient => (Some(transient(policy, ejection)), after_transient(reach)),
    };
    let check = match outcome {
        Outcome::ZeroBalance => Some(Check::ZeroBalance),
        Outcome::KeyUnusable => Some(Check::Unusable { reason: code }),
        _ => None,
    };
    Decision {
        health,
        next,
        check,
    }
}

/// Where a submit goes after a transient failure: a host that refused is left at once for
/// another; any other failure waits a backoff, since the same host may answer in a moment.
fn after_transient(reach: Reach) -> Next {
    match reach {
        Reach::Refused => Next::OtherUpstream,
        Reach::Connected => Next::Backoff,
    }
}

/// Decides what a poll or report outcome means. The task belongs to its key, so there is no
/// failover: transient failures, a refused connection among them, are retried on the same
/// key, everything else is answered.
pub fn on_poll(
    outcome: Outcome,
    reason: Option<Reason>,
    reach: Reach,
    policy: &Failover,
    ejection: Ejection,
) -> Decision {
    let decision = on_submit(outcome, reason, reach, policy, ejection);
    let next = match decision.next {
        // Another upstream's key would not know the task: its own host is the only one to ask.
        Next::Backoff | Next::OtherUpstream => Next::Backoff,
        Next::Answer | Next::Failover => Next::Answer,
    };
    // "No free thread" is a submit answer; on a poll it says nothing reliable about the key,
    // and without the threadsinfo check a cooldown would only keep a healthy key out.
    let health = match outcome {
        Outcome::ZeroBalance => None,
        _ => decision.health,
    };
    // A poll never answers ZERO_BALANCE for a missing thread; nothing to check there. A
    // key-unusable verdict is checked as after a submit.
    let check = decision
        .check
        .filter(|check| matches!(check, Check::Unusable { .. }));
    Decision {
        health,
        next,
        check,
    }
}

/// The health event for a transport failure or server error. When the pool allows no
/// ejection, the failure is still counted but can never cool the key.
pub fn transient(policy: &Failover, ejection: Ejection) -> HealthEvent {
    HealthEvent::Transient {
        threshold: if ejection.allowed {
            policy.transient_failures
        } else {
            u32::MAX
        },
        cooldown: policy.transient_cooldown,
        max_cooldown: policy.transient_cooldown_max,
        jitter: ejection.jitter,
    }
}

/// Delay before retry number `retry` (1 for the first retry): exponential from
/// `backoff_base`, capped at `backoff_max`, with full jitter so that many callers failing
/// together do not retry together.
pub fn backoff(retry: u32, policy: &Failover, rng: &mut impl Rng) -> Duration {
    let factor = 2u32.saturating_pow(retry.saturating_sub(1));
    let ceiling = policy
        .backoff_base
        .saturating_mul(factor)
        .min(policy.backoff_max);
    if ceiling.is_zero() {
        return ceiling;
    }
    ceiling.mul_f64(rng.random::<f64>())
}

/// How much a failed attempt says about the pool, to choose the caller's answer when every
/// attempt failed: the higher, the more useful to the caller.
pub fn meaning_rank(outcome: Outcome) -> u8 {
    match outcome {
        // "Busy, retry later" is the most actionable thing a caller can hear.
        Outcome::KeyFull | Outcome::ZeroBalance => 3,
        Outcome::Transient => 2,
        Outcome::KeyUnusable => 1,
        Outcome::Success | Outcome::CallerError | Outcome::IpBanned => 0,
    }
}

/// How long all upstream traffic pauses after an answer with `outcome`. An IP ban is about
/// keyrelay's egress IP, not a key: every request would only deepen it.
pub fn pause_after(outcome: Outcome, policy: &Failover) -> Option<Duration> {
    (outcome == Outcome::IpBanned).then_some(policy.ip_ban_pause)
}

/// Why one of keyrelay's own account reads (`getbalance`, `threadsinfo`) gave no figure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadError {
    /// The service rejected the key itself (`ERROR_KEY_DOES_NOT_EXIST` and kin).
    KeyRejected(Reason),
    /// No usable answer: network, server error, or an answer without the figure.
    Unavailable,
}

/// What a background refresh's reads do to a key in `state`. A rejected key is benched with
/// the service's code. A benched key comes back once it proves usable: a balance above
/// `min_balance`, and threads if the service reports them. A read that failed proves
/// nothing either way: a failure is never a zero balance.
pub fn on_refresh(
    state: StateKind,
    balance: &Result<f64, ReadError>,
    threads: Option<ThreadsInfo>,
    policy: &Failover,
) -> Option<HealthEvent> {
    match balance {
        Err(ReadError::KeyRejected(code)) => Some(HealthEvent::Bench { reason: *code }),
        Err(ReadError::Unavailable) => None,
        Ok(balance) => {
            let usable = *balance > policy.min_balance && threads.is_none_or(|t| t.threads > 0);
            (state == StateKind::Benched && usable).then_some(HealthEvent::Restore)
        }
    }
}

/// What keyrelay's own `getbalance` says about a key-unusable verdict a caller's request
/// drew: rejected too, the key is benched with the service's code; answered, the verdict was
/// about the caller's request and the key stays; no answer settles nothing.
pub fn on_unusable_check(balance: &Result<f64, ReadError>) -> (Option<HealthEvent>, CheckResult) {
    match balance {
        Err(ReadError::KeyRejected(code)) => (
            Some(HealthEvent::Bench { reason: *code }),
            CheckResult::Confirmed,
        ),
        Ok(_) => (None, CheckResult::Refuted),
        Err(ReadError::Unavailable) => (None, CheckResult::Inconclusive),
    }
}

/// Whether `threadsinfo` shows every thread of a key with a plan at work: the key is full,
/// not without a plan.
pub fn all_threads_working(info: &ThreadsInfo) -> bool {
    info.threads > 0 && info.working_threads >= info.threads
}

/// Settles `ERROR_ZERO_BALANCE`, which means either "no plan or balance" or "no free thread
/// right now", with the key's `threadsinfo`: all threads working means full (a short
/// cooldown); free threads or none at all mean no plan (benched until a refresh sees the key
/// usable). No answer settles nothing: the provisional cooldown runs out by itself.
pub fn settle_zero_balance(
    threads: &Result<ThreadsInfo, ReadError>,
    policy: &Failover,
) -> Option<HealthEvent> {
    const REASON: Reason = Reason::Service(ServiceCode::ZERO_BALANCE);
    match threads {
        Ok(info) if all_threads_working(info) => Some(HealthEvent::Cool {
            reason: REASON,
            duration: policy.busy_cooldown,
        }),
        Ok(_) => Some(HealthEvent::Bench { reason: REASON }),
        Err(ReadError::KeyRejected(code)) => Some(HealthEvent::Bench { reason: *code }),
        Err(ReadError::Unavailable) => None,
    }
}

/// Settles `ERROR_ZERO_BALANCE` at a provider where it means "no money" with the key's
/// `getbalance`: at or below `min_balance`, the money ran out and the key is benched until a
/// refresh reads more (`on_refresh`); above it, the key was topped up meanwhile and the
/// provisional cooldown runs out by itself. A rejected key is benched with the service's
/// code; no answer settles nothing.
pub fn settle_no_funds(balance: &Result<f64, ReadError>, policy: &Failover) -> Option<HealthEvent> {
    const REASON: Reason = Reason::Service(ServiceCode::ZERO_BALANCE);
    match balance {
        Ok(balance) if *balance <= policy.min_balance => {
            Some(HealthEvent::Bench { reason: REASON })
        }
        Ok(_) | Err(ReadError::Unavailable) => None,
        Err(ReadError::KeyRejected(code)) => Some(HealthEvent::Bench { reason: *code }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn reason(code: &str) -> Reason {
        Reason::of_code(code)
    }

    fn policy() -> Failover {
        Failover::default()
    }

    const EJECT: Ejection = Ejection {
        allowed: true,
        jitter: 1.0,
    };

    #[test]
    fn each_class_has_its_consequence() {
        let p = policy();
        let d = on_submit(
            Outcome::KeyUnusable,
            Some(reason("ERROR_KEY_DOES_NOT_EXIST")),
            Reach::Connected,
            &p,
            EJECT,
        );
        assert_eq!(d.health, None, "a caller's request never benches a key");
        assert_eq!(
            d.check,
            Some(Check::Unusable {
                reason: reason("ERROR_KEY_DOES_NOT_EXIST")
            })
        );
        assert_eq!(d.next, Next::Failover);

        let d = on_submit(
            Outcome::KeyFull,
            Some(reason("MAX_USER_TURN")),
            Reach::Connected,
            &p,
            EJECT,
        );
        assert_eq!(
            d.health,
            Some(HealthEvent::Cool {
                reason: reason("MAX_USER_TURN"),
                duration: p.busy_cooldown
            })
        );
        assert_eq!(d.next, Next::Failover);

        let d = on_submit(
            Outcome::ZeroBalance,
            Some(reason("ERROR_ZERO_BALANCE")),
            Reach::Connected,
            &p,
            EJECT,
        );
        assert_eq!(d.check, Some(Check::ZeroBalance));
        assert_eq!(d.next, Next::Failover);

        let d = on_submit(
            Outcome::CallerError,
            Some(Reason::OtherCode),
            Reach::Connected,
            &p,
            EJECT,
        );
        assert_eq!(
            (d.next, d.health),
            (Next::Answer, Some(HealthEvent::Success))
        );

        let d = on_submit(
            Outcome::IpBanned,
            Some(reason("IP_BANNED")),
            Reach::Connected,
            &p,
            EJECT,
        );
        assert_eq!((d.next, d.health), (Next::Answer, None));

        let d = on_submit(
            Outcome::Transient,
            Some(reason("ERROR_SERVER_ERROR")),
            Reach::Connected,
            &p,
            EJECT,
        );
        assert_eq!(d.next, Next::Backoff);
        assert!(matches!(d.health, Some(HealthEvent::Transient { .. })));
    }

    #[test]
    fn polls_never_fail_over() {
        let p = policy();
        for outcome in [
            Outcome::KeyUnusable,
            Outcome::KeyFull,
            Outcome::ZeroBalance,
            Outcome::CallerError,
        ] {
            assert_eq!(
                on_poll(
                    outcome,
                    Some(Reason::OtherCode),
                    Reach::Connected,
                    &p,
                    EJECT
                )
                .next,
                Next::Answer
            );
        }
        assert_eq!(
            on_poll(
                Outcome::Transient,
                Some(Reason::OtherCode),
                Reach::Connected,
                &p,
                EJECT
            )
            .next,
            Next::Backoff
        );
        let zero = on_poll(
            Outcome::ZeroBalance,
            Some(reason("ERROR_ZERO_BALANCE")),
            Reach::Connected,
            &p,
            EJECT,
        );
        assert_eq!(zero.check, None);
        assert_eq!(zero.health, None);
        let dead = on_poll(
            Outcome::KeyUnusable,
            Some(reason("ERROR_WRONG_USER_KEY")),
            Reach::Connected,
            &p,
            EJECT,
        );
        assert_eq!(dead.health, None, "a caller's poll never benches a key");
        assert_eq!(
            dead.check,
            Some(Check::Unusable {
                reason: reason("ERROR_WRONG_USER_KEY")
            })
        );
    }

    #[test]
    fn a_refused_connection_moves_a_submit_to_another_upstream_at_once() {
        let p = policy();
        let refused = on_submit(Outcome::Transient, None, Reach::Refused, &p, EJECT);
        assert_eq!(
            refused.next,
            Next::OtherUpstream,
            "no backoff, no key behind it"
        );
        let reached = on_submit(Outcome::Transient, None, Reach::Connected, &p, EJECT);
        assert_eq!(reached.next, Next::Backoff);
        // What it does to the key is what any transient failure does: only where the task
        // goes next differs.
        assert_eq!(refused.health, reached.health);
        assert_eq!(refused.check, None);
        let lone = Ejection {
            allowed: false,
            jitter: 1.0,
        };
        let refused = on_submit(Outcome::Transient, None, Reach::Refused, &p, lone);
        assert_eq!(refused.health, Some(transient(&p, lone)));
    }

    #[test]
    fn a_refused_poll_is_retried_on_its_own_key() {
        let p = policy();
        let d = on_poll(Outcome::Transient, None, Reach::Refused, &p, EJECT);
        assert_eq!(
            d.next,
            Next::Backoff,
            "the task's key is the only one to ask"
        );
        assert_eq!(
            d.health,
            on_poll(Outcome::Transient, None, Reach::Connected, &p, EJECT).health
        );
    }

    #[test]
    fn reach_matters_only_for_a_failure() {
        let p = policy();
        for outcome in [
            Outcome::Success,
            Outcome::CallerError,
            Outcome::IpBanned,
            Outcome::KeyUnusable,
            Outcome::ZeroBalance,
            Outcome::KeyFull,
        ] {
            for decide in [on_submit, on_poll] {
                assert_eq!(
                    decide(outcome, Some(Reason::OtherCode), Reach::Refused, &p, EJECT),
                    decide(
                        outcome,
                        Some(Reason::OtherCode),
                        Reach::Connected,
                        &p,
                        EJECT
                    ),
                    "{outcome:?}"
                );
            }
        }
    }

    #[test]
    fn no_outcome_of_a_callers_request_benches_a_key() {
        let p = policy();
        for outcome in [
            Outcome::Success,
            Outcome::CallerError,
            Outcome::IpBanned,
            Outcome::KeyUnusable,
            Outcome::ZeroBalance,
            Outcome::KeyFull,
            Outcome::Transient,
        ] {
            for (code, reach) in [
                (Some(reason("ERROR_WRONG_USER_KEY")), Reach::Connected),
                (Some(reason("ERROR_KEY_DOES_NOT_EXIST")), Reach::Connected),
                (Some(Reason::OtherCode), Reach::Connected),
                (None, Reach::Refused),
            ] {
                for decision in [
                    on_submit(outcome, code, reach, &p, EJECT),
                    on_poll(outcome, code, reach, &p, EJECT),
                ] {
                    assert!(
                        !matches!(decision.health, Some(HealthEvent::Bench { .. })),
                        "{outcome:?} {code:?} benched a key"
                    );
                }
            }
        }
    }

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let mut p = policy();
        p.backoff_base = Duration::from_millis(100);
        p.backoff_max = Duration::from_millis(1000);
        let mut rng = StdRng::seed_from_u64(9);
        for retry in 1..=10 {
            let ceiling = Duration::from_millis(100 * 2u64.pow(retry - 1)).min(p.backoff_max);
            let samples: Vec<Duration> = (0..200).map(|_| backoff(retry, &p, &mut rng)).collect();
            assert!(samples.iter().all(|d| *d <= ceiling), "retry {retry}");
            // Jitter: not all the same.
            assert!(samples.iter().any(|d| *d != samples[0]));
        }
        p.backoff_base = Duration::ZERO;
        assert_eq!(backoff(3, &p, &mut rng), Duration::ZERO);
    }

    #[test]
    fn busy_is_more_meaningful_than_transient_than_dead() {
        assert!(meaning_rank(Outcome::KeyFull) > meaning_rank(Outcome::Transient));
        assert!(meaning_rank(Outcome::Transient) > meaning_rank(Outcome::KeyUnusable));
    }

    #[test]
    fn reasons_are_a_closed_set() {
        assert_eq!(
            Reason::of_code("ERROR_ZERO_BALANCE").label(),
            "ERROR_ZERO_BALANCE"
        );
        assert_eq!(Reason::of_code("ERROR_SOMETHING_NEW").label(), "other");
    }

    #[test]
    fn transient_ejection_spares_a_lone_key_and_respects_the_share() {
        let p = policy(); // max_transient_ejection 0.5
        let mut rng = StdRng::seed_from_u64(1);
        assert!(!Ejection::decide(&p, 0, 1, &mut rng).allowed, "a lone key");
        assert!(Ejection::decide(&p, 0, 2, &mut rng).allowed, "1 of 2");
        assert!(!Ejection::decide(&p, 1, 2, &mut rng).allowed, "2 of 2");
        assert!(Ejection::decide(&p, 1, 4, &mut rng).allowed, "2 of 4");
        assert!(!Ejection::decide(&p, 2, 4, &mut rng).allowed, "3 of 4");
        for _ in 0..100 {
            let j = Ejection::decide(&p, 0, 4, &mut rng).jitter;
            assert!((0.8..=1.2).contains(&j), "{j}");
        }
        let no = Ejection {
            allowed: false,
            jitter: 1.0,
        };
        assert!(matches!(
            transient(&p, no),
            HealthEvent::Transient {
                threshold: u32::MAX,
                ..
            }
        ));
    }

    const ALL_OUTCOMES: [Outcome; 7] = [
        Outcome::Success,
        Outcome::KeyUnusable,
        Outcome::ZeroBalance,
        Outcome::KeyFull,
        Outcome::IpBanned,
        Outcome::Transient,
        Outcome::CallerError,
    ];

    #[test]
    fn only_an_ip_ban_pauses_upstream_traffic() {
        let p = policy();
        for outcome in ALL_OUTCOMES {
            let want = (outcome == Outcome::IpBanned).then_some(p.ip_ban_pause);
            assert_eq!(pause_after(outcome, &p), want, "{outcome:?}");
        }
    }

    fn threads(threads: u32, working_threads: u32) -> ThreadsInfo {
        ThreadsInfo {
            threads,
            working_threads,
        }
    }

    #[test]
    fn a_refresh_benches_a_rejected_key_and_restores_a_usable_benched_one() {
        let p = Failover {
            min_balance: 0.5,
            ..policy()
        };
        let rejected = Err(ReadError::KeyRejected(reason("ERROR_KEY_DOES_NOT_EXIST")));
        for state in StateKind::ALL {
            assert_eq!(
                on_refresh(*state, &rejected, None, &p),
                Some(HealthEvent::Bench {
                    reason: reason("ERROR_KEY_DOES_NOT_EXIST")
                })
            );
            // A failed read is no evidence either way.
            assert_eq!(
                on_refresh(*state, &Err(ReadError::Unavailable), None, &p),
                None
            );
        }
        let benched = StateKind::Benched;
        assert_eq!(
            on_refresh(benched, &Ok(3.0), None, &p),
            Some(HealthEvent::Restore)
        );
        assert_eq!(
            on_refresh(benched, &Ok(3.0), Some(threads(5, 5)), &p),
            Some(HealthEvent::Restore)
        );
        // Not usable: a balance at or under the floor, or a plan without threads.
        assert_eq!(on_refresh(benched, &Ok(0.5), None, &p), None);
        assert_eq!(on_refresh(benched, &Ok(3.0), Some(threads(0, 0)), &p), None);
        // Only a benched key is restored: cooling keys come back by themselves.
        for state in [StateKind::Active, StateKind::Cooling] {
            assert_eq!(on_refresh(state, &Ok(3.0), None, &p), None);
        }
    }

    #[test]
    fn only_a_rejected_own_read_confirms_a_key_unusable_verdict() {
        let code = reason("ERROR_WRONG_USER_KEY");
        assert_eq!(
            on_unusable_check(&Err(ReadError::KeyRejected(code))),
            (
                Some(HealthEvent::Bench { reason: code }),
                CheckResult::Confirmed
            )
        );
        assert_eq!(on_unusable_check(&Ok(0.0)), (None, CheckResult::Refuted));
        assert_eq!(
            on_unusable_check(&Err(ReadError::Unavailable)),
            (None, CheckResult::Inconclusive)
        );
    }

    #[test]
    fn zero_balance_is_settled_by_whether_every_thread_works() {
        let p = policy();
        let cool = Some(HealthEvent::Cool {
            reason: reason("ERROR_ZERO_BALANCE"),
            duration: p.busy_cooldown,
        });
        let bench = Some(HealthEvent::Bench {
            reason: reason("ERROR_ZERO_BALANCE"),
        });
        assert_eq!(settle_zero_balance(&Ok(threads(5, 5)), &p), cool);
        assert_eq!(settle_zero_balance(&Ok(threads(5, 7)), &p), cool);
        assert_eq!(settle_zero_balance(&Ok(threads(5, 4)), &p), bench);
        assert_eq!(settle_zero_balance(&Ok(threads(0, 0)), &p), bench);
        assert_eq!(
            settle_zero_balance(
                &Err(ReadError::KeyRejected(reason("ERROR_KEY_DOES_NOT_EXIST"))),
                &p
            ),
            Some(HealthEvent::Bench {
                reason: reason("ERROR_KEY_DOES_NOT_EXIST")
            })
        );
        assert_eq!(settle_zero_balance(&Err(ReadError::Unavailable), &p), None);
    }

    #[test]
    fn no_funds_is_settled_by_the_balance_against_min_balance() {
        let p = policy();
        let bench = Some(HealthEvent::Bench {
            reason: reason("ERROR_ZERO_BALANCE"),
        });
        assert_eq!(settle_no_funds(&Ok(0.0), &p), bench);
        assert_eq!(settle_no_funds(&Ok(p.min_balance), &p), bench);
        assert_eq!(settle_no_funds(&Ok(-1.0), &p), bench);
        assert_eq!(settle_no_funds(&Ok(p.min_balance + 0.01), &p), None);
        assert_eq!(settle_no_funds(&Ok(12.5), &p), None);
        assert_eq!(
            settle_no_funds(
                &Err(ReadError::KeyRejected(reason("ERROR_WRONG_USER_KEY"))),
                &p
            ),
            Some(HealthEvent::Bench {
                reason: reason("ERROR_WRONG_USER_KEY")
            })
        );
        assert_eq!(settle_no_funds(&Err(ReadError::Unavailable), &p), None);
    }
}

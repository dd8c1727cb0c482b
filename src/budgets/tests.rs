use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::config::{Budget, BudgetLimit};

const MIN: UnixMs = 60_000;
const DAY: Duration = Duration::from_secs(86_400);
const T0: UnixMs = 1_800_000_000_000;

fn spend(amount: f64) -> Budget {
    Budget {
        limit: BudgetLimit::Spend(amount),
        period: DAY,
        soft: 0.8,
    }
}

fn alice() -> Arc<str> {
    Arc::from("alice")
}

#[test]
fn a_submit_reserves_its_price_and_its_final_answer_settles_it() {
    let budgets = Budgets::default();
    budgets.reserve(TaskId::Num(1), &alice(), 0.003, T0);
    assert_eq!(budgets.usage("alice", DAY, T0).spend, 0.003);
    budgets.settle(&TaskId::Num(1), Settle::AsReserved, T0 + MIN);
    let usage = budgets.usage("alice", DAY, T0 + MIN);
    assert!((usage.spend - 0.003).abs() < 1e-12, "{usage:?}");
    // Settling twice changes nothing.
    budgets.settle(&TaskId::Num(1), Settle::Free, T0 + 2 * MIN);
    assert!((budgets.usage("alice", DAY, T0 + 2 * MIN).spend - 0.003).abs() < 1e-12);
    assert_eq!(budgets.usage("bob", DAY, T0).spend, 0.0);
}

#[test]
fn a_reported_cost_replaces_the_reservation_and_an_unsolved_task_costs_nothing() {
    let budgets = Budgets::default();
    budgets.reserve(TaskId::Num(1), &alice(), 0.003, T0);
    budgets.reserve(TaskId::Num(2), &alice(), 0.003, T0);
    budgets.settle(&TaskId::Num(1), Settle::Cost(0.001), T0 + MIN);
    budgets.settle(&TaskId::Num(2), Settle::Free, T0 + MIN);
    let usage = budgets.usage("alice", DAY, T0 + MIN);
    assert!((usage.spend - 0.001).abs() < 1e-12, "{usage:?}");
    // A nonsense cost keeps the reservation.
    budgets.reserve(TaskId::Num(3), &alice(), 0.002, T0);
    budgets.settle(&TaskId::Num(3), Settle::Cost(f64::NAN), T0 + MIN);
    let usage = budgets.usage("alice", DAY, T0 + MIN);
    assert!((usage.spend - 0.003).abs() < 1e-12, "{usage:?}");
}

#[test]
fn thread_hours_count_the_time_each_task_held_a_thread_open_tasks_included() {
    let budgets = Budgets::default();
    budgets.reserve(TaskId::Num(1), &alice(), 0.0, T0);
    budgets.reserve(TaskId::Num(2), &alice(), 0.0, T0);
    // Both open for 30 minutes: an hour between them.
    let usage = budgets.usage("alice", DAY, T0 + 30 * MIN);
    assert!((usage.thread_hours - 1.0).abs() < 1e-9, "{usage:?}");
    // One ends unsolved at 30 minutes: its time still counts.
    budgets.settle(&TaskId::Num(1), Settle::Free, T0 + 30 * MIN);
    let usage = budgets.usage("alice", DAY, T0 + 60 * MIN);
    assert!((usage.thread_hours - 1.5).abs() < 1e-9, "{usage:?}");
    let budget = Budget {
        limit: BudgetLimit::ThreadHours(2.0),
        period: DAY,
        soft: 0.8,
    };
    assert!((usage.ratio(&budget) - 0.75).abs() < 1e-9);
}

#[test]
fn the_window_rolls_what_is_older_than_the_period_out() {
    let budgets = Budgets::default();
    for (n, at) in [(1, T0), (2, T0 + 12 * 60 * MIN)] {
        budgets.reserve(TaskId::Num(n), &alice(), 1.0, at);
        budgets.settle(&TaskId::Num(n), Settle::AsReserved, at);
    }
    assert_eq!(budgets.usage("alice", DAY, T0 + 23 * 60 * MIN).spend, 2.0);
    assert_eq!(budgets.usage("alice", DAY, T0 + 25 * 60 * MIN).spend, 1.0);
    assert_eq!(budgets.usage("alice", DAY, T0 + 37 * 60 * MIN).spend, 0.0);
}

#[test]
fn a_budget_allows_submits_until_reserved_and_spent_reach_it() {
    let budgets = Budgets::default();
    let budget = spend(0.01);
    let mut n = 0;
    while budgets.allows("alice", &budget, T0) {
        n += 1;
        budgets.reserve(TaskId::Num(n), &alice(), 0.003, T0);
        assert!(n < 100);
    }
    assert_eq!(n, 4, "0.009 left room for one more; 0.012 leaves none");
    // Other tokens are unaffected.
    assert!(budgets.allows("bob", &budget, T0));
    // Unsolved tasks give their reservations back.
    for task in 1..=2 {
        budgets.settle(&TaskId::Num(task), Settle::Free, T0 + MIN);
    }
    assert!(budgets.allows("alice", &budget, T0 + MIN));
}

#[test]
fn the_ledger_survives_a_save_and_a_restore() {
    let budgets = Budgets::default();
    budgets.reserve(TaskId::Num(1), &alice(), 0.5, T0);
    budgets.settle(&TaskId::Num(1), Settle::AsReserved, T0 + MIN);
    budgets.reserve(TaskId::Num(2), &alice(), 0.25, T0 + MIN);
    let saved = budgets.to_save().expect("changed");
    assert_eq!(budgets.to_save(), None, "nothing changed since");
    let text = serde_json::to_string(&saved).unwrap();
    let restored = Budgets::default();
    restored.restore(serde_json::from_str(&text).unwrap());
    let now = T0 + 2 * MIN;
    assert_eq!(
        restored.usage("alice", DAY, now),
        budgets.usage("alice", DAY, now)
    );
    // The open task settles after the restore.
    restored.settle(&TaskId::Num(2), Settle::Free, now);
    assert_eq!(restored.usage("alice", DAY, now).spend, 0.5);
}

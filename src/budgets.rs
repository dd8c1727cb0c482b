//! What each caller token's tasks have spent: money (the price of each task, reserved at the
//! submit and settled at its final answer) and thread-time (how long each task held a
//! thread), over a rolling window, by token name. Kept in memory behind one lock (it is
//! touched at submits and final answers, never per poll), saved to `data_dir` now and then
//! ([`Saved`]) so a restart keeps the counts.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::captcha::TaskId;
use crate::config::{Budget, BudgetLimit};

/// Settled amounts are summed per minute: a 30-day window is then 43,200 entries a token
/// at most, and a window's edge is a minute sharp.
const BUCKET_MS: u64 = 60_000;

/// Milliseconds since the Unix epoch: budgets span restarts, so they count wall time.
pub type UnixMs = u64;

/// The wall clock now, as budgets count it.
pub fn now() -> UnixMs {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

/// How a task's reservation is settled at its end.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Settle {
    /// Solved at the reserved price.
    AsReserved,
    /// Solved at the cost the service reported.
    Cost(f64),
    /// Not solved (unsolvable, or unknown to the service): it costs nothing. The thread it
    /// held still counts for a `thread_hours` budget.
    Free,
}

/// A token's usage over a window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    /// Settled and reserved money.
    pub spend: f64,
    /// Thread-hours of ended tasks and of the open ones so far.
    pub thread_hours: f64,
}

impl Usage {
    /// How much of `budget` is used: 0 to 1 (and beyond, after an overshoot).
    pub fn ratio(&self, budget: &Budget) -> f64 {
        let used = match budget.limit {
            BudgetLimit::Spend(_) => self.spend,
            BudgetLimit::ThreadHours(_) => self.thread_hours,
        };
        used / budget.limit.amount()
    }
}

#[derive(Default)]
struct Account {
    /// (bucket start, money, thread-seconds), oldest first.
    settled: VecDeque<(UnixMs, f64, f64)>,
    money: f64,
    thread_secs: f64,
    /// Money reserved by open tasks.
    reserved: f64,
    /// Open tasks and the sum of their start times (seconds), for their thread-time so far
    /// without walking them.
    open: u32,
    opened_secs: f64,
}

impl Account {
    fn add(&mut self, at: UnixMs, money: f64, thread_secs: f64) {
        let bucket = at - at % BUCKET_MS;
        match self.settled.back_mut() {
            Some(last) if last.0 == bucket => {
                last.1 += money;
                last.2 += thread_secs;
            }
            _ => self.settled.push_back((bucket, money, thread_secs)),
        }
        self.money += money;
        self.thread_secs += thread_secs;
    }

    /// Drops what fell out of the window ending at `now`.
    fn prune(&mut self, period: Duration, now: UnixMs) {
        let start = now.saturating_sub(u64::try_from(period.as_millis()).unwrap_or(u64::MAX));
        while let Some(&(at, money, secs)) = self.settled.front() {
            if at + BUCKET_MS > start {
                break;
            }
            self.money -= money;
            self.thread_secs -= secs;
            self.settled.pop_front();
        }
        if self.settled.is_empty() {
            // No float dust left behind by the subtractions.
            self.money = 0.0;
            self.thread_secs = 0.0;
        }
    }

    fn usage(&self, now: UnixMs) -> Usage {
        let open_secs = (f64::from(self.open) * secs(now) - self.opened_secs).max(0.0);
        Usage {
            spend: (self.money + self.reserved).max(0.0),
            thread_hours: (self.thread_secs + open_secs).max(0.0) / 3600.0,
        }
    }
}

struct Open {
    token: Arc<str>,
    reserved: f64,
    opened: UnixMs,
}

#[derive(Default)]
struct Ledger {
    accounts: HashMap<Arc<str>, Account>,
    open: HashMap<TaskId, Open>,
    /// Changed since the last save.
    dirty: bool,
}

/// Every token's spend, by token name.
#[derive(Default)]
pub struct Budgets(Mutex<Ledger>);

fn secs(at: UnixMs) -> f64 {
    at as f64 / 1000.0
}

impl Budgets {
    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `token` submitted `task` at `now`, reserving `price`.
    pub fn reserve(&self, task: TaskId, token: &Arc<str>, price: f64, now: UnixMs) {
        let mut ledger = self.ledger();
        let account = ledger.accounts.entry(token.clone()).or_default();
        account.reserved += price;
        account.open += 1;
        account.opened_secs += secs(now);
        let replaced = ledger.open.insert(
            task,
            Open {
                token: token.clone(),
                reserved: price,
                opened: now,
            },
        );
        if let Some(old) = replaced {
            // The same id twice (a service that reuses ids): the older task ends here.
            ledger.end(old, Settle::AsReserved, now);
        }
        ledger.dirty = true;
    }

    /// `token` spent `price` on a task that began at `began` and ended at `now` without a
    /// task id to follow (`solve.php` answers the solution itself).
    pub fn charge(&self, token: &Arc<str>, price: f64, began: UnixMs, now: UnixMs) {
        let mut ledger = self.ledger();
        let held = now.saturating_sub(began) as f64 / 1000.0;
        (ledger.accounts.entry(token.clone()).or_default()).add(now, price, held);
        ledger.dirty = true;
    }

    /// `task` ended at `now`. A task with no reservation (not submitted with a token, or
    /// settled already) changes nothing.
    pub fn settle(&self, task: &TaskId, how: Settle, now: UnixMs) {
        let mut ledger = self.ledger();
        if let Some(open) = ledger.open.remove(task) {
            ledger.end(open, how, now);
            ledger.dirty = true;
        }
    }

    /// Settles, as reserved, the tasks submitted before `cutoff` that never got a final
    /// answer (`[capacity] stale_after`: their threads went back unpolled); returns how
    /// many.
    pub fn settle_stale(&self, cutoff: UnixMs, now: UnixMs) -> usize {
        let mut ledger = self.ledger();
        let stale: Vec<TaskId> = ledger
            .open
            .iter()
            .filter(|(_, open)| open.opened < cutoff)
            .map(|(task, _)| task.clone())
            .collect();
        for task in &stale {
            if let Some(open) = ledger.open.remove(task) {
                ledger.end(open, Settle::AsReserved, now);
            }
        }
        if !stale.is_empty() {
            ledger.dirty = true;
        }
        stale.len()
    }

    /// `token`'s usage over the `period` ending at `now`.
    pub fn usage(&self, token: &str, period: Duration, now: UnixMs) -> Usage {
        let mut ledger = self.ledger();
        match ledger.accounts.get_mut(token) {
            Some(account) => {
                account.prune(period, now);
                account.usage(now)
            }
            None => Usage::default(),
        }
    }

    /// Whether `budget` leaves `token` room for another task at `now`.
    pub fn allows(&self, token: &str, budget: &Budget, now: UnixMs) -> bool {
        self.usage(token, budget.period, now).ratio(budget) < 1.0
    }

    /// The ledger as saved, and whether it changed since the last call.
    pub fn to_save(&self) -> Option<Saved> {
        let mut ledger = self.ledger();
        if !ledger.dirty {
            return None;
        }
        ledger.dirty = false;
        Some(Saved {
            accounts: ledger
                .accounts
                .iter()
                .map(|(name, account)| {
                    (name.to_string(), account.settled.iter().copied().collect())
                })
                .collect(),
            open: ledger
                .open
                .iter()
                .map(|(task, open)| {
                    (
                        task.to_string(),
                        open.token.to_string(),
                        open.reserved,
                        open.opened,
                    )
                })
                .collect(),
        })
    }

    /// A save failed: the next one writes everything again.
    pub fn mark_dirty(&self) {
        self.ledger().dirty = true;
    }

    /// The ledger `saved` held, in place of this one's.
    pub fn restore(&self, saved: Saved) {
        let mut ledger = Ledger::default();
        for (name, settled) in saved.accounts {
            let account = ledger.accounts.entry(Arc::from(name)).or_default();
            for (at, money, secs) in settled {
                account.add(at, money, secs);
            }
        }
        for (task, token, reserved, opened) in saved.open {
            let Some(task) = TaskId::parse(&task) else {
                continue;
            };
            let token: Arc<str> = Arc::from(token);
            let account = ledger.accounts.entry(token.clone()).or_default();
            account.reserved += reserved;
            account.open += 1;
            account.opened_secs += secs(opened);
            ledger.open.insert(
                task,
                Open {
                    token,
                    reserved,
                    opened,
                },
            );
        }
        *self.ledger() = ledger;
    }
}

impl Ledger {
    fn end(&mut self, open: Open, how: Settle, now: UnixMs) {
        let Some(account) = self.accounts.get_mut(&open.token) else {
            return;
        };
        account.reserved -= open.reserved;
        account.open = account.open.saturating_sub(1);
        account.opened_secs -= secs(open.opened);
        if account.open == 0 {
            account.reserved = 0.0;
            account.opened_secs = 0.0;
        }
        let money = match how {
            Settle::AsReserved => open.reserved,
            Settle::Cost(cost) if cost.is_finite() && cost >= 0.0 => cost,
            Settle::Cost(_) => open.reserved,
            Settle::Free => 0.0,
        };
        let held = now.saturating_sub(open.opened) as f64 / 1000.0;
        account.add(now, money, held);
    }
}

/// The ledger as `data_dir/budgets.json` keeps it.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Saved {
    /// By token name: (minute, money, thread-seconds), oldest first.
    pub accounts: HashMap<String, Vec<(UnixMs, f64, f64)>>,
    /// Open tasks: (task id, token name, money reserved, submitted at).
    pub open: Vec<(String, String, f64, UnixMs)>,
}

#[cfg(test)]
mod tests;

//! The simulated account side: keys, balances, threads, tasks and pingbacks, plus the shared
//! `State` that also holds faults and the request log. No HTTP and no wire formats here: the
//! endpoint code asks questions and gets enums back.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::str::FromStr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::faults::FaultBook;
use super::wire::Received;
use crate::provider::Provider;
use crate::ApiKey;

/// How the simulated service treats a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimKeyState {
    /// Works normally.
    Valid,
    /// Answers `ERROR_KEY_DOES_NOT_EXIST` everywhere.
    Unknown,
    /// Answers `ERROR_IP_NOT_ALLOWED` everywhere.
    IpNotAllowed,
    /// No plan: submits answer `ERROR_ZERO_BALANCE`, `threadsinfo` shows 0 working threads.
    ZeroBalance,
}

impl SimKeyState {
    fn parse(value: &str) -> Result<SimKeyState, String> {
        match value {
            "valid" => Ok(SimKeyState::Valid),
            "unknown" => Ok(SimKeyState::Unknown),
            "ip-not-allowed" => Ok(SimKeyState::IpNotAllowed),
            "zero-balance" => Ok(SimKeyState::ZeroBalance),
            other => Err(format!(
                "invalid state {other:?} (expected valid, unknown, ip-not-allowed or zero-balance)"
            )),
        }
    }
}

/// One account the simulator knows.
#[derive(Clone)]
pub struct SimKey {
    /// The key value clients send.
    pub key: String,
    /// What `getbalance` answers; each accepted task deducts `cost`.
    pub balance: f64,
    /// Concurrent tasks allowed before submits answer the busy code.
    pub threads: u32,
    /// How the key is treated.
    pub state: SimKeyState,
    /// Deducted from `balance` per accepted task.
    pub cost: f64,
}

impl SimKey {
    /// A working key: balance 10.0, 5 threads, cost 0.001 per task.
    pub fn valid(key: &str) -> SimKey {
        SimKey {
            key: key.to_owned(),
            balance: 10.0,
            threads: 5,
            state: SimKeyState::Valid,
            cost: 0.001,
        }
    }
}

// Hand-written so a `{:?}` in a test failure or a log line shows only the fingerprint.
impl fmt::Debug for SimKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimKey")
            .field("key", &ApiKey::new(&self.key))
            .field("balance", &self.balance)
            .field("threads", &self.threads)
            .field("state", &self.state)
            .field("cost", &self.cost)
            .finish()
    }
}

/// Parses the `--key` syntax:
/// `VALUE[,balance=F][,threads=N][,state=valid|unknown|ip-not-allowed|zero-balance][,cost=F]`.
/// Error messages never contain the key value.
impl FromStr for SimKey {
    type Err = String;

    fn from_str(spec: &str) -> Result<SimKey, String> {
        let mut parts = spec.split(',');
        let value = parts.next().unwrap_or_default().trim();
        if value.is_empty() {
            return Err("the key value is empty".to_owned());
        }
        if value.contains('=') {
            return Err("the key value must come first, before any option".to_owned());
        }
        let mut key = SimKey::valid(value);
        let mut seen: Vec<&str> = Vec::new();
        for part in parts {
            let (name, raw) = part
                .split_once('=')
                .ok_or_else(|| format!("option {:?} is not NAME=VALUE", part.trim()))?;
            let (name, raw) = (name.trim(), raw.trim());
            if seen.contains(&name) {
                return Err(format!("option {name:?} given twice"));
            }
            seen.push(name);
            match name {
                "balance" => key.balance = parse_amount(name, raw)?,
                "cost" => key.cost = parse_amount(name, raw)?,
                "threads" => {
                    key.threads = raw.parse().map_err(|_| {
                        format!("invalid threads {raw:?} (expected a whole number)")
                    })?;
                }
                "state" => key.state = SimKeyState::parse(raw)?,
                other => {
                    return Err(format!(
                        "unknown option {other:?} (expected balance, threads, state or cost)"
                    ))
                }
            }
        }
        Ok(key)
    }
}

fn parse_amount(name: &str, raw: &str) -> Result<f64, String> {
    match raw.parse::<f64>() {
        Ok(amount) if amount.is_finite() && amount >= 0.0 => Ok(amount),
        _ => Err(format!(
            "invalid {name} {raw:?} (expected a non-negative number)"
        )),
    }
}

/// Rounds money to micro-units so repeated deductions print as `9.997`, not `9.997000000000001`.
pub(crate) fn round_money(amount: f64) -> f64 {
    (amount * 1_000_000.0).round() / 1_000_000.0
}

/// Why a key may not use an endpoint at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    Granted,
    /// Missing or unregistered, and not 32 characters long.
    WrongUserKey,
    /// Unregistered 32-character key, or state `Unknown`.
    KeyDoesNotExist,
    IpNotAllowed,
}

/// What a submit asks for once its parameters passed validation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TaskSpec {
    /// reCAPTCHA Enterprise: JSON answers carry `result` and `user_agent` too.
    pub(crate) enterprise: bool,
}

/// Why a submit was refused by the account (parameter errors are decided by the caller).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    ZeroBalance,
    Busy,
    /// The caller's validation error, reported only once the account checks passed.
    Invalid(&'static str),
}

/// The outcome of polling one task id.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum PollItem {
    Ready {
        answer: String,
        cost: f64,
        enterprise: bool,
    },
    NotReady,
    Unsolvable,
    /// Missing, unknown, or created by another key.
    WrongId,
    /// Not made of digits.
    WrongIdFormat,
}

/// `threadsinfo` numbers as the service reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ThreadsInfo {
    pub(crate) threads: u32,
    pub(crate) working: u32,
}

/// First task id handed out; real ids are 11-digit numbers.
const FIRST_TASK_ID: u64 = 73_000_000_001;
/// Ids apart between two simulated providers' first tasks.
const PROVIDER_ID_SPAN: u64 = 1_000_000_000;
/// How many requests `received()` keeps.
const RECEIVED_CAP: usize = 10_000;

struct Account {
    config: SimKey,
    working: u32,
    peak: u32,
    pingbacks: Vec<String>,
}

struct Task {
    owner: String,
    polls: u32,
    cost: f64,
    enterprise: bool,
    unsolvable: bool,
    /// Set once the final answer went out; later polls repeat it.
    answered: bool,
    /// Whether the task still counts as a working thread of its owner.
    holds_thread: bool,
    /// With a solve time ([`State::with_solve_time`]): not ready before this, however
    /// often it is polled.
    ready_at: Option<Instant>,
}

/// Keys and tasks, behind one lock so that admission (balance, threads) and the thread
/// counters can never disagree under concurrent submits.
struct Accounts {
    keys: HashMap<String, Account>,
    tasks: HashMap<u64, Task>,
    next_id: u64,
}

/// Everything the running simulator shares between connections and the [`super::SimHandle`].
/// Three separate std mutexes: none is held across an `.await`, and a test reading the request
/// log never waits for account bookkeeping.
pub(crate) struct State {
    /// Polls 1..n-1 answer `CAPCHA_NOT_READY`, poll n the answer.
    polls_to_ready: u32,
    /// How long a task takes to solve, at least and at most: each task's time lies between,
    /// spread evenly by its id. `None`: ready by polls alone.
    solve_time: Option<(Duration, Duration)>,
    /// What a valid key with no free thread answers.
    pub(crate) busy_code: String,
    /// Which service this simulator plays: its task ids, and the actions and methods it
    /// answers (`api`).
    pub(crate) provider: Provider,
    accounts: Mutex<Accounts>,
    faults: Mutex<FaultBook>,
    received: Mutex<VecDeque<Received>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; if something ever did, the data is still
    // consistent enough for a simulator, so keep serving instead of cascading the panic.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    pub(crate) fn new(
        keys: Vec<SimKey>,
        polls_to_ready: u32,
        busy_code: String,
        provider: Provider,
    ) -> State {
        let state = State {
            polls_to_ready,
            solve_time: None,
            busy_code,
            provider,
            accounts: Mutex::new(Accounts {
                keys: HashMap::new(),
                tasks: HashMap::new(),
                // Each service's ids in a range of their own, as real ones are: a proxy in
                // front of two simulators must tell tasks apart by id.
                next_id: FIRST_TASK_ID + provider as u64 * PROVIDER_ID_SPAN,
            }),
            faults: Mutex::new(FaultBook::default()),
            received: Mutex::new(VecDeque::new()),
        };
        for key in keys {
            state.add_key(key);
        }
        state
    }

    pub(crate) fn faults(&self) -> MutexGuard<'_, FaultBook> {
        lock(&self.faults)
    }

    // === request log ===

    pub(crate) fn record(&self, request: Received) {
        let mut log = lock(&self.received);
        if log.len() == RECEIVED_CAP {
            log.pop_front();
        }
        log.push_back(request);
    }

    pub(crate) fn received(&self) -> Vec<Received> {
        lock(&self.received).iter().cloned().collect()
    }

    pub(crate) fn clear_received(&self) {
        lock(&self.received).clear();
    }

    // === keys ===

    /// Registers a key, or reconfigures it while keeping its running tasks and counters.
    pub(crate) fn add_key(&self, key: SimKey) {
        let mut accounts = lock(&self.accounts);
        match accounts.keys.get_mut(&key.key) {
            Some(account) => account.config = key,
            None => {
                let value = key.key.clone();
                accounts.keys.insert(
                    value,
                    Account {
                        config: key,
                        working: 0,
                        peak: 0,
                        pingbacks: Vec::new(),
                    },
                );
            }
        }
    }

    pub(crate) fn set_state(&self, key: &str, state: SimKeyState) {
        if let Some(account) = lock(&self.accounts).keys.get_mut(key) {
            account.config.state = state;
        }
    }

    pub(crate) fn set_balance(&self, key: &str, balance: f64) {
        if let Some(account) = lock(&self.accounts).keys.get_mut(key) {
            account.config.balance = balance;
        }
    }

    pub(crate) fn balance(&self, key: &str) -> Option<f64> {
        lock(&self.accounts)
            .keys
            .get(key)
            .map(|account| account.config.balance)
    }

    pub(crate) fn working_threads(&self, key: &str) -> u32 {
        lock(&self.accounts)
            .keys
            .get(key)
            .map_or(0, |account| account.working)
    }

    pub(crate) fn peak_threads(&self, key: &str) -> u32 {
        lock(&self.accounts)
            .keys
            .get(key)
            .map_or(0, |account| account.peak)
    }

    /// The check every endpoint runs before anything else of the key's.
    pub(crate) fn access(&self, key: Option<&str>) -> Access {
        let accounts = lock(&self.accounts);
        let Some(account) = key.and_then(|key| accounts.keys.get(key)) else {
            // The service checks the format before looking the key up.
            return match key {
                Some(key) if key.chars().count() == 32 => Access::KeyDoesNotExist,
                _ => Access::WrongUserKey,
            };
        };
        match account.config.state {
            SimKeyState::Valid | SimKeyState::ZeroBalance => Access::Granted,
            SimKeyState::Unknown => Access::KeyDoesNotExist,
            SimKeyState::IpNotAllowed => Access::IpNotAllowed,
        }
    }

    /// Tasks take between `min` and `max` to solve (each its own time, spread by its id),
    /// as a real service's workers do, besides the polls `polls_to_ready` asks for.
    pub(crate) fn with_solve_time(mut self, range: Option<(Duration, Duration)>) -> State {
        self.solve_time = range;
        self
    }

    /// When `id` is solved, for a simulator with a solve time.
    pub(crate) fn ready_at(&self, id: u64) -> Option<Instant> {
        lock(&self.accounts).tasks.get(&id)?.ready_at
    }

    // === tasks ===

    /// Admits a task for `key` (which passed [`State::access`]): balance first, then a free
    /// thread, then the caller's own validation result, in the order the service reports them.
    pub(crate) fn submit(
        &self,
        key: &str,
        spec: Result<TaskSpec, &'static str>,
    ) -> Result<u64, Refusal> {
        let mut guard = lock(&self.accounts);
        let accounts = &mut *guard;
        let account = accounts.keys.get_mut(key).ok_or(Refusal::ZeroBalance)?;
        let config = &account.config;
        if config.state == SimKeyState::ZeroBalance || config.balance < config.cost {
            return Err(Refusal::ZeroBalance);
        }
        if account.working >= config.threads {
            return Err(Refusal::Busy);
        }
        let spec = spec.map_err(Refusal::Invalid)?;
        account.config.balance = round_money(config.balance - config.cost);
        account.working += 1;
        account.peak = account.peak.max(account.working);
        let id = accounts.next_id;
        accounts.next_id += 1;
        accounts.tasks.insert(
            id,
            Task {
                owner: key.to_owned(),
                polls: 0,
                cost: account.config.cost,
                enterprise: spec.enterprise,
                unsolvable: false,
                answered: false,
                holds_thread: true,
                ready_at: self.solve_time.map(|(min, max)| {
                    // A fixed spread over the range by the id, so a run is repeatable.
                    let share = (id.wrapping_mul(2_654_435_761) % 1000) as f64 / 1000.0;
                    Instant::now() + min + (max.saturating_sub(min)).mul_f64(share)
                }),
            },
        );
        Ok(id)
    }

    /// Ends a `solve.php` task: its answer is out, its thread is free.
    pub(crate) fn finish_solve(&self, id: u64) {
        let mut guard = lock(&self.accounts);
        let accounts = &mut *guard;
        if let Some(task) = accounts.tasks.get_mut(&id) {
            task.answered = true;
            release_thread(task, &mut accounts.keys);
        }
    }

    /// One poll of `raw_id` by `key`; counts towards readiness only for the task's owner.
    pub(crate) fn poll(&self, key: &str, raw_id: &str) -> PollItem {
        let id = match parse_task_id(raw_id) {
            Ok(id) => id,
            Err(item) => return item,
        };
        let mut guard = lock(&self.accounts);
        let accounts = &mut *guard;
        let Some(task) = accounts.tasks.get_mut(&id).filter(|task| task.owner == key) else {
            return PollItem::WrongId;
        };
        if task.unsolvable {
            release_thread(task, &mut accounts.keys);
            return PollItem::Unsolvable;
        }
        if task.ready_at.is_some_and(|ready| Instant::now() < ready) {
            return PollItem::NotReady;
        }
        if !task.answered {
            task.polls = task.polls.saturating_add(1);
            if task.polls < self.polls_to_ready {
                return PollItem::NotReady;
            }
            task.answered = true;
            release_thread(task, &mut accounts.keys);
        }
        PollItem::Ready {
            answer: format!("tok-{id}"),
            cost: task.cost,
            enterprise: task.enterprise,
        }
    }

    /// Whether `raw_id` names a task of `key` (what a report needs).
    pub(crate) fn owns_task(&self, key: &str, raw_id: &str) -> bool {
        let Ok(id) = parse_task_id(raw_id) else {
            return false;
        };
        lock(&self.accounts)
            .tasks
            .get(&id)
            .is_some_and(|task| task.owner == key)
    }

    pub(crate) fn make_unsolvable(&self, id: u64) {
        if let Some(task) = lock(&self.accounts).tasks.get_mut(&id) {
            task.unsolvable = true;
        }
    }

    pub(crate) fn task_owner(&self, id: u64) -> Option<String> {
        lock(&self.accounts)
            .tasks
            .get(&id)
            .map(|task| task.owner.clone())
    }

    // === account actions ===

    pub(crate) fn threads_info(&self, key: &str) -> ThreadsInfo {
        let accounts = lock(&self.accounts);
        let Some(account) = accounts.keys.get(key) else {
            return ThreadsInfo {
                threads: 0,
                working: 0,
            };
        };
        let working = match account.config.state {
            // The official SDK reads "threads free, yet ERROR_ZERO_BALANCE" as "no plan".
            SimKeyState::ZeroBalance => 0,
            _ => account.working,
        };
        ThreadsInfo {
            threads: account.config.threads,
            working,
        }
    }

    pub(crate) fn add_pingback(&self, key: &str, addr: &str) {
        if let Some(account) = lock(&self.accounts).keys.get_mut(key) {
            if !account.pingbacks.iter().any(|known| known == addr) {
                account.pingbacks.push(addr.to_owned());
            }
        }
    }

    pub(crate) fn pingbacks(&self, key: &str) -> Vec<String> {
        lock(&self.accounts)
            .keys
            .get(key)
            .map(|account| account.pingbacks.clone())
            .unwrap_or_default()
    }

    /// Removes `addr`, or every address when `addr` is `all`.
    pub(crate) fn del_pingback(&self, key: &str, addr: &str) {
        if let Some(account) = lock(&self.accounts).keys.get_mut(key) {
            if addr == "all" {
                account.pingbacks.clear();
            } else {
                account.pingbacks.retain(|known| known != addr);
            }
        }
    }
}

/// Frees the task's thread the first time it reaches a final state.
fn release_thread(task: &mut Task, keys: &mut HashMap<String, Account>) {
    if !task.holds_thread {
        return;
    }
    task.holds_thread = false;
    if let Some(account) = keys.get_mut(&task.owner) {
        account.working = account.working.saturating_sub(1);
    }
}

/// Task ids are digits only (`ERROR_WRONG_ID_FORMAT` otherwise); a missing id, or one too long
/// to be any task, is simply not found.
fn parse_task_id(raw: &str) -> Result<u64, PollItem> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Err(PollItem::WrongId);
    }
    if !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(PollItem::WrongIdFormat);
    }
    raw.parse().map_err(|_| PollItem::WrongId)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_spec_parses_every_option() {
        let key: SimKey = "abc,balance=2.5,threads=3,state=ip-not-allowed,cost=0.01"
            .parse()
            .expect("valid spec");
        assert_eq!(key.key, "abc");
        assert_eq!(key.balance, 2.5);
        assert_eq!(key.threads, 3);
        assert_eq!(key.state, SimKeyState::IpNotAllowed);
        assert_eq!(key.cost, 0.01);

        let plain: SimKey = "abc".parse().expect("bare key");
        assert_eq!(
            (plain.balance, plain.threads, plain.state, plain.cost),
            (10.0, 5, SimKeyState::Valid, 0.001)
        );
        let states: Vec<SimKeyState> = ["valid", "unknown", "zero-balance"]
            .iter()
            .map(|s| {
                format!("k,state={s}")
                    .parse::<SimKey>()
                    .expect("state")
                    .state
            })
            .collect();
        assert_eq!(
            states,
            [
                SimKeyState::Valid,
                SimKeyState::Unknown,
                SimKeyState::ZeroBalance
            ]
        );
    }

    #[test]
    fn key_spec_errors_name_the_problem_but_not_the_key() {
        let secret = "secretsecretsecret";
        let cases = [
            ("", "the key value is empty"),
            (" ,threads=1", "the key value is empty"),
            (
                "balance=5",
                "the key value must come first, before any option",
            ),
            (
                "secretsecretsecret,colour=red",
                "unknown option \"colour\" (expected balance, threads, state or cost)",
            ),
            (
                "secretsecretsecret,threads=-1",
                "invalid threads \"-1\" (expected a whole number)",
            ),
            (
                "secretsecretsecret,balance=NaN",
                "invalid balance \"NaN\" (expected a non-negative number)",
            ),
            (
                "secretsecretsecret,cost=-0.5",
                "invalid cost \"-0.5\" (expected a non-negative number)",
            ),
            (
                "secretsecretsecret,state=dead",
                "invalid state \"dead\" (expected valid, unknown, ip-not-allowed or zero-balance)",
            ),
            (
                "secretsecretsecret,threads",
                "option \"threads\" is not NAME=VALUE",
            ),
            (
                "secretsecretsecret,threads=1,threads=2",
                "option \"threads\" given twice",
            ),
        ];
        for (spec, expected) in cases {
            let err = spec.parse::<SimKey>().expect_err(spec);
            assert_eq!(err, expected, "spec {spec:?}");
            assert!(!err.contains(secret));
        }
    }

    #[test]
    fn debug_shows_only_a_fingerprint() {
        let key = SimKey::valid("0123456789abcdef0123456789abf3a9");
        let shown = format!("{key:?}");
        assert!(!shown.contains("0123456789abcdef"), "{shown}");
        assert!(shown.contains("…f3a9"), "{shown}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_with_a_solve_time_is_not_ready_before_it_whatever_the_polls() {
        let key = "0123456789abcdef0123456789abcdef";
        let mut sim_key = SimKey::valid(key);
        sim_key.threads = 20;
        let state = State::new(
            vec![sim_key],
            1,
            "ERROR_ZERO_BALANCE".to_owned(),
            Provider::CaptchaAi,
        )
        .with_solve_time(Some((Duration::from_secs(10), Duration::from_secs(30))));
        let start = Instant::now();
        let ids: Vec<u64> = (0..20)
            .map(|_| {
                state
                    .submit(key, Ok(TaskSpec { enterprise: false }))
                    .expect("admitted")
            })
            .collect();
        for id in &ids {
            let ready = state.ready_at(*id).expect("a solve time");
            let took = ready - start;
            assert!(
                (Duration::from_secs(10)..=Duration::from_secs(30)).contains(&took),
                "{took:?}"
            );
            for _ in 0..5 {
                assert_eq!(state.poll(key, &id.to_string()), PollItem::NotReady);
            }
        }
        tokio::time::advance(Duration::from_secs(30)).await;
        for id in &ids {
            assert!(matches!(
                state.poll(key, &id.to_string()),
                PollItem::Ready { .. }
            ));
        }
    }

    #[test]
    fn money_rounds_to_micro_units() {
        let mut balance = 10.0;
        for _ in 0..3 {
            balance = round_money(balance - 0.001);
        }
        assert_eq!(balance.to_string(), "9.997");
    }

    fn dummy_request(n: usize) -> Received {
        Received {
            method: "GET".to_owned(),
            path: format!("/{n}"),
            query: String::new(),
            content_type: None,
            body: bytes::Bytes::new(),
            params: Vec::new(),
            files: Vec::new(),
            key: None,
            action: None,
        }
    }

    #[test]
    fn the_request_log_keeps_the_most_recent_ten_thousand() {
        let state = State::new(
            Vec::new(),
            2,
            "ERROR_ZERO_BALANCE".to_owned(),
            Provider::CaptchaAi,
        );
        for n in 0..RECEIVED_CAP + 5 {
            state.record(dummy_request(n));
        }
        let log = state.received();
        assert_eq!(log.len(), RECEIVED_CAP);
        assert_eq!(log[0].path, "/5");
        assert_eq!(log[RECEIVED_CAP - 1].path, format!("/{}", RECEIVED_CAP + 4));
        state.clear_received();
        assert!(state.received().is_empty());
    }

    #[test]
    fn task_ids_parse_strictly() {
        assert_eq!(parse_task_id("73000000001"), Ok(73_000_000_001));
        assert_eq!(parse_task_id(""), Err(PollItem::WrongId));
        assert_eq!(parse_task_id("12a"), Err(PollItem::WrongIdFormat));
        assert_eq!(parse_task_id("-1"), Err(PollItem::WrongIdFormat));
        assert_eq!(
            parse_task_id("999999999999999999999999"),
            Err(PollItem::WrongId)
        );
    }
}

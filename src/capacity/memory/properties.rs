//! Property tests of reconciliation: random interleavings of submits, answers, solves, polls,
//! outside load, stale releases and `threadsinfo` reads (sent, read by the service, answered),
//! against a model that knows what the service is really working on.

use std::time::Duration;

use proptest::prelude::*;
use proptest::sample::Index;
use tokio::time::Instant;

use super::MemoryLoad;
use crate::capacity::{Load, LoadStore, ReadMark};
use crate::captcha::TaskId;
use crate::key_id::KeyId;

const KEYS: [KeyId; 2] = [KeyId(0), KeyId(1)];

#[derive(Clone, Debug)]
enum Op {
    /// A submit takes a thread of the key.
    Hold(usize),
    /// The service creates the task of a submit on its way.
    Create(Index),
    /// The submit's answer (a task id) reaches keyrelay.
    Open(Index),
    /// A submit on its way fails for keyrelay; if the service had created the task, the
    /// service keeps working on a task keyrelay no longer counts.
    Unhold(Index),
    /// The service finishes a task (solved or unsolvable); nobody has polled it yet.
    Solve(Index),
    /// keyrelay relays a finished task's final answer.
    Finish(Index),
    /// Another client of the key starts or ends a task.
    OutsideStart(usize),
    OutsideEnd(usize),
    /// A `threadsinfo` read of the key is sent.
    Send(usize),
    /// The service reads its count for a read under way.
    Read(Index),
    /// The answer of a read reaches keyrelay.
    Answer(Index),
    /// The clock moves on, by less than a second or more.
    Advance(u64),
    /// Tasks opened more than this many seconds ago are released as stale.
    Stale(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS.len();
    prop_oneof![
        4 => key.clone().prop_map(Op::Hold),
        3 => any::<Index>().prop_map(Op::Create),
        3 => any::<Index>().prop_map(Op::Open),
        1 => any::<Index>().prop_map(Op::Unhold),
        3 => any::<Index>().prop_map(Op::Solve),
        3 => any::<Index>().prop_map(Op::Finish),
        1 => key.clone().prop_map(Op::OutsideStart),
        1 => key.clone().prop_map(Op::OutsideEnd),
        2 => key.prop_map(Op::Send),
        2 => any::<Index>().prop_map(Op::Read),
        2 => any::<Index>().prop_map(Op::Answer),
        2 => (0_u64..1500).prop_map(Op::Advance),
        1 => (0_u64..4).prop_map(Op::Stale),
    ]
}

/// Where a submit stands on keyrelay's side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Pending,
    Open,
    Gone,
}

#[derive(Debug)]
struct Submit {
    key: usize,
    id: TaskId,
    stage: Stage,
    created: bool,
    /// The service counts it as a working thread.
    working: bool,
}

/// What the service saw at the moment it read.
#[derive(Debug)]
struct Seen {
    working: u32,
    /// Working threads that were not keyrelay's count at that moment: other clients' tasks,
    /// and tasks keyrelay had let go of (failed submits, stale releases).
    outside: u32,
    /// Submits the service was working on.
    live: Vec<usize>,
}

#[derive(Debug)]
struct Read {
    key: usize,
    mark: Option<ReadMark>,
    /// Submits on their way when marked.
    pending_at_mark: u32,
    holds_at_mark: u64,
    /// Submits whose task keyrelay counted as open when marked.
    open_at_mark: Vec<usize>,
    /// Whether any submit of the key was in flight at the mark or held since.
    ours_in_flight: bool,
    seen: Option<Seen>,
}

/// The bound the last reconciled read of a key sets: `pending + open + external` never
/// exceeds what the service counted plus the submits it could not have counted yet.
#[derive(Clone, Copy, Debug)]
struct Bound {
    working: u32,
    pending_at_mark: u32,
    holds_at_mark: u64,
}

struct Model {
    store: MemoryLoad,
    now: Instant,
    submits: Vec<Submit>,
    outside: [u32; 2],
    holds: [u64; 2],
    reads: Vec<Read>,
    bounds: [Option<Bound>; 2],
}

/// The index'th of the items that `eligible` accepts, if any.
fn pick<T>(items: &[T], index: &Index, eligible: impl Fn(&T) -> bool) -> Option<usize> {
    let candidates: Vec<usize> = (0..items.len()).filter(|&i| eligible(&items[i])).collect();
    (!candidates.is_empty()).then(|| candidates[index.index(candidates.len())])
}

impl Model {
    fn new(phase_ms: u64) -> Model {
        let store = MemoryLoad::new();
        Model {
            store,
            // The first event falls anywhere in its second, so the stamps' rounding varies.
            now: Instant::now() + Duration::from_millis(phase_ms),
            submits: Vec::new(),
            outside: [0; 2],
            holds: [0; 2],
            reads: Vec::new(),
            bounds: [None; 2],
        }
    }

    /// Whether keyrelay still counts the submit: on its way, or its task open in the store
    /// (not finished, not released as stale or done).
    fn counted(&self, s: &Submit) -> bool {
        match s.stage {
            Stage::Pending => true,
            Stage::Open => self.store.tasks.get(&s.id).is_some(),
            Stage::Gone => false,
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Hold(k) => {
                prop_assert!(self.store.try_hold(KEYS[*k], None));
                self.holds[*k] += 1;
                // The read's answer subtracts every hold taken before it arrives.
                for read in self
                    .reads
                    .iter_mut()
                    .filter(|r| r.key == *k && r.mark.is_some())
                {
                    read.ours_in_flight = true;
                }
                let id = TaskId::Num(self.submits.len() as u64);
                self.submits.push(Submit {
                    key: *k,
                    id,
                    stage: Stage::Pending,
                    created: false,
                    working: false,
                });
            }
            Op::Create(i) => {
                if let Some(i) = pick(&self.submits, i, |s| {
                    s.stage == Stage::Pending && !s.created
                }) {
                    self.submits[i].created = true;
                    self.submits[i].working = true;
                }
            }
            Op::Open(i) => {
                if let Some(i) = pick(&self.submits, i, |s| s.stage == Stage::Pending && s.created)
                {
                    let s = &mut self.submits[i];
                    self.store.open(KEYS[s.key], s.id.clone(), self.now);
                    s.stage = Stage::Open;
                }
            }
            Op::Unhold(i) => {
                if let Some(i) = pick(&self.submits, i, |s| s.stage == Stage::Pending) {
                    self.store.unhold(KEYS[self.submits[i].key]);
                    self.submits[i].stage = Stage::Gone;
                }
            }
            Op::Solve(i) => {
                if let Some(i) = pick(&self.submits, i, |s| s.working) {
                    self.submits[i].working = false;
                }
            }
            Op::Finish(i) => {
                if let Some(i) = pick(&self.submits, i, |s| s.stage == Stage::Open && !s.working) {
                    let counted = self.counted(&self.submits[i]);
                    let s = &mut self.submits[i];
                    let finished = self.store.finish(&s.id);
                    prop_assert_eq!(finished, counted.then_some(KEYS[s.key]));
                    s.stage = Stage::Gone;
                }
            }
            Op::OutsideStart(k) => self.outside[*k] += 1,
            Op::OutsideEnd(k) => self.outside[*k] = self.outside[*k].saturating_sub(1),
            Op::Send(k) => self.send(*k),
            Op::Read(j) => {
                if let Some(j) = pick(&self.reads, j, |r| r.seen.is_none()) {
                    self.read(j);
                }
            }
            Op::Answer(j) => {
                if let Some(j) = pick(&self.reads, j, |r| r.seen.is_some() && r.mark.is_some()) {
                    self.answer(j)?;
                }
            }
            Op::Advance(ms) => self.now += Duration::from_millis(*ms),
            Op::Stale(secs) => {
                let cutoff = self.now.checked_sub(Duration::from_secs(*secs));
                if let Some(cutoff) = cutoff {
                    self.store.release_stale(cutoff);
                }
            }
        }
        self.check_counts()?;
        self.check_bounds()
    }

    fn send(&mut self, k: usize) {
        let ours: Vec<usize> = (0..self.submits.len())
            .filter(|&i| self.submits[i].key == k)
            .collect();
        let pending_at_mark = ours
            .iter()
            .filter(|&&i| self.submits[i].stage == Stage::Pending)
            .count() as u32;
        let open_at_mark: Vec<usize> = ours
            .iter()
            .copied()
            .filter(|&i| self.submits[i].stage == Stage::Open && self.counted(&self.submits[i]))
            .collect();
        let ours_in_flight = pending_at_mark > 0 || !open_at_mark.is_empty();
        self.reads.push(Read {
            key: k,
            mark: Some(self.store.mark(KEYS[k])),
            pending_at_mark,
            holds_at_mark: self.holds[k],
            open_at_mark,
            ours_in_flight,
            seen: None,
        });
    }

    fn read(&mut self, j: usize) {
        let k = self.reads[j].key;
        let live: Vec<usize> = (0..self.submits.len())
            .filter(|&i| self.submits[i].key == k && self.submits[i].working)
            .collect();
        let counted = live
            .iter()
            .filter(|&&i| self.counted(&self.submits[i]))
            .count() as u32;
        let working = live.len() as u32 + self.outside[k];
        self.reads[j].seen = Some(Seen {
            working,
            outside: working - counted,
            live,
        });
    }

    fn answer(&mut self, j: usize) -> Result<(), TestCaseError> {
        let mark = self.reads[j].mark.take().expect("answered once");
        let read = &self.reads[j];
        let k = read.key;
        let seen = read.seen.as_ref().expect("read before answered");
        // Created before the read was sent and still counted: the service would have
        // counted each of them that it was still working on.
        let done_at_read = read
            .open_at_mark
            .iter()
            .filter(|&&i| self.submits[i].stage == Stage::Open)
            .filter(|&&i| self.store.tasks.get(&self.submits[i].id).is_some())
            .filter(|i| !seen.live.contains(i))
            .count() as u32;
        let released = self.store.reconcile(mark, seen.working);
        let external = self.store.load(KEYS[k]).external;

        prop_assert!(
            released <= done_at_read,
            "released {released} tasks, only {done_at_read} were done when the service read"
        );
        prop_assert!(
            external <= seen.outside,
            "no task counted twice: external {external}, outside load {}",
            seen.outside
        );
        if !read.ours_in_flight {
            prop_assert_eq!(external, seen.outside, "nothing of ours in flight: exact");
        }
        self.bounds[k] = Some(Bound {
            working: seen.working,
            pending_at_mark: read.pending_at_mark,
            holds_at_mark: read.holds_at_mark,
        });
        Ok(())
    }

    /// keyrelay's own counts are exactly the submits it still counts.
    fn check_counts(&self) -> Result<(), TestCaseError> {
        for (k, key) in KEYS.iter().enumerate() {
            let load = self.store.load(*key);
            let of = |stage| {
                self.submits
                    .iter()
                    .filter(|s| s.key == k && s.stage == stage && self.counted(s))
                    .count() as u32
            };
            prop_assert_eq!(
                (load.pending, load.open),
                (of(Stage::Pending), of(Stage::Open))
            );
        }
        Ok(())
    }

    /// Own and outside load together never exceed the last reconciled read's count plus the
    /// submits it could not have counted: on their way when it was sent, or held since.
    fn check_bounds(&self) -> Result<(), TestCaseError> {
        for (k, key) in KEYS.iter().enumerate() {
            let Some(bound) = self.bounds[k] else {
                continue;
            };
            let load = self.store.load(*key);
            let since = self.holds[k] - bound.holds_at_mark;
            let limit = u64::from(bound.working) + u64::from(bound.pending_at_mark) + since;
            prop_assert!(
                u64::from(load.in_use()) <= limit,
                "{load:?} against {bound:?} and {since} holds since"
            );
        }
        Ok(())
    }

    /// Ends everything: submits on their way are answered, the service finishes every task,
    /// other clients stop; keyrelay polls the tasks in `polled` to the end and the rest never.
    fn wind_down(&mut self, polled: bool) {
        for s in &mut self.submits {
            if s.stage == Stage::Pending {
                s.created = true;
                self.store.open(KEYS[s.key], s.id.clone(), self.now);
                s.stage = Stage::Open;
            }
            s.working = false;
            if polled && s.stage == Stage::Open {
                self.store.finish(&s.id);
                s.stage = Stage::Gone;
            }
        }
        self.outside = [0; 2];
    }
}

fn run(phase_ms: u64, ops: &[Op], polled: bool) -> Result<(), TestCaseError> {
    let mut model = Model::new(phase_ms);
    for op in ops {
        model.apply(op)?;
    }
    model.wind_down(polled);
    model.check_counts()?;
    // Reads still under way are answered, late, with what the service saw (or, if it had not
    // read yet, sees now: nothing).
    for j in 0..model.reads.len() {
        if model.reads[j].mark.is_some() {
            if model.reads[j].seen.is_none() {
                model.read(j);
            }
            model.answer(j)?;
            model.check_bounds()?;
        }
    }
    for (k, key) in KEYS.iter().enumerate() {
        model.send(k);
        let j = model.reads.len() - 1;
        model.read(j);
        model.answer(j)?;
        prop_assert_eq!(
            model.store.load(*key),
            Load::default(),
            "every task ended and a read says 0 working: no load"
        );
    }
    prop_assert!(model.store.tasks.is_empty());
    Ok(())
}

proptest! {
    // A failing case is printed, shrunk, by the runner; a regressions file would be a file
    // outside what this test owns.
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn no_task_is_counted_twice_and_an_idle_key_ends_with_no_load(
        phase_ms in 0_u64..1000,
        ops in prop::collection::vec(op(), 0..120),
        polled in any::<bool>(),
    ) {
        run(phase_ms, &ops, polled)?;
    }
}

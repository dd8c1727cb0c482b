//! Compact per-task storage: tasks by id, each with its key and a time, and the same tasks in
//! time order. Task pins and the open-task ledger both keep one entry per task, so at a
//! million tasks every byte here is a megabyte.
//!
//! Numeric ids (all of CaptchaAI's) are keyed as `u64` and queued as 12 bytes; the rare text
//! id gets maps and queues of its own. Times are whole seconds from a per-table epoch
//! ([`Clock`]), 4 bytes instead of an `Instant`'s 16, which is plenty for TTLs and stale
//! cut-offs counted in minutes and hours.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::captcha::TaskId;
use crate::fast_map::FastMap;
use crate::key_id::KeyId;

/// A time in whole seconds from a [`Clock`]'s epoch; negative before it (pins restored from a
/// journal are older than the process).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stamp(i32);

/// Converts instants to [`Stamp`]s and back, against one epoch.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    epoch: Instant,
}

impl Clock {
    /// A clock whose epoch is now.
    pub fn new() -> Clock {
        Clock {
            epoch: Instant::now(),
        }
    }

    /// `at` as recorded: rounded up to the next whole second, so that an age read later is
    /// never more than the true age. Pins then never expire early and open tasks are never
    /// released early; either may last up to two seconds longer. Saturates some 68 years
    /// either side of the epoch.
    pub fn stamp(&self, at: Instant) -> Stamp {
        let floor = self.floor(at);
        if self.instant(floor) < at {
            Stamp(floor.0.saturating_add(1))
        } else {
            floor
        }
    }

    /// `at` rounded down to its second: how "now" and cut-offs are compared with stamps.
    pub fn floor(&self, at: Instant) -> Stamp {
        let secs = |d: Duration| i32::try_from(d.as_secs()).unwrap_or(i32::MAX);
        if at >= self.epoch {
            Stamp(secs(at - self.epoch))
        } else {
            let before = self.epoch - at;
            let partial = i32::from(before.subsec_nanos() > 0);
            Stamp(secs(before).saturating_add(partial).saturating_neg())
        }
    }

    /// The instant a stamp stands for. One the monotonic clock cannot express (before boot)
    /// comes back as the epoch.
    pub fn instant(&self, stamp: Stamp) -> Instant {
        let offset = Duration::from_secs(u64::from(stamp.0.unsigned_abs()));
        if stamp.0 >= 0 {
            self.epoch + offset
        } else {
            self.epoch.checked_sub(offset).unwrap_or(self.epoch)
        }
    }

    /// How long before `now` a stamp was, in whole seconds; zero for one in the future.
    pub fn age(&self, stamp: Stamp, now: Instant) -> Duration {
        let secs = i64::from(self.floor(now).0) - i64::from(stamp.0);
        Duration::from_secs(u64::try_from(secs).unwrap_or(0))
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::new()
    }
}

/// What a table keeps per task: 8 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub key: KeyId,
    pub at: Stamp,
    /// The caller token that created the task (`tokens::TokenId`), 0 for none: room the
    /// padding after `key` had anyway.
    pub owner: u16,
}

/// Tasks by id. Lookups run concurrently, sharded like every map of the request path.
#[derive(Default)]
pub struct TaskMap {
    nums: FastMap<u64, Entry>,
    texts: FastMap<Box<str>, Entry>,
}

impl TaskMap {
    /// Files `entry` under `task`; the entry it replaced, if any.
    pub fn insert(&self, task: &TaskId, entry: Entry) -> Option<Entry> {
        match task {
            TaskId::Num(n) => self.nums.insert(*n, entry),
            TaskId::Text(s) => self.texts.insert(s.clone(), entry),
        }
    }

    pub fn get(&self, task: &TaskId) -> Option<Entry> {
        match task {
            TaskId::Num(n) => self.nums.get(n).map(|e| *e),
            TaskId::Text(s) => self.texts.get(s).map(|e| *e),
        }
    }

    pub fn remove(&self, task: &TaskId) -> Option<Entry> {
        match task {
            TaskId::Num(n) => self.nums.remove(n).map(|(_, e)| e),
            TaskId::Text(s) => self.texts.remove(s).map(|(_, e)| e),
        }
    }

    /// Removes `task`'s entry if `keep_out` says so, atomically with the check.
    pub fn remove_if(&self, task: &TaskId, keep_out: impl FnOnce(&Entry) -> bool) -> Option<Entry> {
        match task {
            TaskId::Num(n) => self.nums.remove_if(n, |_, e| keep_out(e)).map(|(_, e)| e),
            TaskId::Text(s) => self.texts.remove_if(s, |_, e| keep_out(e)).map(|(_, e)| e),
        }
    }

    /// Whether `task` is filed with exactly this time: the same event, not a later one.
    pub fn holds(&self, task: &TaskId, at: Stamp) -> bool {
        self.get(task).is_some_and(|entry| entry.at == at)
    }

    /// Removes every entry `take` accepts and returns them, in no particular order. Visits
    /// every entry, one shard's lock at a time.
    pub fn take_where(&self, mut take: impl FnMut(&Entry) -> bool) -> Vec<(TaskId, Entry)> {
        let mut taken = Vec::new();
        self.nums.retain(|id, entry| {
            let hit = take(entry);
            if hit {
                taken.push((TaskId::Num(*id), *entry));
            }
            !hit
        });
        self.texts.retain(|id, entry| {
            let hit = take(entry);
            if hit {
                taken.push((TaskId::Text(id.clone()), *entry));
            }
            !hit
        });
        taken
    }

    /// Every entry `pick` accepts, in no particular order.
    pub fn select(&self, mut pick: impl FnMut(&Entry) -> bool) -> Vec<(TaskId, Entry)> {
        let nums = self
            .nums
            .iter()
            .filter(|e| pick(e.value()))
            .map(|e| (TaskId::Num(*e.key()), *e.value()))
            .collect::<Vec<_>>();
        let texts = self
            .texts
            .iter()
            .filter(|e| pick(e.value()))
            .map(|e| (TaskId::Text(e.key().clone()), *e.value()));
        nums.into_iter().chain(texts).collect()
    }

    pub fn len(&self) -> usize {
        self.nums.len() + self.texts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A numeric task id and its time, as three `u32`s so that it packs into 12 bytes.
#[derive(Clone, Copy, Debug)]
struct QueuedNum([u32; 3]);

impl QueuedNum {
    fn new(id: u64, at: Stamp) -> QueuedNum {
        // Truncation is the point: the id is split into its two halves.
        let (low, high) = (id as u32, (id >> 32) as u32);
        QueuedNum([low, high, u32::from_ne_bytes(at.0.to_ne_bytes())])
    }

    fn id(self) -> u64 {
        u64::from(self.0[0]) | (u64::from(self.0[1]) << 32)
    }

    fn at(self) -> Stamp {
        Stamp(i32::from_ne_bytes(self.0[2].to_ne_bytes()))
    }
}

/// Tasks in the order they were queued, which callers keep equal to time order. Numeric and
/// text ids queue apart and are merged by time when read; ties go to numeric ids.
#[derive(Clone, Default)]
pub struct TaskQueue {
    nums: VecDeque<QueuedNum>,
    texts: VecDeque<(Box<str>, Stamp)>,
}

impl TaskQueue {
    pub fn push_back(&mut self, task: &TaskId, at: Stamp) {
        match task {
            TaskId::Num(n) => self.nums.push_back(QueuedNum::new(*n, at)),
            TaskId::Text(s) => self.texts.push_back((s.clone(), at)),
        }
    }

    /// The oldest entry.
    pub fn front(&self) -> Option<(TaskId, Stamp)> {
        self.iter().next()
    }

    pub fn pop_front(&mut self) -> Option<(TaskId, Stamp)> {
        if num_goes_first(self.nums.front(), self.texts.front()) {
            let num = self.nums.pop_front()?;
            Some((TaskId::Num(num.id()), num.at()))
        } else {
            let (text, at) = self.texts.pop_front()?;
            Some((TaskId::Text(text), at))
        }
    }

    /// Every entry, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = (TaskId, Stamp)> + '_ {
        let mut nums = self.nums.iter().peekable();
        let mut texts = self.texts.iter().peekable();
        std::iter::from_fn(move || {
            if num_goes_first(nums.peek().copied(), texts.peek().copied()) {
                nums.next().map(|num| (TaskId::Num(num.id()), num.at()))
            } else {
                texts
                    .next()
                    .map(|(text, at)| (TaskId::Text(text.clone()), *at))
            }
        })
    }

    pub fn len(&self) -> usize {
        self.nums.len() + self.texts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether the merged order takes the numeric queue's head next: the older head, and on a
/// tie the numeric one.
fn num_goes_first(num: Option<&QueuedNum>, text: Option<&(Box<str>, Stamp)>) -> bool {
    match (num, text) {
        (Some(num), Some((_, text_at))) => num.at() <= *text_at,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> TaskId {
        TaskId::Text(s.into())
    }

    #[test]
    fn entries_are_small() {
        assert_eq!(std::mem::size_of::<Entry>(), 8);
        assert_eq!(std::mem::size_of::<QueuedNum>(), 12);
    }

    #[tokio::test(start_paused = true)]
    async fn stamps_round_up_and_now_rounds_down_both_sides_of_the_epoch() {
        let clock = Clock::new();
        let epoch = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(clock.stamp(epoch), Stamp(0));
        assert_eq!(clock.stamp(epoch + ms(1)), Stamp(1));
        assert_eq!(clock.stamp(epoch + ms(1999)), Stamp(2));
        assert_eq!(clock.floor(epoch + ms(1999)), Stamp(1));
        tokio::time::advance(Duration::from_secs(10)).await;
        let later = Clock::new();
        assert_eq!(later.stamp(epoch + ms(8500)), Stamp(-1));
        assert_eq!(later.floor(epoch + ms(8500)), Stamp(-2));
        assert_eq!(later.stamp(epoch), Stamp(-10));
        assert_eq!(later.instant(Stamp(-10)), epoch);
        assert_eq!(clock.instant(Stamp(3)), epoch + Duration::from_secs(3));
        assert_eq!(clock.age(Stamp(4), Instant::now()), Duration::from_secs(6));
        assert_eq!(clock.age(Stamp(40), Instant::now()), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn an_age_is_never_more_than_the_true_age() {
        let clock = Clock::new();
        let epoch = Instant::now();
        for offset_ms in [-2500_i64, -1000, -1, 0, 1, 999, 1000, 1500] {
            let at = if offset_ms >= 0 {
                epoch + Duration::from_millis(offset_ms.unsigned_abs())
            } else {
                epoch - Duration::from_millis(offset_ms.unsigned_abs())
            };
            let stamp = clock.stamp(at);
            for later_ms in [0_u64, 1, 999, 1000, 1001, 60_000] {
                let now = at + Duration::from_millis(later_ms);
                let age = clock.age(stamp, now);
                let true_age = Duration::from_millis(later_ms);
                assert!(
                    age <= true_age,
                    "{offset_ms} ms, {later_ms} ms later: {age:?}"
                );
                assert!(
                    age + Duration::from_secs(2) > true_age,
                    "{offset_ms} ms, {later_ms} ms later: {age:?}"
                );
            }
        }
    }

    #[test]
    fn numeric_ids_keep_all_64_bits() {
        for id in [0, 1, u64::from(u32::MAX), u64::from(u32::MAX) + 1, u64::MAX] {
            let queued = QueuedNum::new(id, Stamp(-7));
            assert_eq!((queued.id(), queued.at()), (id, Stamp(-7)));
        }
    }

    #[test]
    fn the_map_takes_and_selects_entries_of_both_kinds() {
        let map = TaskMap::default();
        for (n, at) in [(1, 0), (2, 5), (3, 9)] {
            map.insert(
                &TaskId::Num(n),
                Entry {
                    key: KeyId(0),
                    at: Stamp(at),
                    owner: 0,
                },
            );
        }
        map.insert(
            &text("x"),
            Entry {
                key: KeyId(1),
                at: Stamp(1),
                owner: 0,
            },
        );
        let mut selected = map.select(|e| e.at < Stamp(6));
        selected.sort_by_key(|(_, e)| e.at);
        let ids: Vec<String> = selected.iter().map(|(t, _)| t.to_string()).collect();
        assert_eq!(ids, ["1", "x", "2"]);
        assert_eq!(map.len(), 4, "select removes nothing");
        let mut taken = map.take_where(|e| e.at <= Stamp(1));
        taken.sort_by_key(|(_, e)| e.at);
        let ids: Vec<String> = taken.iter().map(|(t, _)| t.to_string()).collect();
        assert_eq!(ids, ["1", "x"]);
        assert_eq!(map.len(), 2);
        assert!(map.get(&text("x")).is_none());
    }

    #[test]
    fn the_map_files_numeric_and_text_ids_apart() {
        let map = TaskMap::default();
        let entry = |key, at| Entry {
            key: KeyId(key),
            at: Stamp(at),
            owner: 0,
        };
        assert_eq!(map.insert(&TaskId::Num(7), entry(1, 0)), None);
        assert_eq!(map.insert(&text("7x"), entry(2, 0)), None);
        assert_eq!(map.insert(&TaskId::Num(7), entry(3, 5)), Some(entry(1, 0)));
        assert_eq!(map.len(), 2);
        assert!(map.holds(&TaskId::Num(7), Stamp(5)));
        assert!(!map.holds(&TaskId::Num(7), Stamp(0)));
        assert_eq!(map.remove_if(&text("7x"), |e| e.at == Stamp(1)), None);
        assert_eq!(
            map.remove_if(&text("7x"), |e| e.at == Stamp(0)),
            Some(entry(2, 0))
        );
        assert_eq!(map.remove(&TaskId::Num(7)), Some(entry(3, 5)));
        assert!(map.is_empty());
    }

    #[test]
    fn the_queue_merges_numeric_and_text_ids_by_time() {
        let mut queue = TaskQueue::default();
        queue.push_back(&TaskId::Num(1), Stamp(0));
        queue.push_back(&text("a"), Stamp(1));
        queue.push_back(&TaskId::Num(2), Stamp(1));
        queue.push_back(&TaskId::Num(3), Stamp(2));
        queue.push_back(&text("b"), Stamp(3));
        let order = |queue: &TaskQueue| -> Vec<String> {
            queue.iter().map(|(task, _)| task.to_string()).collect()
        };
        assert_eq!(order(&queue), ["1", "2", "a", "3", "b"]);
        assert_eq!(queue.front(), Some((TaskId::Num(1), Stamp(0))));
        let mut popped = Vec::new();
        while let Some((task, at)) = queue.pop_front() {
            popped.push((task.to_string(), at.0));
        }
        let expected =
            [("1", 0), ("2", 1), ("a", 1), ("3", 2), ("b", 3)].map(|(t, a)| (t.to_owned(), a));
        assert_eq!(popped, expected);
        assert!(queue.is_empty());
    }
}

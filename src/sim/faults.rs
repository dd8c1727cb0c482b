//! Injected failures: what a fault is, and the book that decides which request gets one.
//! Knows nothing of HTTP; the endpoint code acts on the [`FaultKind`] it is handed.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

/// Which endpoints a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultTarget {
    /// `in.php` and `solve.php`.
    Submit,
    /// `res.php` (every action).
    Poll,
    /// All three endpoints.
    Any,
}

/// What the simulator does instead of (or before) answering normally.
#[derive(Clone, Debug)]
pub enum FaultKind {
    /// Answer this HTTP status with its reason phrase as body (502 → "Bad Gateway").
    /// Codes that cannot be a final HTTP status (1xx, or outside 100..=999) answer 500.
    Status(u16),
    /// Wait, then behave normally. Uses tokio time, so paused-time tests control it.
    Delay(Duration),
    /// Close the connection without any answer, after reading the request.
    Reset,
    /// Wait until the test releases the gate (`notify_one`, or `notify_waiters` for every
    /// request held), then behave normally: a request held in flight for exactly as long as
    /// the test wants, with no clock involved.
    Hold(Arc<Notify>),
    /// Answer this error code in the caller's format (plain or JSON) with HTTP 200.
    Code(String),
}

/// One injected failure: where it applies, what it does, and how often.
#[derive(Clone, Debug)]
pub struct Fault {
    /// Endpoints it applies to.
    pub target: FaultTarget,
    /// What happens.
    pub kind: FaultKind,
    /// How many requests it hits; `None` = until cleared.
    pub times: Option<u32>,
}

/// Key scope that matches every request, whatever key it carries (or none).
pub(crate) const EVERY_KEY: &str = "*";

/// Faults in the order they were added. The first one that matches a request fires, and a
/// request gets at most one fault: tests reason about "the next N submits" more easily when
/// faults never stack.
#[derive(Default)]
pub(crate) struct FaultBook {
    entries: Vec<(String, Fault)>,
}

impl FaultBook {
    /// Adds a fault for `scope`, a key value or [`EVERY_KEY`].
    pub(crate) fn add(&mut self, scope: &str, fault: Fault) {
        self.entries.push((scope.to_owned(), fault));
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
    }

    /// The fault this request triggers, if any; consumes one of its `times`.
    pub(crate) fn take(&mut self, key: Option<&str>, target: FaultTarget) -> Option<FaultKind> {
        // A fault added with `times: Some(0)` can never fire; drop it so it cannot shadow others.
        self.entries.retain(|(_, fault)| fault.times != Some(0));
        let index = self.entries.iter().position(|(scope, fault)| {
            let key_matches = scope == EVERY_KEY || Some(scope.as_str()) == key;
            let target_matches = fault.target == FaultTarget::Any || fault.target == target;
            key_matches && target_matches
        })?;
        let fault = &mut self.entries[index].1;
        let kind = fault.kind.clone();
        if let Some(left) = fault.times.as_mut() {
            *left -= 1;
            if *left == 0 {
                self.entries.remove(index);
            }
        }
        Some(kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(target: FaultTarget, code: &str, times: Option<u32>) -> Fault {
        Fault {
            target,
            kind: FaultKind::Code(code.to_owned()),
            times,
        }
    }

    fn fired(kind: Option<FaultKind>) -> Option<String> {
        match kind {
            Some(FaultKind::Code(code)) => Some(code),
            Some(other) => Some(format!("{other:?}")),
            None => None,
        }
    }

    #[test]
    fn times_are_consumed_then_the_fault_is_gone() {
        let mut book = FaultBook::default();
        book.add("k1", code(FaultTarget::Submit, "E1", Some(2)));
        assert_eq!(
            fired(book.take(Some("k1"), FaultTarget::Submit)).as_deref(),
            Some("E1")
        );
        assert_eq!(
            fired(book.take(Some("k1"), FaultTarget::Submit)).as_deref(),
            Some("E1")
        );
        assert_eq!(fired(book.take(Some("k1"), FaultTarget::Submit)), None);
    }

    #[test]
    fn scope_and_target_must_both_match() {
        let mut book = FaultBook::default();
        book.add("k1", code(FaultTarget::Poll, "E1", None));
        assert_eq!(fired(book.take(Some("k2"), FaultTarget::Poll)), None);
        assert_eq!(fired(book.take(Some("k1"), FaultTarget::Submit)), None);
        assert_eq!(fired(book.take(None, FaultTarget::Poll)), None);
        assert_eq!(
            fired(book.take(Some("k1"), FaultTarget::Poll)).as_deref(),
            Some("E1")
        );
        // `None` times: still there.
        assert_eq!(
            fired(book.take(Some("k1"), FaultTarget::Poll)).as_deref(),
            Some("E1")
        );
    }

    #[test]
    fn wildcard_matches_any_key_and_first_added_wins() {
        let mut book = FaultBook::default();
        book.add("*", code(FaultTarget::Any, "FIRST", Some(1)));
        book.add("k1", code(FaultTarget::Submit, "SECOND", None));
        assert_eq!(
            fired(book.take(None, FaultTarget::Submit)).as_deref(),
            Some("FIRST")
        );
        assert_eq!(
            fired(book.take(Some("k1"), FaultTarget::Submit)).as_deref(),
            Some("SECOND")
        );
        book.clear();
        assert_eq!(fired(book.take(Some("k1"), FaultTarget::Submit)), None);
    }

    #[test]
    fn zero_times_never_fires_nor_shadows() {
        let mut book = FaultBook::default();
        book.add("*", code(FaultTarget::Any, "NEVER", Some(0)));
        book.add("*", code(FaultTarget::Any, "LATER", Some(1)));
        assert_eq!(
            fired(book.take(Some("k"), FaultTarget::Poll)).as_deref(),
            Some("LATER")
        );
        assert_eq!(fired(book.take(Some("k"), FaultTarget::Poll)), None);
    }
}

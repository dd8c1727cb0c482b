//! Bounds on the log lines a caller can cause: [`Clip`] cuts a caller's text (a path, a
//! host, a value) to a fixed length and notes how long it was, and [`Throttle`] lets one
//! line of a kind (and, for keyed kinds, of one key such as a destination) through per
//! interval, counting the ones it held back so the next line can say how many. A caller
//! who repeats a refused request a million times then costs the log one line a minute.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// The longest piece of a caller's text a log line carries.
pub const MAX_LOGGED: usize = 128;

/// How often one kind (or one key of a kind) may log.
pub const INTERVAL: Duration = Duration::from_secs(60);

/// Keys a keyed throttle remembers: past it, keys share one slot, so a caller who varies
/// the key (a destination, a path) still costs one line an interval, not one per key.
const MAX_KEYS: usize = 1024;

/// A caller's text for a log line: at most [`MAX_LOGGED`] bytes (cut at a character
/// boundary), followed by `…(N bytes)` when it was longer, and with control characters
/// escaped, so it cannot forge a line of its own.
pub struct Clip<'a>(pub &'a str);

impl fmt::Display for Clip<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.0;
        let mut end = text.len().min(MAX_LOGGED);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        for c in text[..end].chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                f.write_str(c.encode_utf8(&mut [0; 4]))?;
            }
        }
        if end < text.len() {
            write!(f, "…({} bytes)", text.len())?;
        }
        Ok(())
    }
}

impl fmt::Debug for Clip<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

/// One interval's worth of lines per key.
#[derive(Debug)]
pub struct Throttle {
    interval: Duration,
    slots: Mutex<Option<HashMap<Box<str>, Slot>>>,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    last: Instant,
    suppressed: u64,
}

/// A line the throttle let through, with how many of its kind it held back since the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    pub suppressed: u64,
}

impl Throttle {
    /// A throttle of one line per `interval` per key; `const`, so each call site can keep
    /// one in a `static`.
    pub const fn new(interval: Duration) -> Throttle {
        Throttle {
            interval,
            slots: Mutex::new(None),
        }
    }

    /// Whether a line of the kind alone (no key) may be logged now.
    pub fn admit(&self) -> Option<Admitted> {
        self.admit_key("")
    }

    /// Whether a line for `key` may be logged now; `None` means hold it back (it is
    /// counted for the next one).
    pub fn admit_key(&self, key: &str) -> Option<Admitted> {
        let now = Instant::now();
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let slots = slots.get_or_insert_with(HashMap::new);
        if !slots.contains_key(key) && slots.len() >= MAX_KEYS {
            slots.retain(|_, slot| now.saturating_duration_since(slot.last) < self.interval);
        }
        // Keys past the bound share the empty key's slot.
        let key = if slots.contains_key(key) || slots.len() < MAX_KEYS {
            key
        } else {
            ""
        };
        match slots.get_mut(key) {
            Some(slot) if now.saturating_duration_since(slot.last) < self.interval => {
                slot.suppressed = slot.suppressed.saturating_add(1);
                None
            }
            Some(slot) => {
                let suppressed = std::mem::take(&mut slot.suppressed);
                slot.last = now;
                Some(Admitted { suppressed })
            }
            None => {
                slots.insert(
                    key.into(),
                    Slot {
                        last: now,
                        suppressed: 0,
                    },
                );
                Some(Admitted { suppressed: 0 })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_shown_whole_and_long_text_cut_with_its_length() {
        assert_eq!(Clip("/admin/keys").to_string(), "/admin/keys");
        let long = "a".repeat(60_000);
        let shown = Clip(&long).to_string();
        assert_eq!(shown, format!("{}…(60000 bytes)", "a".repeat(MAX_LOGGED)));
        // Cut at a character boundary, never inside one.
        let wide = "é".repeat(100);
        let shown = Clip(&wide).to_string();
        assert!(shown.starts_with(&"é".repeat(MAX_LOGGED / 2)), "{shown}");
        assert!(shown.ends_with("…(200 bytes)"), "{shown}");
    }

    #[test]
    fn control_characters_cannot_forge_a_line() {
        let shown = Clip("/x\nlevel=ERROR forged\r\u{1b}[31m").to_string();
        assert!(!shown.contains('\n') && !shown.contains('\r') && !shown.contains('\u{1b}'));
        assert!(shown.contains("\\n"), "{shown}");
    }

    #[tokio::test(start_paused = true)]
    async fn one_line_per_interval_per_key_and_the_rest_counted() {
        let throttle = Throttle::new(INTERVAL);
        assert_eq!(throttle.admit_key("a"), Some(Admitted { suppressed: 0 }));
        for _ in 0..5 {
            assert_eq!(throttle.admit_key("a"), None);
        }
        assert_eq!(
            throttle.admit_key("b"),
            Some(Admitted { suppressed: 0 }),
            "b is not a"
        );
        tokio::time::advance(INTERVAL - Duration::from_millis(1)).await;
        assert_eq!(throttle.admit_key("a"), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(throttle.admit_key("a"), Some(Admitted { suppressed: 6 }));
        assert_eq!(throttle.admit_key("a"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn many_keys_share_one_slot_past_the_bound() {
        let throttle = Throttle::new(INTERVAL);
        let admitted = (0..MAX_KEYS * 3)
            .filter(|n| throttle.admit_key(&n.to_string()).is_some())
            .count();
        // Every remembered key once, then the shared slot once.
        assert_eq!(admitted, MAX_KEYS + 1);
        tokio::time::advance(INTERVAL).await;
        // The expired keys make room again.
        assert!(throttle.admit_key("new").is_some());
    }
}

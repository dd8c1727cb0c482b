//! Durations in the config: humantime strings with a unit, checked against a range, every
//! problem named by its field. A leaf shared by every table's validation.

use std::time::Duration;

use toml::Value;

use super::problems::{a_type, Problems};
use super::redact::quoted;

/// Longest duration any setting accepts. Far beyond every sensible value, and near enough
/// that adding it to an `Instant` can never overflow.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Whether a zero duration means something for a setting, or is a mistake.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Zero {
    Allowed,
    Rejected,
}

/// A humantime string such as `"30s"` or `"1h 30m"`. Bare integers are refused: a number
/// without a unit is ambiguous (seconds? milliseconds?), and guessing wrong is silent.
pub(super) fn duration(
    p: &mut Problems,
    field: &str,
    raw: Option<Value>,
    default: Duration,
    zero: Zero,
) -> Duration {
    let text = match raw {
        None => return default,
        Some(Value::String(text)) => text,
        Some(Value::Integer(n)) => {
            p.add(
                field,
                format!(
                    "write durations as a string with a unit, e.g. \"30s\" (got the integer {n})"
                ),
            );
            return default;
        }
        Some(other) => {
            p.add(
                field,
                format!("must be a duration such as \"30s\", got {}", a_type(&other)),
            );
            return default;
        }
    };
    match humantime::parse_duration(&text) {
        // humantime's message for an unknown unit quotes the unit, so it is shown only when
        // the text may be quoted whole; its other messages give a position.
        Err(e) => match (quoted(&text), &e) {
            (shown, _) if shown.starts_with('"') => {
                p.add(field, format!("invalid duration {shown}: {e}"))
            }
            (shown, humantime::DurationError::UnknownUnit { start, end, .. }) => p.add(
                field,
                format!(
                    "invalid duration, {shown}: unknown time unit at bytes {start}..{end}; use ns, us, ms, s, m, h, d"
                ),
            ),
            (shown, _) => p.add(field, format!("invalid duration, {shown}: {e}")),
        },
        Ok(d) if d.is_zero() && zero == Zero::Rejected => p.add(field, "must be greater than 0"),
        Ok(d) if d > MAX_DURATION => p.add(
            field,
            format!(
                "must be at most 365days, got {}",
                humantime::format_duration(d)
            ),
        ),
        Ok(d) => return d,
    }
    default
}

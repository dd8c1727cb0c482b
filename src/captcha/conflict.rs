//! Leaf: [`Conflict`], what a strict reading of a request refuses. A param keyrelay decides
//! on must have one value however the caller spelled and placed it, or keyrelay would check
//! one value while the service, reading its own way, acted on another.

use std::fmt;

/// Why a request's decision params cannot be read as one value each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conflict {
    /// Spellings of the param `name` (in the query, the body, or both) carry different
    /// values.
    Values { name: &'static str },
    /// Two params that name the same thing in different ways were both given (`id` and
    /// `ids`): which of them the service reads is its own choice.
    Both {
        one: &'static str,
        other: &'static str,
    },
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Conflict::Values { name } => write!(
                f,
                "the request gives {name} more than one value (spellings or places of the same name); send it once"
            ),
            Conflict::Both { one, other } => {
                write!(f, "the request gives both {one} and {other}; send one of them")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_conflict_names_its_params() {
        let values = Conflict::Values { name: "id" }.to_string();
        assert!(values.contains("id more than one value"), "{values}");
        let both = Conflict::Both {
            one: "id",
            other: "ids",
        }
        .to_string();
        assert!(both.contains("both id and ids"), "{both}");
    }
}

//! Secret API keys and caller tokens, and the names that stand in for them in logs, metrics
//! and answers.
//!
//! An [`ApiKey`] never prints its value: `Debug` and `Display` show only a short
//! fingerprint. The one way to read the secret is [`ApiKey::expose`], which is called
//! where a request is rewritten for the upstream and nowhere else. A [`CallerToken`], the
//! secret a caller presents to keyrelay in place of an API key, redacts itself the same way.

use std::fmt;

/// Keys shorter than this show no characters at all in their fingerprint, because four
/// characters of a short key would be too large a share of the secret.
const MIN_LEN_FOR_FINGERPRINT: usize = 12;

/// A captcha-service API key. Redacts itself everywhere it could be printed.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ApiKey(Box<str>);

impl ApiKey {
    /// Wraps a key value. Surrounding whitespace is trimmed, as keys pasted from a
    /// dashboard or an environment file often carry a trailing newline.
    pub fn new(value: impl AsRef<str>) -> ApiKey {
        ApiKey(value.as_ref().trim().into())
    }

    /// The secret itself. Call only to put the key on the wire.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// A short, non-secret tag for the key: its last four characters, for example `…f3a9`.
    pub fn fingerprint(&self) -> String {
        let chars: Vec<char> = self.0.chars().collect();
        if chars.len() < MIN_LEN_FOR_FINGERPRINT {
            return "…".to_owned();
        }
        let tail: String = chars[chars.len() - 4..].iter().collect();
        format!("…{tail}")
    }

    /// The label a key gets when its `[[keys]]` entry has no `name`: its first eight
    /// characters, as the configuration reference promises. Keys too short for that to be
    /// safe get `None`, and the config names them by position instead.
    pub fn default_name(&self) -> Option<String> {
        if self.0.chars().count() < 2 * MIN_LEN_FOR_FINGERPRINT {
            return None;
        }
        Some(self.0.chars().take(8).collect())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApiKey({})", self.fingerprint())
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.fingerprint())
    }
}

/// A secret that callers (`[[access.tokens]]`) or operators (`[admin] token`) present to
/// keyrelay. Redacts itself like an [`ApiKey`]; read it only to compare it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct CallerToken(ApiKey);

impl CallerToken {
    /// Wraps a token value, trimmed as keys are.
    pub fn new(value: impl AsRef<str>) -> CallerToken {
        CallerToken(ApiKey::new(value))
    }

    /// The secret itself, for comparing with what a caller sent.
    pub fn expose(&self) -> &str {
        self.0.expose()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for CallerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CallerToken({})", self.0.fingerprint())
    }
}

impl fmt::Display for CallerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.fingerprint())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_redact_themselves_like_keys() {
        let token = CallerToken::new(format!("{SECRET}\n"));
        for shown in [
            format!("{token:?}"),
            format!("{token}"),
            format!("{:?}", [&token]),
        ] {
            assert!(!shown.contains("0123456789abcdef"), "{shown}");
        }
        assert_eq!(format!("{token:?}"), "CallerToken(…f3a9)");
        assert_eq!(token.expose(), SECRET);
    }

    const SECRET: &str = "0123456789abcdef0123456789abf3a9";

    #[test]
    fn debug_and_display_never_show_the_secret() {
        let key = ApiKey::new(SECRET);
        let debug = format!("{key:?}");
        let display = format!("{key}");
        let nested = format!("{:?}", Some(vec![key.clone()]));
        for shown in [&debug, &display, &nested] {
            assert!(!shown.contains(SECRET), "{shown}");
            assert!(!shown.contains("0123456789abcdef"), "{shown}");
        }
        assert_eq!(debug, "ApiKey(…f3a9)");
        assert_eq!(display, "…f3a9");
    }

    #[test]
    fn expose_returns_the_trimmed_secret() {
        assert_eq!(ApiKey::new(format!(" {SECRET}\n")).expose(), SECRET);
    }

    #[test]
    fn short_keys_show_nothing() {
        let key = ApiKey::new("abc123");
        assert_eq!(key.fingerprint(), "…");
        assert_eq!(key.default_name(), None);
        assert!(!format!("{key:?}").contains("abc"));
    }

    #[test]
    fn default_name_is_the_first_eight_characters() {
        assert_eq!(
            ApiKey::new(SECRET).default_name().as_deref(),
            Some("01234567")
        );
    }
}

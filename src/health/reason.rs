//! Why a key is out of rotation, or why an upstream answer failed: one closed set, each
//! reason with the one label that status JSON, metrics, logs and the cluster's Redis use.
//! Knows the service's codes through `captcha::ServiceCode`; does not decide what a code
//! means for a key (that is `captcha::classify` and `failover`).

use std::fmt;

use crate::captcha::ServiceCode;

/// A failure reason. The labels are a wire format: replicas of different versions read
/// each other's from Redis, so a label, once written, keeps its spelling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// An error code of the service's that the outcome table knows.
    Service(ServiceCode),
    /// An error code the outcome table does not know (a provider's own, or a new one): one
    /// label for all, so an upstream cannot grow label sets without bound.
    OtherCode,
    /// HTTP 429: the service's rate limit.
    Http429,
    /// Another 5xx status.
    Http5xx,
    /// Any other status outside 2xx.
    HttpError,
    /// A 2xx body no API answer looks like.
    BadAnswer,
    /// A run of transient failures cooled the key.
    Transient,
    /// Another replica's reason that this one cannot read: written by a newer version.
    Fleet,
}

impl Reason {
    /// Every reason but the service's codes, whose labels are their own spelling.
    const NAMED: [Reason; 7] = [
        Reason::OtherCode,
        Reason::Http429,
        Reason::Http5xx,
        Reason::HttpError,
        Reason::BadAnswer,
        Reason::Transient,
        Reason::Fleet,
    ];

    /// The reason for an error code the upstream answered: the code itself when the
    /// outcome table knows it, else [`Reason::OtherCode`].
    pub fn of_code(code: &str) -> Reason {
        ServiceCode::known(code).map_or(Reason::OtherCode, Reason::Service)
    }

    /// Status JSON, metric label, log field and the cluster's shared health.
    pub fn label(self) -> &'static str {
        match self {
            Reason::Service(code) => code.as_str(),
            Reason::OtherCode => "other",
            Reason::Http429 => "http_429",
            Reason::Http5xx => "http_5xx",
            Reason::HttpError => "http_error",
            Reason::BadAnswer => "bad_answer",
            Reason::Transient => "transient",
            Reason::Fleet => "fleet",
        }
    }

    /// The reason a [`label`](Reason::label) names; `None` for a label this version does
    /// not write.
    pub fn parse(label: &str) -> Option<Reason> {
        ServiceCode::known(label)
            .map(Reason::Service)
            .or_else(|| Reason::NAMED.into_iter().find(|r| r.label() == label))
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_label_parses_back_to_its_reason() {
        let codes = [
            "ERROR_KEY_DOES_NOT_EXIST",
            "MAX_USER_TURN",
            "IP_BANNED",
            "ERROR: 1001",
        ]
        .map(|code| Reason::Service(ServiceCode::known(code).expect("a known code")));
        for reason in Reason::NAMED.into_iter().chain(codes) {
            assert_eq!(Reason::parse(reason.label()), Some(reason), "{reason}");
        }
    }

    #[test]
    fn labels_keep_their_wire_spelling() {
        let labels = Reason::NAMED.map(Reason::label);
        assert_eq!(
            labels,
            [
                "other",
                "http_429",
                "http_5xx",
                "http_error",
                "bad_answer",
                "transient",
                "fleet"
            ]
        );
        assert_eq!(
            Reason::of_code("ERROR_ZERO_BALANCE").label(),
            "ERROR_ZERO_BALANCE"
        );
    }

    #[test]
    fn unknown_codes_and_labels_stay_a_closed_set() {
        assert_eq!(Reason::of_code("ERROR_SOMETHING_NEW"), Reason::OtherCode);
        // What a newer replica might write: not read as anything this one knows.
        assert_eq!(Reason::parse("ERROR_SOMETHING_NEW"), None);
        assert_eq!(Reason::parse("quota_exceeded"), None);
        assert_eq!(Reason::parse(""), None);
        assert_eq!(Reason::parse("error_key_does_not_exist"), None);
    }
}

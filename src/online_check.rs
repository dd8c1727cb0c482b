//! `keyrelay check --online`: asks the upstream about every configured key (balance and
//! threads, read concurrently with keyrelay's own account reads), judges each key as the
//! refresh would, and renders a table that names keys by fingerprint, never by value.

use std::fmt::Write as _;

use futures_util::future::join_all;

use crate::captcha::ThreadsInfo;
use crate::config::{Config, KeyConfig};
use crate::failover::ReadError;
use crate::health::Reason;
use crate::upstream::{Account, UpstreamClient};

/// Fewer usable keys than this fails the check: the threshold of the
/// `KeyrelayFewerThanTwoKeysActive` alert, since one key left means no failover.
pub const MIN_USABLE: usize = 2;

/// What the upstream said about one key.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// A balance above `min_balance`, and threads if the service reports them.
    Usable,
    /// The service rejected the key with this code (`ERROR_KEY_DOES_NOT_EXIST` and kin).
    Rejected(Reason),
    /// Accepted, but the balance is at or below `failover.min_balance`.
    Empty,
    /// Accepted with a balance, but the plan has no threads.
    NoThreads,
    /// No usable answer within the timeouts.
    NoAnswer,
}

impl Verdict {
    fn label(&self) -> &'static str {
        match self {
            Verdict::Usable => "usable",
            Verdict::Rejected(code) => code.label(),
            Verdict::Empty => "empty",
            Verdict::NoThreads => "no threads",
            Verdict::NoAnswer => "no answer",
        }
    }
}

/// One key's row.
#[derive(Clone, Debug)]
pub struct KeyReport {
    pub name: String,
    pub fingerprint: String,
    pub verdict: Verdict,
    pub balance: Option<f64>,
    pub threads: Option<ThreadsInfo>,
}

/// Every key's row, in config order.
#[derive(Clone, Debug)]
pub struct Report {
    pub rows: Vec<KeyReport>,
}

/// Why the check could not judge the pool at all.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("cannot build the upstream client: {0}")]
    Client(#[from] rustls::Error),
    #[error(transparent)]
    UpstreamCa(#[from] crate::upstream::roots::RootsError),
    #[error(
        "no key got an answer from the upstream {upstream} within timeouts.connect / \
         timeouts.refresh: is it reachable from here, and is `upstream` right?"
    )]
    Unreachable { upstream: String },
}

impl Report {
    pub fn usable(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| r.verdict == Verdict::Usable)
            .count()
    }

    /// Whether the pool can fail over: at least [`MIN_USABLE`] usable keys.
    pub fn passes(&self) -> bool {
        self.usable() >= MIN_USABLE
    }

    /// The table, then one line that says whether the pool passes.
    pub fn render(&self) -> String {
        let mut text = String::new();
        let name_width = self
            .rows
            .iter()
            .map(|r| r.name.len())
            .chain(std::iter::once(4))
            .max()
            .unwrap_or(4);
        let _ = writeln!(
            text,
            "{:<name_width$}  {:<12}  {:<24}  {:>10}  THREADS",
            "NAME", "FINGERPRINT", "STATE", "BALANCE"
        );
        for row in &self.rows {
            let balance = row
                .balance
                .map_or_else(|| "-".to_owned(), |b| format!("{b:.2}"));
            let threads = row.threads.map_or_else(
                || "-".to_owned(),
                |t| format!("{}/{} working", t.working_threads, t.threads),
            );
            let _ = writeln!(
                text,
                "{:<name_width$}  {:<12}  {:<24}  {balance:>10}  {threads}",
                row.name,
                row.fingerprint,
                row.verdict.label()
            );
        }
        let _ = writeln!(
            text,
            "{} of {} keys usable ({} needed for failover)",
            self.usable(),
            self.rows.len(),
            MIN_USABLE
        );
        text
    }
}

/// Reads every key's balance and threads, all keys at once, each read bounded by
/// `timeouts.refresh` (and the connect by `timeouts.connect`).
///
/// # Errors
/// [`CheckError::Unreachable`] when no key got any answer: that says nothing about the
/// keys, only about the way to the upstream.
pub async fn run(config: &Config) -> Result<Report, CheckError> {
    let roots = crate::upstream::roots::configured(config.upstream_ca.as_deref())?;
    let client = UpstreamClient::new(
        config.timeouts.connect,
        roots,
        config.upstream_proxy.as_ref(),
    )?;
    let rows = join_all(
        config
            .keys
            .iter()
            .map(|key| check_key(&client, config, key)),
    )
    .await;
    if !rows.is_empty() && rows.iter().all(|r| r.verdict == Verdict::NoAnswer) {
        return Err(CheckError::Unreachable {
            upstream: config.upstream.to_string(),
        });
    }
    Ok(Report { rows })
}

async fn check_key(client: &UpstreamClient, config: &Config, key: &KeyConfig) -> KeyReport {
    let account = Account {
        name: &key.name,
        key: &key.key,
        upstream: &key.upstream,
        profile: crate::captcha::Profile::of(key.provider),
    };
    let timeout = config.timeouts.refresh;
    let (balance, threads) = tokio::join!(
        client.read_balance(account, timeout),
        client.read_threads(account, timeout)
    );
    let threads = threads.ok();
    let (verdict, balance) = match balance {
        Err(ReadError::KeyRejected(code)) => (Verdict::Rejected(code), None),
        Err(ReadError::Unavailable) => (Verdict::NoAnswer, None),
        Ok(balance) => (
            judge(balance, threads, config.failover.min_balance),
            Some(balance),
        ),
    };
    KeyReport {
        name: key.name.clone(),
        fingerprint: key.key.fingerprint(),
        verdict,
        balance,
        threads,
    }
}

/// The refresh's test of a usable key (`failover::on_refresh`): a balance above
/// `min_balance`, and threads where the service reports them.
fn judge(balance: f64, threads: Option<ThreadsInfo>, min_balance: f64) -> Verdict {
    if balance <= min_balance {
        Verdict::Empty
    } else if threads.is_some_and(|t| t.threads == 0) {
        Verdict::NoThreads
    } else {
        Verdict::Usable
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, verdict: Verdict) -> KeyReport {
        KeyReport {
            name: name.to_owned(),
            fingerprint: "abcd…wxyz".to_owned(),
            verdict,
            balance: Some(1.5),
            threads: Some(ThreadsInfo {
                threads: 5,
                working_threads: 1,
            }),
        }
    }

    #[test]
    fn judge_follows_the_refresh() {
        let five = Some(ThreadsInfo {
            threads: 5,
            working_threads: 0,
        });
        let none = Some(ThreadsInfo {
            threads: 0,
            working_threads: 0,
        });
        assert_eq!(judge(3.0, five, 0.0), Verdict::Usable);
        assert_eq!(judge(3.0, None, 0.0), Verdict::Usable);
        assert_eq!(judge(0.0, five, 0.0), Verdict::Empty);
        assert_eq!(judge(0.5, five, 1.0), Verdict::Empty);
        assert_eq!(judge(3.0, none, 0.0), Verdict::NoThreads);
    }

    #[test]
    fn two_usable_keys_pass_and_one_does_not() {
        let one = Report {
            rows: vec![
                row("a", Verdict::Usable),
                row(
                    "b",
                    Verdict::Rejected(Reason::of_code("ERROR_WRONG_USER_KEY")),
                ),
            ],
        };
        assert!(!one.passes());
        let text = one.render();
        assert!(text.contains("ERROR_WRONG_USER_KEY"), "{text}");
        assert!(text.contains("1 of 2 keys usable"), "{text}");
        let two = Report {
            rows: vec![row("a", Verdict::Usable), row("b", Verdict::Usable)],
        };
        assert!(two.passes());
    }
}

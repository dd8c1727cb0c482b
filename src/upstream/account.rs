//! keyrelay's own account reads with a key, `getbalance` and `threadsinfo`: requests built
//! from nothing of a caller's, so what the service answers to them is keyrelay's evidence
//! about the key (`failover::ReadError`).

use std::time::Duration;

use bytes::Bytes;
use hyper::header::HeaderMap;
use hyper::Method;

use super::{Outgoing, UpstreamAnswer, UpstreamClient};
use crate::api_key::ApiKey;
use crate::captcha::{self, Outcome, Profile, Reply, ThreadsInfo};
use crate::config::Upstream;
use crate::failover::ReadError;
use crate::health::Reason;

/// The key an account read is made with, where it goes, and the name it is logged under.
#[derive(Clone, Copy)]
pub struct Account<'a> {
    pub name: &'a str,
    pub key: &'a ApiKey,
    pub upstream: &'a Upstream,
    /// What the key's service's answers mean.
    pub profile: &'static Profile,
}

impl UpstreamClient {
    /// Reads the account's balance with `getbalance`.
    ///
    /// # Errors
    /// [`ReadError::KeyRejected`] when the service rejects the key, else `Unavailable`.
    pub async fn read_balance(
        &self,
        account: Account<'_>,
        timeout: Duration,
    ) -> Result<f64, ReadError> {
        let answer = self.account_read(account, "getbalance", timeout).await?;
        captcha::parse_balance(&answer.body).ok_or(ReadError::Unavailable)
    }

    /// Reads the account's thread usage with `threadsinfo`, where the key's service has
    /// that action (CaptchaAI's own); elsewhere nothing is asked and there is no figure.
    ///
    /// # Errors
    /// As [`UpstreamClient::read_balance`]; `Unavailable` at once where the service has no
    /// `threadsinfo`.
    pub async fn read_threads(
        &self,
        account: Account<'_>,
        timeout: Duration,
    ) -> Result<ThreadsInfo, ReadError> {
        if !account.profile.threadsinfo {
            return Err(ReadError::Unavailable);
        }
        let answer = self.account_read(account, "threadsinfo", timeout).await?;
        captcha::parse_threads(&answer.body).ok_or(ReadError::Unavailable)
    }

    async fn account_read(
        &self,
        account: Account<'_>,
        action: &str,
        timeout: Duration,
    ) -> Result<UpstreamAnswer, ReadError> {
        let query = serde_urlencoded::to_string([
            ("key", account.key.expose()),
            ("action", action),
            ("json", "1"),
        ])
        .expect("string pairs always encode");
        let headers = HeaderMap::new();
        // serde_urlencoded's output is always a valid query.
        let uri = account
            .upstream
            .endpoint("/res.php", &query)
            .map_err(|_| ReadError::Unavailable)?;
        let result = self
            .send(Outgoing {
                method: Method::GET,
                uri,
                headers: &headers,
                body: Bytes::new(),
                timeout,
            })
            .await;
        let answer = match result {
            Ok(answer) => answer,
            Err(e) => {
                tracing::debug!(key = %account.name, action, error = %e, "account read failed");
                return Err(ReadError::Unavailable);
            }
        };
        let reply = captcha::parse_reply(&answer.body);
        match (
            account.profile.classify(answer.status.as_u16(), &reply),
            &reply,
        ) {
            (Outcome::KeyUnusable, Reply::Error(code)) => {
                Err(ReadError::KeyRejected(Reason::of_code(code)))
            }
            (Outcome::Success, _) => Ok(answer),
            _ => Err(ReadError::Unavailable),
        }
    }
}

//! The closed sets of label values every labelled metric takes: each an enum whose `ALL` and
//! `label` come from one list (`label_set!`), so `Metrics` can start every series at 0.

use crate::captcha::Outcome;

/// A closed set of label values: the enum, its `ALL` and its `label` come from one list, so a
/// value added here is also one that [`Metrics`](super::Metrics) starts at 0 (Prometheus's instrumentation
/// practice: a series that appears only on its first event reads as "no data" to `rate()`
/// and to alerts until then).
macro_rules! label_set {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $label:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The metric label.
            pub const fn label(self) -> &'static str {
                match self {
                    $($name::$variant => $label),+
                }
            }
        }
    };
}

label_set! {
    /// The `outcome` of `keyrelay_key_submits_total`: the five classes operators alert on.
    SubmitOutcome {
        Ok => "ok",
        KeyUnusable => "key_unusable",
        KeyFull => "key_full",
        CallerError => "caller_error",
        Transient => "transient",
    }
}

label_set! {
    /// How a caller's request ended: the `outcome` of `keyrelay_request_duration_seconds`.
    /// The first seven are the class of the upstream answer that was relayed; the rest are
    /// keyrelay's own endings (`proxy::Local::outcome`).
    RequestOutcome {
        Success => "success",
        KeyUnusable => "key_unusable",
        ZeroBalance => "zero_balance",
        KeyFull => "key_full",
        IpBanned => "ip_banned",
        Transient => "transient",
        CallerError => "caller_error",
        /// A request keyrelay refused to forward: unreadable, too large, not a task id.
        BadRequest => "bad_request",
        UnknownTask => "unknown_task",
        /// The upstream did not answer, or no key could settle an unpinned task.
        UpstreamFailed => "upstream_failed",
        /// An unpinned task while the probe budget is spent.
        ProbeBudget => "probe_budget",
        /// Every key tried was busy.
        PoolBusy => "pool_busy",
        /// No key in rotation.
        PoolExhausted => "pool_exhausted",
        /// Every key's threads in use, and the wait for one refused.
        PoolFull => "pool_full",
        /// The handler panicked.
        InternalError => "internal_error",
        /// No caller token, or a wrong one, while tokens are configured.
        Denied => "denied",
        /// The caller token's budget is spent: the submit was not sent upstream.
        BudgetSpent => "budget_spent",
    }
}

impl RequestOutcome {
    /// A relayed upstream answer's outcome: its class.
    pub fn relayed(outcome: Outcome) -> RequestOutcome {
        match outcome {
            Outcome::Success => RequestOutcome::Success,
            Outcome::KeyUnusable => RequestOutcome::KeyUnusable,
            Outcome::ZeroBalance => RequestOutcome::ZeroBalance,
            Outcome::KeyFull => RequestOutcome::KeyFull,
            Outcome::IpBanned => RequestOutcome::IpBanned,
            Outcome::Transient => RequestOutcome::Transient,
            Outcome::CallerError => RequestOutcome::CallerError,
        }
    }
}

label_set! {
    /// The codes of answers keyrelay makes itself: the `code` of
    /// `keyrelay_local_answers_total`. Each is the service's own, so clients act on it as
    /// they would on the service's answer.
    LocalCode {
        TooBig => "ERROR_TOO_BIG_CAPTCHA_FILESIZE",
        BadParameters => "ERROR_BAD_PARAMETERS",
        EmptyAction => "ERROR_EMPTY_ACTION",
        IpBanned => "IP_BANNED",
        ZeroBalance => "ERROR_ZERO_BALANCE",
        NoSlot => "ERROR_NO_SLOT_AVAILABLE",
        /// A method no provider of the pool serves.
        NoSuchMethod => "ERROR_NO_SUCH_METHOD",
        ServerError => "ERROR_SERVER_ERROR",
        WrongCaptchaId => "ERROR_WRONG_CAPTCHA_ID",
        NotReady => "CAPCHA_NOT_READY",
        /// A missing or wrong caller token.
        WrongUserKey => "ERROR_WRONG_USER_KEY",
        /// Pool figures (`getbalance`, `threadsinfo`) and re-joined `ids=` answers.
        Ok => "OK",
    }
}

label_set! {
    /// What became of a forward-proxy request (a `CONNECT`, or an absolute-form request to
    /// a host that is not intercepted): the `outcome` of `keyrelay_forward_requests_total`.
    ForwardOutcome {
        /// A `CONNECT` to an intercepted API host: TLS terminated, the requests inside
        /// served by the pool (and counted as direct ones).
        Intercepted => "intercepted",
        /// Tunnelled byte for byte.
        Tunnelled => "tunnelled",
        /// An absolute-form request relayed to its host.
        Relayed => "relayed",
        /// Refused: `[forward] tunnel = "none"`, or an API host for which the local CA could
        /// not issue a certificate.
        Refused => "refused",
        /// No valid token in `Proxy-Authorization` while tokens are configured.
        Unauthorized => "unauthorized",
        /// The host could not be reached.
        Unreachable => "unreachable",
        /// A `CONNECT` without host or port, or a URL that cannot be relayed.
        BadTarget => "bad_target",
    }
}

label_set! {
    /// Why the forward proxy refused a destination: the `reason` of
    /// `keyrelay_forward_refused_total`.
    ForwardRefusal {
        /// One of keyrelay's own listeners (proxy, TLS, admin), by any name or notation.
        Listener => "keyrelay_listener",
        /// Loopback, link-local, private, unique-local or unspecified, from a listener
        /// other machines can reach.
        Address => "private_address",
        /// A port other than 443 (`CONNECT`) or 80 and 443 (relayed requests), from a
        /// listener other machines can reach.
        Port => "port",
        /// `[forward] tunnel = "none"`.
        TunnelNone => "tunnel_none",
        /// The caller token already holds `max_tunnels` tunnels.
        TooManyTunnels => "max_tunnels",
    }
}

label_set! {
    /// Why a TLS handshake failed: the `reason` of `keyrelay_tls_handshake_failures_total`,
    /// as `tls::classify_handshake_error` sorts them.
    TlsFailure {
        /// Not finished within `limits.header_timeout`.
        Timeout => "timeout",
        /// The first bytes were not TLS: plain HTTP to the TLS port, or garbage.
        NotTls => "not_tls",
        /// A TLS peer that failed the protocol: an alert (say, it does not trust the
        /// certificate), no shared version, cipher or ALPN protocol.
        Protocol => "protocol",
        /// The connection broke or closed mid-handshake.
        Io => "io",
    }
}

impl From<crate::tls::HandshakeFailure> for TlsFailure {
    fn from(reason: crate::tls::HandshakeFailure) -> TlsFailure {
        use crate::tls::HandshakeFailure as H;
        match reason {
            H::Timeout => TlsFailure::Timeout,
            H::NotTls => TlsFailure::NotTls,
            H::Protocol => TlsFailure::Protocol,
            H::Io => TlsFailure::Io,
        }
    }
}

label_set! {
    /// Why a task gave its thread back: the `reason` of `keyrelay_thread_releases_total`.
    Release {
        /// Its final answer was polled.
        Final => "final",
        /// `capacity.stale_after` passed with no final answer polled.
        Stale => "stale",
        /// threadsinfo showed the service no longer working on it.
        Reconciled => "reconciled",
    }
}

label_set! {
    /// How a probe for an unknown task id ended: the `result` of `keyrelay_probes_total`.
    ProbeResult {
        /// A key owns the id: it is pinned and its answer relayed.
        Found => "found",
        /// Every key asked said "not mine": `ERROR_WRONG_CAPTCHA_ID`, remembered.
        NotFound => "not_found",
        /// Answered from the miss cache, without asking.
        Remembered => "remembered",
        /// Some key could not say (a failure, a timeout): not ready, not remembered.
        Unsure => "unsure",
        /// The probe budget was spent: not ready, nobody asked.
        Budget => "budget",
        /// Not a task id at all: answered without asking.
        Invalid => "invalid",
    }
}

label_set! {
    /// Why a request was refused at the token check: the `reason` of
    /// `keyrelay_access_denied_total`.
    Denied {
        /// No `key` and no `Proxy-Authorization`.
        Missing => "missing",
        /// A `key` or proxy credential that is no configured token.
        Wrong => "wrong",
        /// Not checked: the caller's address presented too many wrong tokens lately.
        Limited => "rate_limited",
    }
}

label_set! {
    /// How a token's submit ended: the `outcome` of `keyrelay_token_submits_total`.
    TokenSubmit {
        /// Accepted upstream (a task id, or a `solve.php` answer).
        Ok => "ok",
        /// Every key the token may use was full, or the token held its `max_threads`.
        Full => "full",
        /// None of the keys the token may use was in rotation.
        NoKey => "no_key",
        /// The upstream refused the request as the caller's mistake, or it was unreadable.
        CallerError => "caller_error",
        /// Anything else: keys failed, the upstream did not answer, a ban pause.
        Failed => "failed",
    }
}

impl TokenSubmit {
    /// The class of a submit that ended with `outcome`.
    pub fn of(outcome: RequestOutcome) -> TokenSubmit {
        match outcome {
            RequestOutcome::Success => TokenSubmit::Ok,
            RequestOutcome::PoolFull => TokenSubmit::Full,
            RequestOutcome::PoolExhausted => TokenSubmit::NoKey,
            RequestOutcome::CallerError | RequestOutcome::BadRequest => TokenSubmit::CallerError,
            _ => TokenSubmit::Failed,
        }
    }
}

label_set! {
    /// How a config reload ended: the `result` of `keyrelay_config_reloads_total`.
    ReloadResult {
        Applied => "applied",
        Rejected => "rejected",
    }
}

label_set! {
    /// How a wait for a thread ended: the `result` of `keyrelay_queue_wait_seconds`.
    WaitResult {
        Admitted => "admitted",
        Refused => "refused",
        NoKey => "no_key",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_failure_labels_are_the_classifications() {
        use crate::tls::HandshakeFailure as H;
        for reason in [H::Timeout, H::NotTls, H::Protocol, H::Io] {
            assert_eq!(TlsFailure::from(reason).label(), reason.label());
        }
        assert_eq!(TlsFailure::ALL.len(), 4);
    }
}

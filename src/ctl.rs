//! `keyrelay ctl`: the admin API's client. Finds the admin address (`--url`, or the
//! config's `admin.listen`, else its `listen`) and token (the config's `admin.token`, else
//! `KEYRELAY_ADMIN_TOKEN`), makes one call with hyper's client, and turns the answer into
//! a table or one line, or into an error that says what to do.
//!
//! The config is read only for those three settings, not validated as a whole: `ctl` runs
//! in shells that have the admin token but not necessarily every key's `${VAR}`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::AUTHORIZATION;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::admin::{BudgetList, BudgetRow, ErrorBody, KeyAnswer, KeyList, KeyRow};
use crate::config::DEFAULT_LISTEN;
use crate::CallerToken;

/// The environment variable `ctl` reads the admin token from when the config has none.
pub const TOKEN_VAR: &str = "KEYRELAY_ADMIN_TOKEN";

/// How long `ctl` waits to connect: keyrelay on the same host answers at once, so a long
/// wait means it is not there.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one call may take: a refresh is bounded by keyrelay's `timeouts.refresh`, which
/// is far below this.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// What a path segment may carry unescaped: key names are mostly these already.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.');

/// One `ctl` command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Keys,
    /// Every caller token's spend and budget.
    Budgets,
    Disable(String),
    Enable(String),
    Drain(String),
    /// One key, or every key.
    Refresh(Option<String>),
}

/// Where the admin API is and what to present to it.
#[derive(Clone, Debug)]
pub struct Target {
    /// `http://host:port`, without a trailing slash.
    pub base: String,
    pub token: Option<CallerToken>,
}

/// Why a `ctl` command failed; each message says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("cannot read {path}: {reason}; pass --config PATH, or --url http://HOST:PORT")]
    Config { path: String, reason: String },
    #[error("{0}")]
    Url(String),
    #[error(
        "keyrelay is not running at {base} ({cause}); start it, or check admin.listen / --url"
    )]
    NotRunning { base: String, cause: String },
    #[error("{base} did not answer within {}s", CALL_TIMEOUT.as_secs())]
    TimedOut { base: String },
    #[error("the admin API refused the token ({detail}): {hint}")]
    Unauthorized { detail: String, hint: &'static str },
    #[error("the admin API answers loopback callers only while admin.token is unset: {0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("the admin API answered {status}: {error}")]
    Failed { status: StatusCode, error: String },
    #[error("{base} answered something that is not keyrelay's admin API ({status}): {detail}")]
    NotAdmin {
        base: String,
        status: StatusCode,
        detail: String,
    },
}

// === finding the admin API ===

impl Target {
    /// From `--url`: the token from the config at `config` if one is given and has one,
    /// else from the environment.
    ///
    /// # Errors
    /// A URL that is not `http://host:port`, or a config that cannot be read.
    pub fn from_url(
        url: &str,
        config: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Target, CtlError> {
        let base = url.trim_end_matches('/');
        let Some(authority) = base.strip_prefix("http://") else {
            return Err(CtlError::Url(format!(
                "--url {url}: ctl speaks plain http; give the admin listener's address as http://HOST:PORT"
            )));
        };
        if authority.is_empty() || authority.contains('/') {
            return Err(CtlError::Url(format!(
                "--url {url}: give only the address, as http://HOST:PORT"
            )));
        }
        let token = match config {
            Some(path) => Settings::read(path, env)?.token,
            None => None,
        };
        Ok(Target {
            base: base.to_owned(),
            token: token.or_else(|| token_from_env(env)),
        })
    }

    /// From the config at `path`: `admin.listen`, else `listen` (an unspecified address such
    /// as 0.0.0.0 is reached on loopback); `admin.token`, else the environment's.
    ///
    /// # Errors
    /// The file cannot be read, is not TOML, or has an unusable address or token.
    pub fn from_config(
        path: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Target, CtlError> {
        let settings = Settings::read(path, env)?;
        let mut addr = settings.addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
        }
        Ok(Target {
            base: format!("http://{addr}"),
            token: settings.token.or_else(|| token_from_env(env)),
        })
    }
}

fn token_from_env(env: &dyn Fn(&str) -> Option<String>) -> Option<CallerToken> {
    env(TOKEN_VAR)
        .map(CallerToken::new)
        .filter(|t| !t.is_empty())
}

/// The settings `ctl` reads from a config.
struct Settings {
    addr: SocketAddr,
    token: Option<CallerToken>,
}

impl Settings {
    fn read(path: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<Settings, CtlError> {
        let fail = |reason: String| CtlError::Config {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| fail(format!("not valid TOML: {}", e.message())))?;
        let admin = table.get("admin").and_then(toml::Value::as_table);
        let string = |value: Option<&toml::Value>, field: &str| match value {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(fail(format!("{field} must be a string"))),
        };
        let listen = string(admin.and_then(|a| a.get("listen")), "admin.listen")?
            .map(|l| (l, "admin.listen"))
            .or(string(table.get("listen"), "listen")?.map(|l| (l, "listen")));
        let (listen, field) = listen.unwrap_or((DEFAULT_LISTEN.to_owned(), "listen"));
        let addr = listen.parse().map_err(|_| {
            fail(format!(
                "{field} {listen:?} is not an address such as 127.0.0.1:9090"
            ))
        })?;
        let token = match string(admin.and_then(|a| a.get("token")), "admin.token")? {
            None => None,
            Some(template) => Some(substitute(&template, env).map_err(fail)?),
        };
        Ok(Settings { addr, token })
    }
}

/// `admin.token` with every `${VAR}` replaced, as keyrelay reads it; never quotes the value.
fn substitute(template: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<CallerToken, String> {
    let mut value = String::new();
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        value.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| "admin.token has \"${\" without a closing \"}\"".to_owned())?;
        let var = &after[..end];
        match env(var) {
            Some(v) => value.push_str(&v),
            None if var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') => {
                return Err(format!(
                    "admin.token uses ${{{var}}}, which is not set in this shell; set it (or {TOKEN_VAR})"
                ))
            }
            None => return Err("admin.token has an invalid \"${...}\"".to_owned()),
        }
        rest = &after[end + 1..];
    }
    value.push_str(rest);
    Ok(CallerToken::new(value))
}

// === calling it ===

/// Runs `action` against `target` and returns what to print.
///
/// # Errors
/// [`CtlError`], one variant per way a call can fail.
pub async fn run(target: &Target, action: &Action) -> Result<String, CtlError> {
    let key_path = |name: &str, verb: &str| {
        format!("/admin/keys/{}/{verb}", utf8_percent_encode(name, SEGMENT))
    };
    let (method, path) = match action {
        Action::Keys => (Method::GET, "/admin/keys".to_owned()),
        Action::Budgets => (Method::GET, "/admin/budgets".to_owned()),
        Action::Disable(name) => (Method::POST, key_path(name, "disable")),
        Action::Enable(name) => (Method::POST, key_path(name, "enable")),
        Action::Drain(name) => (Method::POST, key_path(name, "drain")),
        Action::Refresh(Some(name)) => (Method::POST, key_path(name, "refresh")),
        Action::Refresh(None) => (Method::POST, "/admin/refresh".to_owned()),
    };
    let (status, body) = call(target, method, &path).await?;
    if !status.is_success() {
        return Err(failure(target, status, &body));
    }
    let not_admin = |e: serde_json::Error| CtlError::NotAdmin {
        base: target.base.clone(),
        status,
        detail: e.to_string(),
    };
    Ok(match action {
        Action::Budgets => budget_table(
            &serde_json::from_slice::<BudgetList>(&body)
                .map_err(not_admin)?
                .tokens,
        ),
        Action::Keys | Action::Refresh(None) => table(
            &serde_json::from_slice::<KeyList>(&body)
                .map_err(not_admin)?
                .keys,
        ),
        _ => {
            let answer: KeyAnswer = serde_json::from_slice(&body).map_err(not_admin)?;
            one_line(action, &answer)
        }
    })
}

async fn call(
    target: &Target,
    method: Method,
    path: &str,
) -> Result<(StatusCode, Bytes), CtlError> {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(http);
    let uri = format!("{}{path}", target.base);
    let mut request = Request::builder().method(method).uri(&uri);
    if let Some(token) = &target.token {
        request = request.header(AUTHORIZATION, format!("Bearer {}", token.expose()));
    }
    let request = request
        .body(Full::new(Bytes::new()))
        .map_err(|e| CtlError::Url(format!("{} is not a usable address: {e}", target.base)))?;
    let not_running = |cause: String| CtlError::NotRunning {
        base: target.base.clone(),
        cause,
    };
    let work = async {
        let response = client.request(request).await.map_err(|e| {
            // The innermost cause ("Connection refused") is the one that says what happened.
            let mut cause: &dyn std::error::Error = &e;
            while let Some(inner) = cause.source() {
                cause = inner;
            }
            not_running(cause.to_string())
        })?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| not_running(e.to_string()))?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(CALL_TIMEOUT, work)
        .await
        .map_err(|_| CtlError::TimedOut {
            base: target.base.clone(),
        })?
}

/// The error for a non-2xx answer, from its `{"error": ...}` body.
fn failure(target: &Target, status: StatusCode, body: &[u8]) -> CtlError {
    let Ok(ErrorBody { error }) = serde_json::from_slice(body) else {
        let text = String::from_utf8_lossy(body);
        return CtlError::NotAdmin {
            base: target.base.clone(),
            status,
            detail: text.trim().chars().take(200).collect(),
        };
    };
    match status {
        StatusCode::UNAUTHORIZED => CtlError::Unauthorized {
            detail: error,
            hint: if target.token.is_some() {
                "the token ctl sent (the config's admin.token, or KEYRELAY_ADMIN_TOKEN) is not the running keyrelay's"
            } else {
                "set KEYRELAY_ADMIN_TOKEN, or pass the --config that has admin.token"
            },
        },
        StatusCode::FORBIDDEN => CtlError::Forbidden(error),
        StatusCode::NOT_FOUND => CtlError::NotFound(error),
        _ => CtlError::Failed { status, error },
    }
}

// === printing ===

fn hold_text(hold: Option<&str>) -> &str {
    hold.unwrap_or("-")
}

fn balance_text(balance: Option<f64>) -> String {
    balance.map_or("?".to_owned(), |b| format!("{b:.2}"))
}

fn threads_text(row: &KeyRow) -> String {
    match row.threads {
        Some(capacity) => format!("{}/{capacity}", row.threads_in_use),
        None => format!("{}/-", row.threads_in_use),
    }
}

/// The keys as an aligned table.
pub fn table(rows: &[KeyRow]) -> String {
    let header = [
        "NAME", "TIER", "STATE", "REASON", "HOLD", "ROTATION", "BALANCE", "THREADS", "TASKS", "KEY",
    ];
    let lines: Vec<[String; 10]> = rows
        .iter()
        .map(|r| {
            [
                r.name.clone(),
                r.tier.to_string(),
                r.state.clone(),
                r.reason.clone().unwrap_or_else(|| "-".to_owned()),
                hold_text(r.hold.as_deref()).to_owned(),
                if r.in_rotation { "in" } else { "out" }.to_owned(),
                balance_text(r.balance),
                threads_text(r),
                r.tasks_in_flight.to_string(),
                r.fingerprint.clone(),
            ]
        })
        .collect();
    columns(header, &lines)
}

/// `keyrelay ctl budgets`: one line per caller token.
pub fn budget_table(rows: &[BudgetRow]) -> String {
    if rows.is_empty() {
        return "no caller tokens are configured\n".to_owned();
    }
    let header = ["TOKEN", "SPEND", "THREAD-HOURS", "PERIOD", "BUDGET", "USED"];
    let lines: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            let period = humantime::format_duration(Duration::from_secs(r.period_secs));
            let budget = match (r.budget_kind.as_deref(), r.budget) {
                (Some("thread_hours"), Some(amount)) => format!("{amount} thread-hours"),
                (Some(_), Some(amount)) => format!("{amount}"),
                _ => "-".to_owned(),
            };
            let used = r.used.map_or_else(
                || "-".to_owned(),
                |used| format!("{:.0}%", (used * 100.0).floor()),
            );
            [
                r.token.clone(),
                format!("{:.4}", r.spend),
                format!("{:.2}", r.thread_hours),
                period.to_string(),
                budget,
                used,
            ]
        })
        .collect();
    columns(header, &lines)
}

/// `lines` under `header`, each column as wide as its widest cell, two spaces apart.
fn columns<const N: usize>(header: [&str; N], lines: &[[String; N]]) -> String {
    let mut widths = header.map(|h| h.chars().count());
    for line in lines {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header = header.map(str::to_owned);
    for line in std::iter::once(&header).chain(lines) {
        let cells: Vec<String> = line
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// One line for a call about one key.
fn one_line(action: &Action, answer: &KeyAnswer) -> String {
    let key = &answer.key;
    let was = hold_text(answer.previous_hold.as_deref());
    let rotation = if key.in_rotation {
        "in rotation"
    } else {
        "out of rotation"
    };
    let done = match action {
        Action::Disable(_) => format!("disabled (hold was {was})"),
        Action::Drain(_) => format!("draining (hold was {was})"),
        Action::Enable(_) => format!("enabled (hold was {was})"),
        _ => "refreshed".to_owned(),
    };
    format!(
        "{}: {done}; {}, {rotation}, balance {}, threads {}\n",
        key.name,
        key.state,
        balance_text(key.balance),
        threads_text(key),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_with(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    fn config(text: &str) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut file, text.as_bytes()).unwrap();
        file
    }

    #[test]
    fn the_address_is_admin_listen_else_listen_else_the_default() {
        let none = env_with(&[]);
        let both = config("listen = \"127.0.0.1:8080\"\n[admin]\nlisten = \"127.0.0.1:9090\"\n");
        assert_eq!(
            Target::from_config(both.path(), &none).unwrap().base,
            "http://127.0.0.1:9090"
        );
        let proxy = config("listen = \"0.0.0.0:8081\"\n[[keys]]\nkey = \"${UNSET}\"\n");
        assert_eq!(
            Target::from_config(proxy.path(), &none).unwrap().base,
            "http://127.0.0.1:8081",
            "0.0.0.0 is reached on loopback, and the keys' variables are not needed"
        );
        let bare = config("upstream = \"http://x\"\n");
        assert_eq!(
            Target::from_config(bare.path(), &none).unwrap().base,
            format!("http://{DEFAULT_LISTEN}")
        );
        let bad = config("[admin]\nlisten = \"nine\"\n");
        let error = Target::from_config(bad.path(), &none)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("admin.listen \"nine\" is not an address"),
            "{error}"
        );
    }

    #[test]
    fn the_token_is_the_configs_else_the_environments() {
        let env = env_with(&[("ADMIN_T", "from-var"), (TOKEN_VAR, "from-env")]);
        let literal = config("[admin]\ntoken = \"literal-token\"\n");
        let target = Target::from_config(literal.path(), &env).unwrap();
        assert_eq!(target.token.unwrap().expose(), "literal-token");
        let var = config("[admin]\ntoken = \"${ADMIN_T}\"\n");
        assert_eq!(
            Target::from_config(var.path(), &env)
                .unwrap()
                .token
                .unwrap()
                .expose(),
            "from-var"
        );
        let none = config("listen = \"127.0.0.1:1\"\n");
        assert_eq!(
            Target::from_config(none.path(), &env)
                .unwrap()
                .token
                .unwrap()
                .expose(),
            "from-env"
        );
        let unset = config("[admin]\ntoken = \"${NOT_SET_HERE}\"\n");
        let error = Target::from_config(unset.path(), &env)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("${NOT_SET_HERE}, which is not set"),
            "{error}"
        );
        let url = Target::from_url("http://127.0.0.1:9/", None, &env).unwrap();
        assert_eq!(url.base, "http://127.0.0.1:9");
        assert_eq!(url.token.unwrap().expose(), "from-env");
        for bad in [
            "https://127.0.0.1:9",
            "127.0.0.1:9",
            "http://",
            "http://h:1/admin",
        ] {
            assert!(Target::from_url(bad, None, &env).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_table_is_aligned_and_shows_no_key() {
        let row = |name: &str, hold: Option<&str>| KeyRow {
            name: name.to_owned(),
            tier: 0,
            weight: 1.0,
            state: "active".to_owned(),
            reason: None,
            in_rotation: hold.is_none(),
            hold: hold.map(str::to_owned),
            balance: Some(10.0),
            threads_in_use: 1,
            threads: Some(5),
            tasks_in_flight: 1,
            fingerprint: "…0001".to_owned(),
        };
        let text = table(&[row("a", None), row("longer-name", Some("draining"))]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("NAME         TIER  STATE"), "{text}");
        assert!(lines[2].contains("draining  out"), "{text}");
        assert!(lines[1].contains("10.00    1/5"), "{text}");
    }
}

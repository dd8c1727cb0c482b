//! The JSON API's task types as data: each type's `in.php` method, the fields it renames,
//! and what it needs. A task is translated into the `in.php` submit of the pool's
//! protocol; nothing here knows a key or a provider beyond the method name.

use std::borrow::Cow;

use serde_json::value::RawValue;

use super::codes::JsonError;
use super::fields::{scalar, Fields, Scalar};

/// One family of task types: every spelling of it (with or without `Proxyless`, in
/// anti-captcha's, CapMonster's, CapSolver's and 2captcha's case) comes to one entry.
#[derive(Debug, PartialEq, Eq)]
pub struct TaskType {
    /// The type names without their `proxyless` suffix, lower case.
    bases: &'static [&'static str],
    /// The `in.php` method.
    pub method: &'static str,
    /// Params every task of the type sends as they are.
    fixed: &'static [(&'static str, &'static str)],
    /// JSON field → `in.php` param.
    renames: &'static [(&'static str, &'static str)],
    /// JSON fields the task cannot go without.
    required: &'static [&'static str],
}

const RECAPTCHA_V2: &[(&str, &str)] = &[
    ("websiteURL", "pageurl"),
    ("websiteKey", "googlekey"),
    ("isInvisible", "invisible"),
    ("recaptchaDataSValue", "data-s"),
    ("apiDomain", "domain"),
    ("userAgent", "userAgent"),
    ("cookies", "cookies"),
];

const RECAPTCHA_V3: &[(&str, &str)] = &[
    ("websiteURL", "pageurl"),
    ("websiteKey", "googlekey"),
    ("pageAction", "action"),
    ("minScore", "min_score"),
    ("isEnterprise", "enterprise"),
    ("apiDomain", "domain"),
    ("userAgent", "userAgent"),
];

const SITE: &[&str] = &["websiteURL", "websiteKey"];

/// Every task type keyrelay translates.
pub const TASK_TYPES: &[TaskType] = &[
    TaskType {
        bases: &["imagetotexttask"],
        method: "base64",
        fixed: &[],
        renames: &[
            ("body", "body"),
            ("phrase", "phrase"),
            ("case", "regsense"),
            ("numeric", "numeric"),
            ("math", "calc"),
            ("minLength", "min_len"),
            ("maxLength", "max_len"),
            ("comment", "textinstructions"),
        ],
        required: &["body"],
    },
    TaskType {
        bases: &["recaptchav2task", "nocaptchatask"],
        method: "userrecaptcha",
        fixed: &[],
        renames: RECAPTCHA_V2,
        required: SITE,
    },
    TaskType {
        bases: &["recaptchav2enterprisetask"],
        method: "userrecaptcha",
        fixed: &[("enterprise", "1")],
        renames: RECAPTCHA_V2,
        required: SITE,
    },
    TaskType {
        bases: &["recaptchav3task"],
        method: "userrecaptcha",
        fixed: &[("version", "v3")],
        renames: RECAPTCHA_V3,
        required: SITE,
    },
    TaskType {
        bases: &["recaptchav3enterprisetask"],
        method: "userrecaptcha",
        fixed: &[("version", "v3"), ("enterprise", "1")],
        renames: RECAPTCHA_V3,
        required: SITE,
    },
    TaskType {
        bases: &["turnstiletask", "antiturnstiletask"],
        method: "turnstile",
        fixed: &[],
        renames: &[
            ("websiteURL", "pageurl"),
            ("websiteKey", "sitekey"),
            ("action", "action"),
            ("cData", "data"),
            ("chlPageData", "pagedata"),
            ("userAgent", "userAgent"),
        ],
        required: SITE,
    },
    TaskType {
        bases: &["geetesttask"],
        method: "geetest",
        fixed: &[],
        renames: &[
            ("websiteURL", "pageurl"),
            ("gt", "gt"),
            ("challenge", "challenge"),
            ("geetestApiServerSubdomain", "api_server"),
            ("userAgent", "userAgent"),
        ],
        required: &["websiteURL", "gt", "challenge"],
    },
    TaskType {
        bases: &["hcaptchatask"],
        method: "hcaptcha",
        fixed: &[],
        renames: &[
            ("websiteURL", "pageurl"),
            ("websiteKey", "sitekey"),
            ("isInvisible", "invisible"),
            ("userAgent", "userAgent"),
        ],
        required: SITE,
    },
];

/// A task read and translated: its type and the `in.php` params it sends (the pool's key
/// and `json=1` are the front's to add), borrowed from the request where they can be.
#[derive(Debug, PartialEq, Eq)]
pub struct Translated<'a> {
    pub task_type: &'static TaskType,
    pub params: Vec<(&'static str, Cow<'a, str>)>,
}

impl TaskType {
    /// The entry a `type` names, in any case, with or without `Proxyless`; and whether it
    /// said proxyless.
    pub fn named(name: &str) -> Option<(&'static TaskType, bool)> {
        let name = name.trim();
        let cut = name.len().saturating_sub("proxyless".len());
        let (base, proxyless) = match name.get(cut..) {
            Some(suffix) if suffix.eq_ignore_ascii_case("proxyless") => (&name[..cut], true),
            _ => (name, false),
        };
        TASK_TYPES
            .iter()
            .find(|t| t.bases.iter().any(|b| b.eq_ignore_ascii_case(base)))
            .map(|t| (t, proxyless))
    }
}

/// Translates `task` (the `task` object of a `createTask`) into `in.php` params.
///
/// # Errors
/// `ERROR_TASK_NOT_SUPPORTED` for a type keyrelay does not know; `ERROR_BAD_PARAMETERS`
/// for a missing required field, a field of the wrong shape, or a proxy it cannot read.
pub fn translate<'a>(task: &Fields<'a>) -> Result<Translated<'a>, JsonError> {
    let name = match task.get("type").map(scalar) {
        Some(Scalar::Text(name)) => name,
        _ => return Err(JsonError::bad_parameters("the task has no \"type\"")),
    };
    let Some((task_type, proxyless)) = TaskType::named(&name) else {
        return Err(JsonError::task_not_supported(&name));
    };
    let mut params = Vec::with_capacity(task_type.renames.len() + 4);
    params.push(("method", Cow::Borrowed(task_type.method)));
    params.extend(
        task_type
            .fixed
            .iter()
            .map(|(name, value)| (*name, Cow::Borrowed(*value))),
    );
    for (field, param) in task_type.renames {
        let Some(value) = task.get(field) else {
            continue;
        };
        if let Some(text) = param_value(field, value)? {
            let text = if *field == "body" {
                strip_data_url(text)
            } else {
                text
            };
            params.push((*param, text));
        }
    }
    // Checked on the params, not the fields: an image's text is then read once.
    for field in task_type.required {
        let param = task_type
            .renames
            .iter()
            .find_map(|(f, p)| (f == field).then_some(*p));
        let given = params
            .iter()
            .any(|(name, value)| Some(*name) == param && !value.trim().is_empty());
        if !given {
            return Err(JsonError::bad_parameters(&format!(
                "the task needs \"{field}\""
            )));
        }
    }
    nested_fields(task, &mut params)?;
    if !proxyless {
        proxy(task, &mut params)?;
    }
    Ok(Translated { task_type, params })
}

/// A JSON field's value as an `in.php` param: strings as they are, numbers as written,
/// `true` as `1`. `null`, `false` and an empty string send nothing: clients send them for
/// "not set" (anti-captcha's sends `"comment": false`), and every `in.php` default is off.
fn param_value<'a>(field: &str, value: &'a RawValue) -> Result<Option<Cow<'a, str>>, JsonError> {
    Ok(match scalar(value) {
        Scalar::Null | Scalar::Bool(false) => None,
        Scalar::Text(text) if text.is_empty() => None,
        Scalar::Text(text) => Some(text),
        Scalar::Bool(true) => Some(Cow::Borrowed("1")),
        Scalar::Number(number) => Some(Cow::Borrowed(number)),
        Scalar::Nested => {
            return Err(JsonError::bad_parameters(&format!(
                "\"{field}\" must be a string, a number or a boolean"
            )))
        }
    })
}

/// An image as a data URL (`data:image/png;base64,…`), as some clients send it: the
/// service takes the base64 alone.
fn strip_data_url(body: Cow<'_, str>) -> Cow<'_, str> {
    let data = |body: &str| -> Option<usize> {
        let rest = body.strip_prefix("data:")?;
        Some(body.len() - rest.len() + rest.find(',')? + 1)
    };
    match (data(&body), body) {
        (Some(at), Cow::Borrowed(body)) => Cow::Borrowed(&body[at..]),
        (Some(at), Cow::Owned(body)) => Cow::Owned(body[at..].to_owned()),
        (None, body) => body,
    }
}

/// Fields clients nest: an enterprise payload's `s` (reCAPTCHA) or `rqdata` (hCaptcha),
/// and CapSolver's Turnstile `metadata`.
fn nested_fields<'a>(
    task: &Fields<'a>,
    params: &mut Vec<(&'static str, Cow<'a, str>)>,
) -> Result<(), JsonError> {
    const NESTED: [(&str, &str, &str); 4] = [
        ("enterprisePayload", "s", "data-s"),
        ("enterprisePayload", "rqdata", "data"),
        ("metadata", "action", "action"),
        ("metadata", "cdata", "data"),
    ];
    for (outer, inner, param) in NESTED {
        let Some(value) = task.get(outer) else {
            continue;
        };
        match scalar(value) {
            Scalar::Null => continue,
            Scalar::Nested if value.get().starts_with('{') => {}
            _ => {
                return Err(JsonError::bad_parameters(&format!(
                    "\"{outer}\" must be an object"
                )))
            }
        }
        if params.iter().any(|(name, _)| *name == param) {
            continue;
        }
        let fields = Fields::parse(value.get(), outer)?;
        if let Some(inner) = fields.get(inner) {
            if let Some(text) = param_value(param, inner)? {
                params.push((param, text));
            }
        }
    }
    Ok(())
}

/// The proxy a task names, as `in.php`'s `proxy` (`login:password@host:port`) and
/// `proxytype`: anti-captcha's separate fields, or CapSolver's one `proxy` string
/// (`host:port`, `host:port:login:password`, either after `type:`, or a URL). Nothing when
/// the task names none.
fn proxy<'a>(
    task: &Fields<'a>,
    params: &mut Vec<(&'static str, Cow<'a, str>)>,
) -> Result<(), JsonError> {
    let text = |field: &str| -> Result<Option<Cow<'a, str>>, JsonError> {
        match task.get(field) {
            None => Ok(None),
            Some(value) => param_value(field, value),
        }
    };
    let proxy = if let Some(address) = text("proxyAddress")? {
        let port = text("proxyPort")?
            .ok_or_else(|| JsonError::bad_parameters("\"proxyAddress\" needs \"proxyPort\""))?;
        Proxy {
            kind: text("proxyType")?.map_or_else(|| "http".to_owned(), Cow::into_owned),
            host: address.into_owned(),
            port: port.into_owned(),
            login: text("proxyLogin")?.map(Cow::into_owned),
            password: text("proxyPassword")?.map(Cow::into_owned),
        }
    } else if let Some(line) = text("proxy")? {
        Proxy::parse(&line)?
    } else {
        return Ok(());
    };
    params.push(("proxy", Cow::Owned(proxy.address())));
    // A type keyrelay does not know is sent as it came: the service says whether it does.
    params.push(("proxytype", Cow::Owned(proxy.kind.to_ascii_uppercase())));
    Ok(())
}

struct Proxy {
    kind: String,
    host: String,
    port: String,
    login: Option<String>,
    password: Option<String>,
}

const PROXY_TYPES: [&str; 4] = ["http", "https", "socks4", "socks5"];

impl Proxy {
    fn parse(line: &str) -> Result<Proxy, JsonError> {
        let bad = || JsonError::bad_parameters("\"proxy\" is not host:port[:login:password]");
        if let Some((scheme, rest)) = line.split_once("://") {
            let (credentials, address) = match rest.rsplit_once('@') {
                Some((credentials, address)) => (Some(credentials), address),
                None => (None, rest),
            };
            let (host, port) = address
                .trim_end_matches('/')
                .rsplit_once(':')
                .ok_or_else(bad)?;
            let (login, password) = match credentials.map(|c| c.split_once(':')) {
                Some(Some((login, password))) => (Some(login), Some(password)),
                Some(None) => (credentials, None),
                None => (None, None),
            };
            return Proxy::checked(scheme, host, port, login, password);
        }
        let mut parts: Vec<&str> = line.split(':').collect();
        let kind = match parts.first() {
            Some(first) if PROXY_TYPES.contains(&first.to_ascii_lowercase().as_str()) => {
                parts.remove(0)
            }
            _ => "http",
        };
        match parts[..] {
            [host, port] => Proxy::checked(kind, host, port, None, None),
            [host, port, login, password] => {
                Proxy::checked(kind, host, port, Some(login), Some(password))
            }
            _ => Err(bad()),
        }
    }

    fn checked(
        kind: &str,
        host: &str,
        port: &str,
        login: Option<&str>,
        password: Option<&str>,
    ) -> Result<Proxy, JsonError> {
        if host.is_empty() || port.parse::<u16>().is_err() {
            return Err(JsonError::bad_parameters(
                "the proxy needs a host and a port number",
            ));
        }
        Ok(Proxy {
            kind: kind.to_owned(),
            host: host.to_owned(),
            port: port.to_owned(),
            login: login.map(str::to_owned),
            password: password.map(str::to_owned),
        })
    }

    fn address(&self) -> String {
        match (&self.login, &self.password) {
            (Some(login), Some(password)) => {
                format!("{login}:{password}@{}:{}", self.host, self.port)
            }
            (Some(login), None) => format!("{login}@{}:{}", self.host, self.port),
            _ => format!("{}:{}", self.host, self.port),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn translated(task: Value) -> Result<Vec<(String, String)>, JsonError> {
        let json = task.to_string();
        let fields = Fields::parse(&json, "the task")?;
        translate(&fields).map(|t| {
            t.params
                .into_iter()
                .map(|(name, value)| (name.to_owned(), value.into_owned()))
                .collect()
        })
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn an_image_task_renames_its_options() {
        let params = translated(json!({
            "type": "ImageToTextTask", "body": "data:image/png;base64,QUJD",
            "phrase": true, "case": false, "numeric": 1, "math": true,
            "minLength": 2, "maxLength": 8, "comment": "red letters", "websiteURL": null,
        }))
        .unwrap();
        assert_eq!(
            params,
            pairs(&[
                ("method", "base64"),
                ("body", "QUJD"),
                ("phrase", "1"),
                ("numeric", "1"),
                ("calc", "1"),
                ("min_len", "2"),
                ("max_len", "8"),
                ("textinstructions", "red letters"),
            ])
        );
    }

    #[test]
    fn unset_options_send_nothing_and_field_names_match_in_any_case() {
        // What anticaptchaofficial sends for an image with no options.
        let params = translated(json!({
            "type": "ImageToTextTask", "body": "QUJD", "phrase": false, "case": false,
            "numeric": 0, "math": false, "minLength": 0, "maxLength": 0, "comment": false,
            "languagePool": "en",
        }))
        .unwrap();
        assert_eq!(
            params,
            pairs(&[
                ("method", "base64"),
                ("body", "QUJD"),
                ("numeric", "0"),
                ("min_len", "0"),
                ("max_len", "0"),
            ])
        );
        // CapMonster's client spells it `Case`.
        let params =
            translated(json!({"type": "ImageToTextTask", "body": "QUJD", "Case": true})).unwrap();
        assert!(params.contains(&("regsense".into(), "1".into())));
        let params = translated(json!({
            "type": "RecaptchaV2TaskProxyless", "websiteURL": "u", "websiteKey": "k",
            "recaptchaDataSValue": "", "websiteSToken": "",
        }))
        .unwrap();
        assert!(!params.iter().any(|(n, _)| n == "data-s"));
    }

    #[test]
    fn every_spelling_of_a_type_is_one_type() {
        for name in [
            "RecaptchaV2Task",
            "RecaptchaV2TaskProxyless",
            "ReCaptchaV2TaskProxyLess",
            "NoCaptchaTaskProxyless",
            "recaptchav2task",
        ] {
            let (task_type, _) = TaskType::named(name).expect(name);
            assert_eq!(task_type.method, "userrecaptcha", "{name}");
        }
        for name in ["TurnstileTaskProxyless", "AntiTurnstileTaskProxyLess"] {
            assert_eq!(TaskType::named(name).unwrap().0.method, "turnstile");
        }
        assert_eq!(TaskType::named("FunCaptchaTask"), None);
        assert_eq!(TaskType::named(""), None);
    }

    #[test]
    fn a_recaptcha_v2_task_without_proxy_fields_is_proxyless() {
        let params = translated(json!({
            "type": "RecaptchaV2Task", "websiteURL": "https://x.test/login",
            "websiteKey": "6Le-key", "isInvisible": true,
        }))
        .unwrap();
        assert_eq!(
            params,
            pairs(&[
                ("method", "userrecaptcha"),
                ("pageurl", "https://x.test/login"),
                ("googlekey", "6Le-key"),
                ("invisible", "1"),
            ])
        );
    }

    #[test]
    fn proxy_fields_become_one_proxy_param() {
        let params = translated(json!({
            "type": "RecaptchaV2Task", "websiteURL": "https://x.test", "websiteKey": "k",
            "proxyType": "socks5", "proxyAddress": "10.0.0.1", "proxyPort": 1080,
            "proxyLogin": "u", "proxyPassword": "p",
        }))
        .unwrap();
        assert!(params.contains(&("proxy".into(), "u:p@10.0.0.1:1080".into())));
        assert!(params.contains(&("proxytype".into(), "SOCKS5".into())));
        // The same fields on a proxyless type are not sent.
        let params = translated(json!({
            "type": "RecaptchaV2TaskProxyless", "websiteURL": "https://x.test",
            "websiteKey": "k", "proxyAddress": "10.0.0.1", "proxyPort": 1080,
        }))
        .unwrap();
        assert!(!params.iter().any(|(n, _)| n == "proxy"));
    }

    #[test]
    fn capsolver_proxy_lines_are_read() {
        for (line, proxy, kind) in [
            ("10.0.0.1:8080", "10.0.0.1:8080", "HTTP"),
            ("10.0.0.1:8080:u:p", "u:p@10.0.0.1:8080", "HTTP"),
            ("socks5:10.0.0.1:1080:u:p", "u:p@10.0.0.1:1080", "SOCKS5"),
            ("http://u:p@10.0.0.1:3128", "u:p@10.0.0.1:3128", "HTTP"),
            ("socks4://10.0.0.1:1080/", "10.0.0.1:1080", "SOCKS4"),
        ] {
            let params = translated(json!({
                "type": "ReCaptchaV2Task", "websiteURL": "https://x.test",
                "websiteKey": "k", "proxy": line,
            }))
            .unwrap();
            assert!(
                params.contains(&("proxy".into(), proxy.into())),
                "{line}: {params:?}"
            );
            assert!(
                params.contains(&("proxytype".into(), kind.into())),
                "{line}"
            );
        }
        for line in ["10.0.0.1", "10.0.0.1:notaport", "a:b:c", ":80"] {
            let error = translated(json!({
                "type": "ReCaptchaV2Task", "websiteURL": "https://x.test",
                "websiteKey": "k", "proxy": line,
            }))
            .unwrap_err();
            assert_eq!(error.code, "ERROR_BAD_PARAMETERS", "{line}");
        }
    }

    #[test]
    fn v3_and_enterprise_tasks_carry_their_fixed_params() {
        let params = translated(json!({
            "type": "RecaptchaV3TaskProxyless", "websiteURL": "https://x.test",
            "websiteKey": "k", "pageAction": "login", "minScore": 0.7,
        }))
        .unwrap();
        for pair in [("version", "v3"), ("action", "login"), ("min_score", "0.7")] {
            assert!(params.contains(&(pair.0.into(), pair.1.into())), "{pair:?}");
        }
        let params = translated(json!({
            "type": "RecaptchaV2EnterpriseTaskProxyless", "websiteURL": "https://x.test",
            "websiteKey": "k", "enterprisePayload": {"s": "S-VALUE"},
        }))
        .unwrap();
        assert!(params.contains(&("enterprise".into(), "1".into())));
        assert!(params.contains(&("data-s".into(), "S-VALUE".into())));
    }

    #[test]
    fn turnstile_geetest_and_hcaptcha_rename_their_fields() {
        let params = translated(json!({
            "type": "AntiTurnstileTaskProxyLess", "websiteURL": "https://x.test",
            "websiteKey": "0x4AAA", "metadata": {"action": "login", "cdata": "c"},
        }))
        .unwrap();
        assert_eq!(
            params,
            pairs(&[
                ("method", "turnstile"),
                ("pageurl", "https://x.test"),
                ("sitekey", "0x4AAA"),
                ("action", "login"),
                ("data", "c"),
            ])
        );
        let params = translated(json!({
            "type": "GeeTestTaskProxyless", "websiteURL": "https://x.test",
            "gt": "g", "challenge": "c",
        }))
        .unwrap();
        assert_eq!(
            params,
            pairs(&[
                ("method", "geetest"),
                ("pageurl", "https://x.test"),
                ("gt", "g"),
                ("challenge", "c"),
            ])
        );
        let params = translated(json!({
            "type": "HCaptchaTaskProxyless", "websiteURL": "https://x.test",
            "websiteKey": "h", "enterprisePayload": {"rqdata": "r"},
        }))
        .unwrap();
        assert!(params.contains(&("sitekey".into(), "h".into())));
        assert!(params.contains(&("data".into(), "r".into())));
    }

    #[test]
    fn bad_tasks_are_refused_with_the_json_apis_errors() {
        let cases = [
            (
                json!({"type": "FunCaptchaTask"}),
                "ERROR_TASK_NOT_SUPPORTED",
            ),
            (json!({"body": "QUJD"}), "ERROR_BAD_PARAMETERS"),
            (json!({"type": 7}), "ERROR_BAD_PARAMETERS"),
            (json!({"type": "ImageToTextTask"}), "ERROR_BAD_PARAMETERS"),
            (
                json!({"type": "ImageToTextTask", "body": "  "}),
                "ERROR_BAD_PARAMETERS",
            ),
            (
                json!({"type": "RecaptchaV2Task", "websiteURL": "https://x.test"}),
                "ERROR_BAD_PARAMETERS",
            ),
            (
                json!({"type": "ImageToTextTask", "body": "QUJD", "phrase": [1]}),
                "ERROR_BAD_PARAMETERS",
            ),
            (
                json!({"type": "HCaptchaTask", "websiteURL": "u", "websiteKey": "k",
                       "enterprisePayload": "x"}),
                "ERROR_BAD_PARAMETERS",
            ),
            (
                json!({"type": "RecaptchaV2Task", "websiteURL": "u", "websiteKey": "k",
                       "proxyAddress": "10.0.0.1"}),
                "ERROR_BAD_PARAMETERS",
            ),
        ];
        for (task, code) in cases {
            let error = translated(task.clone()).unwrap_err();
            assert_eq!(error.code, code, "{task}");
            assert!(!error.description.is_empty());
        }
    }
}

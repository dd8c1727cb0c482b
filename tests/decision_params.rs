//! The params keyrelay decides on, end to end (issue 37 §3): `action`, `id` and `ids` are read
//! once whatever spellings and places the caller mixed (query with a JSON, urlencoded or
//! multipart body), and the simulator, whose parser is independent of keyrelay's, receives
//! exactly the checked values, once each, canonically named, and no other spelling of those
//! names. A request that gives one of them two values, or both `id` and `ids`, is answered
//! `ERROR_BAD_PARAMETERS` in the caller's format and changes nothing: no upstream request, no
//! thread taken or given back, no key cooled or benched.

mod common;

use bytes::Bytes;
use common::*;
use hyper::Method;
use keyrelay::config::TokenConfig;
use keyrelay::health::StateKind;
use keyrelay::sim::Received;

const FORM: &str = "application/x-www-form-urlencoded";
const JSON: &str = "application/json";
const BOUNDARY: &str = "decisionBoundary42";

fn multipart_type() -> String {
    format!("multipart/form-data; boundary={BOUNDARY}")
}

/// A multipart body of text parts, each given by its Content-Disposition and value.
fn multipart(parts: &[(&str, &str)]) -> String {
    let mut body = String::new();
    for (disposition, value) in parts {
        body.push_str(&format!(
            "--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n{value}\r\n"
        ));
    }
    body.push_str(&format!("--{BOUNDARY}--\r\n"));
    body
}

/// A reader's idea of "this param is `canonical`", apart from keyrelay's: case-blind after
/// trimming and cutting at `[` or NUL.
fn looks_like(name: &str, canonical: &str) -> bool {
    let cut = name.split(['[', '\0']).next().unwrap_or_default();
    cut.trim_matches(|c: char| c.is_whitespace() || c.is_control())
        .eq_ignore_ascii_case(canonical)
}

/// Every param and file part the simulator received in `request` that a lenient reader takes
/// for `canonical`, with its name as sent and its value.
fn named(request: &Received, canonical: &str) -> Vec<(String, String)> {
    let params = request.params.iter().cloned();
    let files = request.files.iter().map(|file| {
        let value = String::from_utf8_lossy(&file.bytes).into_owned();
        (file.field.clone(), value)
    });
    params
        .chain(files)
        .filter(|(name, _)| looks_like(name, canonical))
        .collect()
}

/// Checks one request the simulator received: exactly one `action` and one `id` (or `ids`),
/// named canonically and holding what keyrelay checked, and nothing spelled like the other
/// of `id` and `ids`. A multipart body names no other part after them in any header either.
fn assert_carries(request: &Received, action: &str, name: &str, value: &str, what: &str) {
    let one = |canonical: &str, value: &str| vec![(canonical.to_owned(), value.to_owned())];
    assert_eq!(named(request, "action"), one("action", action), "{what}");
    assert_eq!(named(request, name), one(name, value), "{what}");
    let other = if name == "id" { "ids" } else { "id" };
    assert_eq!(named(request, other), vec![], "{what}");
    let body = String::from_utf8_lossy(&request.body).to_ascii_lowercase();
    let dispositions = body
        .lines()
        .filter(|l| l.starts_with("content-disposition"))
        .filter(|l| l.contains("name") && (l.contains("id") || l.contains("action")))
        .count();
    let canonical_parts = named(request, "action").len() + named(request, name).len();
    assert!(
        dispositions <= canonical_parts,
        "{what}: a part named for a decision param is left: {body}"
    );
}

/// The requests the simulator received for `res.php`.
fn res_requests(h: &Harness) -> Vec<Received> {
    h.sim
        .received()
        .into_iter()
        .filter(|r| r.path == "/res.php")
        .collect()
}

/// (what, query after `/res.php?`, content type, body).
type Case = (&'static str, String, Option<String>, String);

async fn send(h: &Harness, query: &str, content_type: Option<&str>, body: &str) -> Answer {
    let method = if content_type.is_some() {
        Method::POST
    } else {
        Method::GET
    };
    let path = format!("/res.php?{query}");
    h.send(method, &path, content_type, Bytes::from(body.to_owned()))
        .await
}

/// Threads in use per key, as admission counts them.
fn in_use(h: &Harness) -> Vec<u32> {
    let snapshot = h.app.snapshot();
    let pool = &snapshot.pool;
    pool.keys().iter().map(|k| pool.load(k).in_use()).collect()
}

#[tokio::test]
async fn a_poll_sends_the_checked_action_and_id_once_whatever_the_caller_mixed() {
    let h = Harness::three_keys().await;
    let task = h.submit().await;
    let owner = h.sim.task_owner(task).expect("the task is the simulator's");
    let k = CALLER_KEY;
    let form = Some(FORM.to_owned());
    let json = Some(JSON.to_owned());
    let cases: Vec<(Case, &str)> = vec![
        (
            (
                "query and JSON",
                format!("key={k}&action=get&ID={task}"),
                json.clone(),
                format!(r#"{{"id":"{task}","Action":"get"}}"#),
            ),
            "get",
        ),
        (
            (
                "query and a JSON number",
                format!("key={k}&action=get2&id={task}"),
                json.clone(),
                format!(r#"{{"id":{task},"key":"{k}"}}"#),
            ),
            "get2",
        ),
        (
            (
                "query and form",
                format!("key={k}&id={task}&json=1"),
                form.clone(),
                format!("ACTION=get&id[]={task}&+id={task}&i%64={task}"),
            ),
            "get",
        ),
        (
            (
                "query and multipart",
                format!("key={k}&action=reportgood&i%64={task}"),
                Some(multipart_type()),
                multipart(&[
                    ("form-data; name=\"id\"", &task.to_string()),
                    ("form-data; name=\"other\"; name=\"ID\"", &task.to_string()),
                    ("form-data; NAME=\"action\"", "reportgood"),
                    ("form-data; name=\"key\"", k),
                ]),
            ),
            "reportgood",
        ),
        (
            // Padding trimmed, leading zeros dropped, blank lists no list: what keyrelay
            // read goes up, and the blanks do not.
            (
                "query, padded",
                format!("key={k}&action=+get+&id=000{task}&ids=&IDS="),
                None,
                String::new(),
            ),
            "get",
        ),
        (
            (
                "form, a blank list beside the id",
                format!("key={k}"),
                form.clone(),
                format!("action=reportbad&ids=+&Ids=+&ID={task}"),
            ),
            "reportbad",
        ),
    ];
    for ((what, query, content_type, body), action) in cases {
        h.sim.clear_received();
        let answer = send(&h, &query, content_type.as_deref(), &body).await;
        assert_eq!(answer.status, 200, "{what}");
        let text = answer.text();
        // The service's answer about the task: a result, "not ready", a recorded report.
        assert!(!text.contains("ERROR"), "{what}: {text}");
        let polls = res_requests(&h);
        assert_eq!(polls.len(), 1, "{what}: {polls:?}");
        assert_eq!(polls[0].key.as_deref(), Some(owner.as_str()), "{what}");
        assert_carries(&polls[0], action, "id", &task.to_string(), what);
    }
    h.stop().await;
}

/// Submits until two tasks are on different keys; returns (first, second, third) where the
/// third is on the first's key.
async fn tasks_on_two_keys(h: &Harness) -> (u64, u64, u64) {
    let first = h.submit().await;
    let first_owner = h.sim.task_owner(first);
    let (mut second, mut third) = (None, None);
    for _ in 0..30 {
        let task = h.submit().await;
        if h.sim.task_owner(task) == first_owner {
            third.get_or_insert(task);
        } else {
            second.get_or_insert(task);
        }
        if let (Some(second), Some(third)) = (second, third) {
            return (first, second, third);
        }
    }
    panic!("30 submits never spread over two keys");
}

#[tokio::test]
async fn an_ids_poll_sends_each_owner_its_checked_list_once_and_no_id() {
    let h = Harness::three_keys().await;
    let (t1, t2, t3) = tasks_on_two_keys(&h).await;
    let k = CALLER_KEY;

    // One owner: the whole list, respelled as keyrelay read it, in one request.
    h.sim.clear_received();
    let answer = send(
        &h,
        &format!("key={k}&action=get&ids={t1},+{t3}"),
        Some(FORM),
        &format!("Ids={t1},+{t3}&id=&get=1"),
    )
    .await;
    assert_eq!(answer.text().split('|').count(), 2, "{}", answer.text());
    let polls = res_requests(&h);
    assert_eq!(polls.len(), 1, "{polls:?}");
    assert_carries(&polls[0], "get", "ids", &format!("{t1},{t3}"), "one owner");

    // Two owners: each asked once for its own ids, in the caller's order.
    h.sim.clear_received();
    let answer = send(
        &h,
        &format!("key={k}&ACTION=get&json=1"),
        Some(JSON),
        &format!(r#"{{"ids":"{t1},{t2},{t3}","ID":"","action":"get"}}"#),
    )
    .await;
    let items = answer.json()["request"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(items.split('|').count(), 3, "{}", answer.text());
    let mut polls = res_requests(&h);
    polls.sort_by_key(|r| r.key.clone());
    assert_eq!(polls.len(), 2, "{polls:?}");
    for poll in &polls {
        let owner = poll.key.clone();
        let mine: Vec<String> = [t1, t2, t3]
            .iter()
            .filter(|t| h.sim.task_owner(**t) == owner)
            .map(u64::to_string)
            .collect();
        assert_carries(poll, "get", "ids", &mine.join(","), "two owners");
    }
    h.stop().await;
}

#[tokio::test]
async fn the_probe_asks_each_key_with_the_checked_id_or_list_only() {
    let h = Harness::three_keys().await;
    let k = CALLER_KEY;
    let lost = h.submit_past_keyrelay(KEY_B).await;
    h.sim.clear_received();
    let answer = send(
        &h,
        &format!("key={k}&action=get&ID={lost}&ids="),
        Some(JSON),
        &format!(r#"{{"id":"{lost}","IDS":""}}"#),
    )
    .await;
    assert_eq!(answer.text(), "CAPCHA_NOT_READY");
    let asked = res_requests(&h);
    assert!(!asked.is_empty());
    for poll in &asked {
        assert_carries(poll, "get", "id", &lost.to_string(), "probe of one id");
    }
    assert!(asked.iter().any(|r| r.key.as_deref() == Some(KEY_B)));

    // In a list, the unknown id is probed on its own, as a one-id list.
    let pinned = h.submit().await;
    let lost = h.submit_past_keyrelay(KEY_C).await;
    h.sim.clear_received();
    let answer = send(
        &h,
        &format!("key={k}&action=get&ids={lost},{pinned}&Id=+"),
        Some(FORM),
        &format!("IDS={lost},{pinned}"),
    )
    .await;
    assert_eq!(answer.text().split('|').count(), 2, "{}", answer.text());
    let lists: Vec<String> = res_requests(&h)
        .iter()
        .map(|poll| {
            assert_eq!(named(poll, "id"), vec![], "{poll:?}");
            assert_eq!(named(poll, "action").len(), 1, "{poll:?}");
            let ids = named(poll, "ids");
            assert_eq!(ids.len(), 1, "{poll:?}");
            assert_eq!(ids[0].0, "ids");
            ids[0].1.clone()
        })
        .collect();
    assert!(lists.contains(&lost.to_string()), "probed alone: {lists:?}");
    h.stop().await;
}

/// Requests that give a decision param two values, or `id` and `ids` together, in every mix
/// of places: (what, query after `/res.php?`, content type, body).
fn conflicting(own: u64, other: u64) -> Vec<Case> {
    let form = || Some(FORM.to_owned());
    let json = || Some(JSON.to_owned());
    vec![
        (
            "query, two spellings",
            format!("action=get&id={own}&ID={other}"),
            None,
            String::new(),
        ),
        (
            "query, two values",
            format!("action=get&id={other}&id={own}"),
            None,
            String::new(),
        ),
        (
            "query against JSON",
            format!("action=get&id={other}"),
            json(),
            format!(r#"{{"id":"{own}"}}"#),
        ),
        (
            "a made-up id against JSON",
            "action=get&id=1".to_owned(),
            json(),
            format!(r#"{{"id":{own}}}"#),
        ),
        (
            "query against form",
            format!("action=get2&id={other}"),
            form(),
            format!("id={own}"),
        ),
        (
            "query against multipart",
            format!("action=reportbad&id={other}"),
            Some(multipart_type()),
            multipart(&[("form-data; name=\"ID\"", &own.to_string())]),
        ),
        (
            "leading zeros are another value",
            format!("action=get&id=0{own}&id={own}"),
            None,
            String::new(),
        ),
        (
            "an id and a list",
            format!("action=get&ids={own}&id={other}"),
            None,
            String::new(),
        ),
        (
            "an id in the query, a list in the body",
            format!("action=get&id={own}"),
            json(),
            format!(r#"{{"ids":"{other},{own}"}}"#),
        ),
        (
            "two lists",
            format!("action=get&ids={own}"),
            form(),
            format!("IDS={other}"),
        ),
        (
            "two actions",
            format!("action=getbalance&id={own}"),
            form(),
            "action=get".to_owned(),
        ),
        (
            "an action and a blank one",
            format!("action=get&Action=&id={own}"),
            None,
            String::new(),
        ),
        (
            "two pingback actions",
            "action=add_pingback&addr=http://x.test".to_owned(),
            json(),
            r#"{"ACTION":"del_pingback"}"#.to_owned(),
        ),
    ]
}

/// Sends every conflicting request, plain and with `json=1`, as `token`'s, and checks each
/// answer is keyrelay's own `ERROR_BAD_PARAMETERS` in the format asked.
async fn refused(h: &Harness, token: &str, own: u64, other: u64) -> usize {
    let mut sent = 0;
    for (what, query, content_type, body) in conflicting(own, other) {
        let query = format!("key={token}&{query}");
        let plain = send(h, &query, content_type.as_deref(), &body).await;
        assert_eq!(plain.status, 200, "{what}");
        assert_eq!(plain.text(), "ERROR_BAD_PARAMETERS", "{what}");
        let json = send(
            h,
            &format!("{query}&json=1"),
            content_type.as_deref(),
            &body,
        )
        .await;
        assert_eq!(json.status, 200, "{what}");
        let json = json.json();
        assert_eq!(json["status"], 0, "{what}");
        assert_eq!(json["request"], "ERROR_BAD_PARAMETERS", "{what}");
        let why = json["error_text"].as_str().unwrap_or_default();
        assert!(why.contains("send"), "{what}: {why}");
        sent += 2;
    }
    sent
}

#[tokio::test]
async fn conflicting_params_are_refused_in_the_callers_format_and_change_nothing() {
    let h = Harness::three_keys().await;
    let own = h.submit().await;
    let other = h.submit().await;
    let threads = in_use(&h);
    assert_eq!(threads.iter().sum::<u32>(), 2, "two tasks running");
    h.sim.clear_received();

    let sent = refused(&h, CALLER_KEY, own, other).await;

    assert!(
        h.sim.received().is_empty(),
        "nothing reached the upstream: {:?}",
        h.sim.received()
    );
    assert_eq!(in_use(&h), threads, "no thread taken or given back");
    for name in ["a", "b", "c"] {
        assert_eq!(h.state_of(name), (StateKind::Active, None), "{name}");
    }
    let metrics = h.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "keyrelay_local_answers_total{code=\"ERROR_BAD_PARAMETERS\"}"
        ),
        Some(sent as f64)
    );
    // The tasks themselves are untouched, and poll as before.
    let answer = h
        .get(&format!("/res.php?key={CALLER_KEY}&action=get&id={own}"))
        .await;
    assert_eq!(answer.text(), "CAPCHA_NOT_READY");
    h.stop().await;
}

const CAPPED: &str = "capped-token-0123456789abcdefghij";
const NEIGHBOUR: &str = "neighbour-token-0123456789abcdefg";

fn token(name: &str, value: &str, max_threads: Option<u32>) -> TokenConfig {
    TokenConfig {
        max_threads,
        ..caller_token(name, value)
    }
}

fn submitted(answer: &Answer) -> u64 {
    answer
        .text()
        .strip_prefix("OK|")
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("not accepted: {}", answer.text()))
}

#[tokio::test]
async fn a_token_can_neither_free_its_running_task_nor_read_anothers_through_a_second_id() {
    // The case of issue 37 §3: a token with one thread asks for its neighbour's task in the
    // query while its own task is in the body. The ownership check passed on the body's id,
    // the service read the query's, and a "wrong id" answer freed the caller's thread.
    let sim = sim_with(&[KEY_A]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    config.access.tokens = vec![
        token("capped", CAPPED, Some(1)),
        token("neighbour", NEIGHBOUR, None),
    ];
    config.capacity.queue_timeout = std::time::Duration::ZERO;
    let h = Harness::start(sim, config).await;
    let task = "method=userrecaptcha&googlekey=site&pageurl=https://x.test";
    let theirs = submitted(&h.get(&format!("/in.php?key={NEIGHBOUR}&{task}")).await);
    let own = submitted(&h.get(&format!("/in.php?key={CAPPED}&{task}")).await);
    let threads = in_use(&h);
    assert_eq!(threads, vec![2]);
    h.sim.clear_received();

    refused(&h, CAPPED, own, theirs).await;
    assert!(h.sim.received().is_empty(), "{:?}", h.sim.received());

    // The neighbour's task under any one spelling is as unknown to this token as ever.
    for spelled in ["ID", "id[]", "+id", "i%64"] {
        let answer = h
            .get(&format!(
                "/res.php?key={CAPPED}&action=get&{spelled}={theirs}"
            ))
            .await;
        assert_eq!(answer.text(), "ERROR_WRONG_CAPTCHA_ID", "{spelled}");
    }
    assert!(h.sim.received().is_empty(), "{:?}", h.sim.received());

    // Its one thread is still held: a second task waits for the first to end.
    assert_eq!(in_use(&h), threads);
    let second = h.get(&format!("/in.php?key={CAPPED}&{task}")).await;
    assert_eq!(second.text(), "ERROR_ZERO_BALANCE");
    assert!(h.sim.received().is_empty(), "over its cap: not sent");
    let metrics = h.metrics().await;
    assert_eq!(
        metric(&metrics, "keyrelay_token_threads_in_use{token=\"capped\"}"),
        Some(1.0)
    );

    // Its own task, named consistently however it is spelled, polls to its end and then
    // frees the thread, and only then.
    let mut last = String::new();
    for _ in 0..100 {
        last = send(
            &h,
            &format!("key={CAPPED}&action=get&ID={own}"),
            Some(JSON),
            &format!(r#"{{"id":"{own}"}}"#),
        )
        .await
        .text();
        if last != "CAPCHA_NOT_READY" {
            break;
        }
    }
    assert!(last.starts_with("OK|"), "{last}");
    assert_eq!(
        in_use(&h),
        vec![1],
        "the neighbour's task still holds its thread"
    );
    submitted(&h.get(&format!("/in.php?key={CAPPED}&{task}")).await);
    h.stop().await;
}

#[tokio::test]
async fn pingbacks_and_actions_without_a_rule_go_up_with_the_action_read_once() {
    let h = Harness::three_keys().await;
    let k = CALLER_KEY;
    h.sim.clear_received();
    let answer = send(
        &h,
        &format!("key={k}&ACTION=add_pingback&addr=http://x.test"),
        Some(JSON),
        r#"{"action":"add_pingback"}"#,
    )
    .await;
    assert_eq!(answer.text(), "OK");
    let asked = res_requests(&h);
    assert_eq!(asked.len(), 3, "every key: {asked:?}");
    for request in &asked {
        let one = vec![("action".to_owned(), "add_pingback".to_owned())];
        assert_eq!(named(request, "action"), one);
    }

    // An action keyrelay has no rule for is forwarded, once, as read (trimmed).
    h.sim.clear_received();
    send(
        &h,
        &format!("key={k}&action=+getstats+&Action=+getstats+"),
        None,
        "",
    )
    .await;
    let asked = res_requests(&h);
    assert_eq!(asked.len(), 1, "{asked:?}");
    let one = vec![("action".to_owned(), "getstats".to_owned())];
    assert_eq!(named(&asked[0], "action"), one);
    h.stop().await;
}

#[tokio::test]
async fn with_tokens_an_action_without_a_rule_names_no_task_upstream() {
    // `GET` is no action keyrelay has a rule for, so it checks no owner for it; a service
    // that read actions without case would answer about whatever task it names. With
    // tokens, such a request goes up without any spelling of id or ids.
    let sim = sim_with(&[KEY_A]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    config.access.tokens = vec![
        token("capped", CAPPED, None),
        token("neighbour", NEIGHBOUR, None),
    ];
    let h = Harness::start(sim, config).await;
    let task = "method=userrecaptcha&googlekey=site&pageurl=https://x.test";
    let theirs = submitted(&h.get(&format!("/in.php?key={NEIGHBOUR}&{task}")).await);
    for (query, content_type, body) in [
        (
            format!("key={CAPPED}&action=GET&id={theirs}"),
            None,
            String::new(),
        ),
        (
            format!("key={CAPPED}&action=Get&ids={theirs}"),
            None,
            String::new(),
        ),
        (
            format!("key={CAPPED}&action=getstats"),
            Some(JSON),
            format!(r#"{{"ID":"{theirs}","IDS":"{theirs}"}}"#),
        ),
        (
            format!("key={CAPPED}"),
            Some(FORM),
            format!("action=GET2&i%64={theirs}"),
        ),
    ] {
        h.sim.clear_received();
        send(&h, &query, content_type, &body).await;
        let asked = res_requests(&h);
        assert_eq!(asked.len(), 1, "{query} {body}: {asked:?}");
        assert_eq!(named(&asked[0], "id"), vec![], "{query} {body}");
        assert_eq!(named(&asked[0], "ids"), vec![], "{query} {body}");
    }
    h.stop().await;
}

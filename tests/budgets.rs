//! Budgets per caller token end to end (`budget` on `[[access.tokens]]`, `[prices]`): a
//! submit reserves its price, a token at its budget gets `ERROR_ZERO_BALANCE` in the
//! caller's format and nothing goes upstream, its open tasks are still polled, other tokens
//! are unaffected, an unsolved task gives its reservation back, the metrics and the admin
//! API show the spend, and the counts survive a restart through `data_dir`.

mod common;

use std::time::Duration;

use common::*;
use keyrelay::config::{Budget, BudgetLimit, Config, Polling, Prices};
use keyrelay::provider::Provider;

const ALICE: &str = "token-alice-00000000000000000001";
const BOB: &str = "token-bob-0000000000000000000002";
const ADMIN: &str = "admin-token-000000000000000000003";

/// Alice may spend 10 over a day, at 3 a reCAPTCHA task (3,000 per 1,000); Bob has no budget.
fn config(sim: &keyrelay::sim::SimHandle, data_dir: Option<&std::path::Path>) -> Config {
    let mut config = config_for(sim, &[("a", KEY_A, 1.0)]);
    let mut alice = caller_token("alice", ALICE);
    alice.budget = Some(Budget {
        limit: BudgetLimit::Spend(10.0),
        period: Duration::from_secs(86_400),
        soft: 0.5,
    });
    config.access.tokens = vec![alice, caller_token("bob", BOB)];
    config.admin.token = Some(keyrelay::CallerToken::new(ADMIN));
    let mut prices = Prices::default();
    prices.set(Provider::CaptchaAi, "userrecaptcha", 3000.0);
    config.prices = prices;
    config.polling = Polling::off();
    config.data_dir = data_dir.map(std::path::Path::to_path_buf);
    config
}

async fn submit(h: &Harness, token: &str, json: bool) -> Answer {
    let json = if json { "&json=1" } else { "" };
    h.get(&format!(
        "/in.php?key={token}&method=userrecaptcha&googlekey=s&pageurl=https://x.test{json}"
    ))
    .await
}

fn submits_upstream(h: &Harness) -> usize {
    h.sim
        .received()
        .iter()
        .filter(|r| r.path == "/in.php")
        .count()
}

fn task_id(answer: &Answer) -> u64 {
    answer
        .text()
        .strip_prefix("OK|")
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("no task id in {}", answer.text()))
}

async fn harness(data_dir: Option<&std::path::Path>) -> Harness {
    let sim = sim_with(&[KEY_A]).await;
    let config = config(&sim, data_dir);
    Harness::start(sim, config).await
}

/// Submits of Alice's until one is refused; the accepted ones' ids.
async fn spend_alices_budget(h: &Harness) -> Vec<u64> {
    let mut ids = Vec::new();
    for _ in 0..10 {
        let answer = submit(h, ALICE, false).await;
        if answer.text() == "ERROR_ZERO_BALANCE" {
            return ids;
        }
        ids.push(task_id(&answer));
    }
    panic!("ten submits at 3 each never reached a budget of 10");
}

#[tokio::test]
async fn a_token_at_its_budget_gets_zero_balance_and_nothing_goes_upstream() {
    let h = harness(None).await;
    // 0, 3, 6 and 9 leave room; 12 does not.
    let ids = spend_alices_budget(&h).await;
    assert_eq!(ids.len(), 4);
    let upstream = submits_upstream(&h);
    assert_eq!(upstream, 4);
    // Refused in the caller's format, on either front, and never sent.
    let json = submit(&h, ALICE, true).await.json();
    assert_eq!(json["status"], 0);
    assert_eq!(json["request"], "ERROR_ZERO_BALANCE");
    assert!(
        json["error_text"].as_str().unwrap().contains("budget"),
        "{json}"
    );
    let created = h
        .post(
            "/createTask",
            "application/json",
            format!(
                r#"{{"clientKey":"{ALICE}","task":{{"type":"RecaptchaV2TaskProxyless","websiteURL":"https://x.test","websiteKey":"s"}}}}"#
            )
            .into_bytes(),
        )
        .await
        .json();
    assert_eq!(created["errorId"], 10, "{created}");
    assert_eq!(created["errorCode"], "ERROR_ZERO_BALANCE");
    assert_eq!(submits_upstream(&h), upstream);
    // Bob is unaffected.
    assert!(submit(&h, BOB, false).await.text().starts_with("OK|"));
    // Alice's open tasks are still polled and reported.
    for id in &ids {
        let polled = h
            .get(&format!("/res.php?key={ALICE}&action=get&id={id}"))
            .await
            .text();
        assert_ne!(polled, "ERROR_ZERO_BALANCE", "{polled}");
        assert_ne!(polled, "ERROR_WRONG_CAPTCHA_ID", "{polled}");
    }
    let metrics = h.metrics().await;
    assert_eq!(
        metric(&metrics, "keyrelay_token_spend{token=\"alice\"}"),
        Some(12.0)
    );
    assert_eq!(
        metric(
            &metrics,
            "keyrelay_token_budget_used_ratio{token=\"alice\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &metrics,
            "keyrelay_token_budget_soft_ratio{token=\"alice\"}"
        ),
        Some(0.5)
    );
    // Bob spends too (his one task), with no budget to hold it to.
    assert_eq!(
        metric(&metrics, "keyrelay_token_spend{token=\"bob\"}"),
        Some(3.0)
    );
    assert_eq!(
        metric(&metrics, "keyrelay_token_budget_used_ratio{token=\"bob\"}"),
        None,
        "no budget, no ratio"
    );
    assert_eq!(
        metric(
            &metrics,
            "keyrelay_request_duration_seconds_count{endpoint=\"in\",outcome=\"budget_spent\"}"
        ),
        Some(3.0),
        "the refused plain, json=1 and createTask submits"
    );
    h.stop().await;
}

#[tokio::test]
async fn an_unsolved_task_gives_its_reservation_back() {
    let h = harness(None).await;
    let ids = spend_alices_budget(&h).await;
    h.sim.make_unsolvable(ids[0]);
    let polled = h
        .get(&format!("/res.php?key={ALICE}&action=get&id={}", ids[0]))
        .await
        .text();
    assert_eq!(polled, "ERROR_CAPTCHA_UNSOLVABLE");
    // 9 spent and reserved now: room for one more.
    assert!(submit(&h, ALICE, false).await.text().starts_with("OK|"));
    assert_eq!(submit(&h, ALICE, false).await.text(), "ERROR_ZERO_BALANCE");
    h.stop().await;
}

/// `GET /admin/budgets` with `token` as the bearer.
async fn budgets_with(h: &Harness, token: &str) -> Answer {
    h.send_with_headers(
        hyper::Method::GET,
        "/admin/budgets",
        &[("authorization", &format!("Bearer {token}"))],
        bytes::Bytes::new(),
    )
    .await
}

#[tokio::test]
async fn the_admin_api_and_ctl_list_every_tokens_spend() {
    let h = harness(None).await;
    spend_alices_budget(&h).await;
    let listed = budgets_with(&h, ADMIN).await;
    assert_eq!(listed.status, 200, "{}", listed.text());
    let rows: keyrelay::admin::BudgetList = serde_json::from_slice(&listed.body).unwrap();
    assert_eq!(rows.tokens.len(), 2);
    let alice = &rows.tokens[0];
    assert_eq!(
        (alice.token.as_str(), alice.spend, alice.budget, alice.used),
        ("alice", 12.0, Some(10.0), Some(1.2))
    );
    assert_eq!(alice.budget_kind.as_deref(), Some("spend"));
    assert_eq!(alice.period_secs, 86_400);
    let bob = &rows.tokens[1];
    assert_eq!(
        (bob.token.as_str(), bob.budget, bob.used),
        ("bob", None, None)
    );
    // A caller token is no admin credential.
    let denied = budgets_with(&h, ALICE).await;
    assert_eq!(denied.status, 401, "{}", denied.text());
    let table = keyrelay::ctl::budget_table(&rows.tokens);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["TOKEN", "SPEND", "THREAD-HOURS", "PERIOD", "BUDGET", "USED"]
    );
    let alice_line: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(alice_line[0], "alice");
    assert_eq!(alice_line[1], "12.0000");
    assert_eq!(alice_line[3], "1day");
    assert_eq!(alice_line[4], "10");
    assert_eq!(alice_line[5], "120%");
    h.stop().await;
}

#[tokio::test]
async fn the_counts_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let h = harness(Some(dir.path())).await;
    let ids = spend_alices_budget(&h).await;
    assert_eq!(ids.len(), 4);
    let sim = h.sim.clone();
    h.stop().await;
    assert!(dir.path().join("budgets.json").exists());
    // The same service, a new keyrelay on the same data_dir.
    let config = config(&sim, Some(dir.path()));
    let h = Harness::start(sim, config).await;
    assert_eq!(submit(&h, ALICE, false).await.text(), "ERROR_ZERO_BALANCE");
    let metrics = h.metrics().await;
    assert_eq!(
        metric(&metrics, "keyrelay_token_spend{token=\"alice\"}"),
        Some(12.0)
    );
    // The open tasks' reservations came back too: one unsolved gives its room back.
    h.sim.make_unsolvable(ids[0]);
    let polled = h
        .get(&format!("/res.php?key={ALICE}&action=get&id={}", ids[0]))
        .await
        .text();
    assert_eq!(polled, "ERROR_CAPTCHA_UNSOLVABLE");
    assert!(submit(&h, ALICE, false).await.text().starts_with("OK|"));
    h.stop().await;
}

#[tokio::test]
async fn a_solve_php_task_is_spent_at_its_answer() {
    let h = harness(None).await;
    let solved = h
        .get(&format!(
            "/solve.php?key={ALICE}&method=userrecaptcha&googlekey=s&pageurl=https://x.test"
        ))
        .await
        .text();
    assert!(solved.starts_with("OK|"), "{solved}");
    let metrics = h.metrics().await;
    assert_eq!(
        metric(&metrics, "keyrelay_token_spend{token=\"alice\"}"),
        Some(3.0)
    );
    // From 3, three submits fit (6, 9, then 12 reserved); the fourth is refused.
    for _ in 0..3 {
        assert!(submit(&h, ALICE, false).await.text().starts_with("OK|"));
    }
    assert_eq!(submit(&h, ALICE, false).await.text(), "ERROR_ZERO_BALANCE");
    h.stop().await;
}

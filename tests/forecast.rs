//! The balance forecast fed the way production feeds it: each refresh round
//! (`refresh::refresh_all`, which the background loop runs every `refresh_interval`) reads
//! `getbalance` from the simulator and records it in the key's stats, on paused tokio time.
//! What `/status` and the `KeyrelayBalanceRunsOutSoon` gauge show is then checked minute by
//! minute: learning, spending with its rate and date, a top-up starting again, and flat.

mod common;

use std::time::Duration;

use common::*;
use keyrelay::status::{pool_status, to_json};
use keyrelay::App;

const MINUTE: Duration = Duration::from_secs(60);
const RUNS_OUT: &str = "keyrelay_key_balance_runs_out_seconds{key=\"a\"}";
const SPEND: &str = "keyrelay_key_spend_per_hour{key=\"a\"}";

/// One minute later, the account at `balance`, and the refresh round that reads it.
async fn minute_later_at(app: &App, sim: &keyrelay::sim::SimHandle, balance: f64) {
    tokio::time::advance(MINUTE).await;
    sim.set_balance(KEY_A, balance);
    keyrelay::refresh::refresh_all(app).await;
    assert_eq!(
        app.snapshot().pool.keys()[0].stats.balance(),
        Some(balance),
        "the round read the balance"
    );
}

/// Key a's forecast as `/status` serves it.
fn forecast(app: &App) -> serde_json::Value {
    let status: serde_json::Value =
        serde_json::from_str(&to_json(&pool_status(app))).expect("status is JSON");
    status["keys"][0]["forecast"].clone()
}

#[tokio::test(start_paused = true)]
async fn the_refreshed_balance_gives_the_forecast_minute_by_minute() {
    let sim = sim_with(&[KEY_A]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    config.refresh_interval = MINUTE;
    let app = App::with_seed(config, 7).expect("app builds");

    // The first reading, at 10.
    keyrelay::refresh::refresh_all(&app).await;
    assert_eq!(app.snapshot().pool.keys()[0].stats.balance(), Some(10.0));
    let learning = serde_json::json!({
        "trend": "learning", "spend_per_hour": null, "runs_out_in_seconds": null
    });
    assert_eq!(forecast(&app), learning);

    // 0.1 a minute. Four minutes of readings are too few for a date.
    for minute in 1..=4 {
        minute_later_at(&app, &sim, 10.0 - 0.1 * f64::from(minute)).await;
    }
    assert_eq!(forecast(&app), learning, "four minutes of readings");
    let metrics = app.render_metrics();
    assert_eq!(metric(&metrics, RUNS_OUT), None, "no date, so no alert");
    assert_eq!(metric(&metrics, SPEND), None);

    // Ten minutes: 6 an hour, 9 left, so 90 minutes.
    for minute in 5..=10 {
        minute_later_at(&app, &sim, 10.0 - 0.1 * f64::from(minute)).await;
    }
    let spending = forecast(&app);
    assert_eq!(spending["trend"], "spending", "{spending}");
    let per_hour = spending["spend_per_hour"].as_f64().expect("a rate");
    assert!((per_hour - 6.0).abs() < 1e-9, "{spending}");
    let seconds = spending["runs_out_in_seconds"].as_u64().expect("a date");
    assert!((5399..=5400).contains(&seconds), "{spending}");
    let metrics = app.render_metrics();
    let runs_out = metric(&metrics, RUNS_OUT).expect("the alert's series");
    assert!((runs_out - 5400.0).abs() < 1e-6, "{runs_out}");
    assert!(
        runs_out < 86_400.0,
        "under a day: KeyrelayBalanceRunsOutSoon's condition holds"
    );
    assert!((metric(&metrics, SPEND).expect("the rate") - 6.0).abs() < 1e-9);

    // A top-up: the spend before it says nothing about the new balance's end.
    minute_later_at(&app, &sim, 50.0).await;
    assert_eq!(forecast(&app), learning, "a top-up starts again");
    let metrics = app.render_metrics();
    assert_eq!(metric(&metrics, RUNS_OUT), None, "the old date is gone");
    assert_eq!(metric(&metrics, SPEND), None);

    // Five minutes on at 50, as a thread plan's balance stays: flat, and no date.
    for _ in 1..=5 {
        minute_later_at(&app, &sim, 50.0).await;
    }
    assert_eq!(
        forecast(&app),
        serde_json::json!({"trend": "flat", "spend_per_hour": 0.0, "runs_out_in_seconds": null})
    );
    let metrics = app.render_metrics();
    assert_eq!(metric(&metrics, RUNS_OUT), None, "flat never alerts");
    assert_eq!(metric(&metrics, SPEND), Some(0.0));
}

#[tokio::test(start_paused = true)]
async fn a_failed_read_is_no_reading_and_the_trend_outlives_it() {
    let sim = sim_with(&[KEY_A]).await;
    let config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    let app = App::with_seed(config, 7).expect("app builds");
    keyrelay::refresh::refresh_all(&app).await;
    for minute in 1..=5 {
        minute_later_at(&app, &sim, 10.0 - 0.5 * f64::from(minute)).await;
    }
    let before = forecast(&app);
    assert_eq!(before["trend"], "spending", "{before}");

    // The next getbalance fails: the balance is unknown, not 0, and no reading is added.
    tokio::time::advance(MINUTE).await;
    sim.add_fault(
        KEY_A,
        fault(
            keyrelay::sim::FaultTarget::Poll,
            keyrelay::sim::FaultKind::Status(502),
            Some(1),
        ),
    );
    keyrelay::refresh::refresh_all(&app).await;
    assert_eq!(app.snapshot().pool.keys()[0].stats.balance(), None);
    assert_eq!(forecast(&app), before, "the readings before it still stand");

    // The next good read continues the same trend: 0.5 a minute, 30 an hour.
    minute_later_at(&app, &sim, 6.5).await;
    let after = forecast(&app);
    let per_hour = after["spend_per_hour"].as_f64().expect("a rate");
    assert!((per_hour - 30.0).abs() < 1e-9, "{after}");
}

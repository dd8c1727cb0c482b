//! The Rust formula and the PromQL one agree: for each scenario, `scaling::recommend()`'s
//! answer (what `/scaling` says) is what `keyrelay:workers_wanted:instant` evaluates to in
//! `promtool` over the gauges keyrelay publishes for the same figures. The gauges are
//! rendered by the real `Metrics::render`, so a rename or a changed label on either side
//! is a failure here, not a silent zero on a dashboard. docs/scaling.md's copy of the rule
//! is held to the shipped one too.
//!
//! Needs `promtool` (Debian package `prometheus`). Without it the test skips with a
//! message, except under CI (`CI` set), where it fails: CI must run it.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use keyrelay::config::{Config, Upstream};
use keyrelay::metrics::{Metrics, Scene};
use keyrelay::pins::MemoryPins;
use keyrelay::scaling::{recommend, PoolFigures, Scaling};
use keyrelay::App;

const SHIPPED_RULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/prometheus/alerts.yml");

/// The recording rules this test holds to the Rust formula, in `keyrelay-scaling`.
const RULES: [&str; 3] = [
    "keyrelay:scaling_brake",
    "keyrelay:workers_wanted:instant",
    "keyrelay:workers_wanted",
];

/// One pool state: the figures every replica shares (the fleet's threads and balance),
/// each replica's own queue (one entry for an instance alone), and the brake.
struct Case {
    name: &'static str,
    threads_total: u64,
    threads_in_use: u64,
    queues: &'static [u64],
    balance_total: Option<f64>,
    brake_balance: f64,
}

impl Case {
    fn figures(&self, queued: u64) -> PoolFigures {
        PoolFigures {
            threads_total: self.threads_total,
            threads_in_use: self.threads_in_use,
            queued,
            balance_total: self.balance_total,
        }
    }

    /// The case's name as a `job` label.
    fn job(&self) -> String {
        let words: Vec<&str> = self
            .name
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|w| !w.is_empty())
            .collect();
        words.join("-")
    }

    /// The recommendation for the whole pool: alone, what `/scaling` answers; for a fleet,
    /// `recommend()` over the fleet's figures and every replica's queue, the aggregate
    /// docs/scaling.md describes (each replica's own `/scaling` counts only its queue).
    fn expected(&self) -> Scaling {
        recommend(self.figures(self.queues.iter().sum()), self.brake_balance)
    }
}

const CASES: &[Case] = &[
    Case {
        name: "busy pool with a queue: its solvers and its waiters",
        threads_total: 10,
        threads_in_use: 6,
        queues: &[3],
        balance_total: Some(50.0),
        brake_balance: 5.0,
    },
    Case {
        name: "idle pool: none",
        threads_total: 10,
        threads_in_use: 0,
        queues: &[0],
        balance_total: Some(50.0),
        brake_balance: 5.0,
    },
    Case {
        name: "a benched key: fewer threads, and the queue cannot buy more",
        threads_total: 6,
        threads_in_use: 6,
        queues: &[8],
        balance_total: Some(50.0),
        brake_balance: 5.0,
    },
    Case {
        name: "no key in rotation: nothing to work with, however long the queue",
        threads_total: 0,
        threads_in_use: 0,
        queues: &[8],
        balance_total: Some(0.0),
        brake_balance: 0.0,
    },
    Case {
        name: "balance below the brake: only the workers solving",
        threads_total: 10,
        threads_in_use: 4,
        queues: &[6],
        balance_total: Some(4.99),
        brake_balance: 5.0,
    },
    Case {
        name: "balance at the brake exactly: no brake",
        threads_total: 10,
        threads_in_use: 4,
        queues: &[6],
        balance_total: Some(5.0),
        brake_balance: 5.0,
    },
    Case {
        name: "balance unknown: never brakes",
        threads_total: 10,
        threads_in_use: 4,
        queues: &[2],
        balance_total: None,
        brake_balance: 5.0,
    },
    Case {
        name: "a zero brake never brakes, even on a zero balance",
        threads_total: 10,
        threads_in_use: 4,
        queues: &[2],
        balance_total: Some(0.0),
        brake_balance: 0.0,
    },
    Case {
        name: "in use above the threads: all of them",
        threads_total: 4,
        threads_in_use: 7,
        queues: &[0],
        balance_total: None,
        brake_balance: 0.0,
    },
    Case {
        name: "in use above the threads under the brake: still no more than the threads",
        threads_total: 4,
        threads_in_use: 7,
        queues: &[3],
        balance_total: Some(1.0),
        brake_balance: 5.0,
    },
    Case {
        name: "queue larger than the free threads: capped at the threads",
        threads_total: 10,
        threads_in_use: 8,
        queues: &[5],
        balance_total: Some(50.0),
        brake_balance: 0.0,
    },
    Case {
        name: "a fleet of two: the fleet's threads once, both queues",
        threads_total: 10,
        threads_in_use: 6,
        queues: &[1, 2],
        balance_total: Some(50.0),
        brake_balance: 5.0,
    },
    Case {
        name: "a fleet of two under the brake: the fleet's solvers only",
        threads_total: 10,
        threads_in_use: 6,
        queues: &[4, 4],
        balance_total: Some(2.0),
        brake_balance: 5.0,
    },
];

/// The series a rule reads: every `keyrelay_…` metric name in its expression.
fn metrics_read_by(rules: &str, record: &str) -> Vec<String> {
    let start = rules
        .find(&format!("- record: {record}\n"))
        .unwrap_or_else(|| panic!("{SHIPPED_RULES} records no {record}"));
    let body = &rules[start..];
    let expr = body.find("expr:").expect("a record has an expression");
    // The expression is the `expr:` line and the lines indented below it.
    let indent = body[..expr].rsplit('\n').next().map_or(0, str::len);
    let mut lines = body[expr..].lines();
    let first = lines.next().unwrap_or("");
    let rest = lines
        .take_while(|line| line.trim().is_empty() || line.len() - line.trim_start().len() > indent);
    let mut names: Vec<String> = std::iter::once(first)
        .chain(rest)
        .flat_map(|line| line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')))
        .filter(|word| word.starts_with("keyrelay_"))
        .map(str::to_owned)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The exposition keyrelay serves for a replica whose `/scaling` answer is `scaling`.
fn rendered(pool_app: &App, scaling: Scaling, brake_balance: f64) -> String {
    let metrics = Metrics::new().expect("metrics register");
    let pins = MemoryPins::new(Duration::from_secs(60), 16);
    metrics.render(
        &pool_app.snapshot().pool,
        &pins,
        Scene {
            scaling,
            brake_balance,
            paused: false,
            cluster: None,
            now: tokio::time::Instant::now(),
        },
    )
}

/// The samples of `names` in `text` as `(name, labels inside the braces, value)`.
fn samples<'a>(text: &'a str, names: &[String]) -> Vec<(&'a str, &'a str, &'a str)> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.strip_suffix('}')?),
                None => (series, ""),
            };
            names
                .iter()
                .any(|n| n == name)
                .then_some((name, labels, value))
        })
        .collect()
}

/// A promtool unit-test file: each case's published gauges held for 15 minutes, and each
/// recording rule's expected sample from `recommend()`.
fn promtool_tests(cases: &[Case], app: &App, names: &[String], seen: &mut Vec<String>) -> String {
    let mut out = format!(
        "# Generated by tests/scaling_rules.rs from scaling::recommend().\n\
         rule_files:\n  - {SHIPPED_RULES}\nevaluation_interval: 1m\ntests:\n"
    );
    for case in cases {
        // promtool's failure report shows the labels, not the test's name: the job says
        // which case disagreed.
        let job = case.job();
        let _ = write!(
            out,
            "  - name: {:?}\n    interval: 1m\n    input_series:\n",
            case.name
        );
        for (replica, &queued) in case.queues.iter().enumerate() {
            let published = recommend(case.figures(queued), case.brake_balance);
            let mut text = rendered(app, published, case.brake_balance);
            if case.queues.len() > 1 {
                // In cluster mode render_scaling labels the same gauges scope="fleet";
                // the rules read them by job, whatever the scope.
                text = text.replace("scope=\"pool\"", "scope=\"fleet\"");
            }
            for (name, labels, value) in samples(&text, names) {
                seen.push(name.to_owned());
                let comma = if labels.is_empty() { "" } else { "," };
                let _ = write!(
                    out,
                    "      - series: '{name}{{job=\"{job}\",instance=\"kr-{replica}\"{comma}{labels}}}'\n        values: '{value}x15'\n"
                );
            }
        }
        let want = case.expected();
        out.push_str("    promql_expr_test:\n");
        for rule in ["keyrelay:workers_wanted:instant", "keyrelay:workers_wanted"] {
            let _ = write!(
                out,
                "      - expr: '{rule}'\n        eval_time: 12m\n        exp_samples:\n          - labels: '{rule}{{job=\"{job}\"}}'\n            value: {}\n",
                want.workers_wanted
            );
        }
        // Absent while the balance is unknown, so that it never brakes.
        let brake = match want.balance_total {
            Some(_) => format!(
                "\n          - labels: 'keyrelay:scaling_brake{{job=\"{job}\"}}'\n            value: {}",
                u8::from(want.brake)
            ),
            None => " []".to_owned(),
        };
        let _ = writeln!(
            out,
            "      - expr: 'keyrelay:scaling_brake'\n        eval_time: 12m\n        exp_samples:{brake}"
        );
    }
    out
}

#[test]
fn recommend_and_the_recording_rule_agree_on_every_scenario() {
    let rules = std::fs::read_to_string(SHIPPED_RULES).expect("alerts.yml reads");
    let mut names: Vec<String> = RULES
        .iter()
        .flat_map(|rule| metrics_read_by(&rules, rule))
        .collect();
    names.sort();
    names.dedup();
    assert!(
        names.iter().any(|n| n == "keyrelay_pool_threads"),
        "the rules read no thread gauge: {names:?}"
    );

    let upstream = Upstream::parse("http://127.0.0.1:9").expect("literal");
    let app = App::new(Config::for_keys(upstream, Vec::new())).expect("app builds");
    let mut seen = Vec::new();
    let tests = promtool_tests(CASES, &app, &names, &mut seen);
    // Every gauge the rules read is one keyrelay publishes: a name only the rule knows
    // would evaluate to nothing and pass every case that expects nothing.
    for name in &names {
        assert!(
            seen.contains(name),
            "the rules read {name}, which keyrelay does not publish"
        );
    }

    let Some(promtool) = promtool_binary() else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("scaling_rules_test.yml");
    std::fs::write(&file, &tests).expect("test file written");
    let out = Command::new(&promtool)
        .arg("test")
        .arg("rules")
        .arg(&file)
        .output()
        .expect("promtool runs");
    assert!(
        out.status.success(),
        "recommend() and keyrelay:workers_wanted:instant disagree:\n{}{}\ngenerated tests:\n{tests}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A case whose expectation is wrong must fail in promtool: the agreement above is
/// promtool's verdict, not a file it could not read or a test it did not run.
#[test]
fn a_wrong_expectation_fails_in_promtool() {
    let Some(promtool) = promtool_binary() else {
        return;
    };
    let rules = std::fs::read_to_string(SHIPPED_RULES).expect("alerts.yml reads");
    let names = metrics_read_by(&rules, "keyrelay:workers_wanted:instant");
    let upstream = Upstream::parse("http://127.0.0.1:9").expect("literal");
    let app = App::new(Config::for_keys(upstream, Vec::new())).expect("app builds");
    let mut seen = Vec::new();
    let good = promtool_tests(&CASES[..1], &app, &names, &mut seen);
    let want = format!("value: {}\n", CASES[0].expected().workers_wanted);
    assert!(good.contains(&want), "{good}");
    let wrong = good.replacen(
        &want,
        &format!("value: {}\n", CASES[0].expected().workers_wanted + 1),
        1,
    );
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("wrong_test.yml");
    std::fs::write(&file, &wrong).expect("test file written");
    let out = Command::new(&promtool)
        .arg("test")
        .arg("rules")
        .arg(&file)
        .output()
        .expect("promtool runs");
    assert!(
        !out.status.success(),
        "promtool passed a wrong value:\n{wrong}"
    );
}

#[test]
fn the_rules_read_the_pool_gauges_and_the_queue() {
    let rules = std::fs::read_to_string(SHIPPED_RULES).expect("alerts.yml reads");
    assert_eq!(
        metrics_read_by(&rules, "keyrelay:workers_wanted:instant"),
        [
            "keyrelay_pool_threads",
            "keyrelay_pool_threads_in_use",
            "keyrelay_queue_length"
        ]
    );
    assert_eq!(
        metrics_read_by(&rules, "keyrelay:scaling_brake"),
        ["keyrelay_pool_balance", "keyrelay_scaling_brake_balance"]
    );
}

/// The `promtool` binary, or `None` after a skip message; fails under CI.
fn promtool_binary() -> Option<PathBuf> {
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
    match locate_promtool(std::env::var_os("PATH").as_deref(), ci) {
        Ok(found) => found,
        Err(message) => panic!("{message}"),
    }
}

/// Finds `promtool` on `path`. Missing is a skip (with a message on stderr) unless `ci`,
/// where it is an error: the agreement check must not silently vanish from CI.
fn locate_promtool(path: Option<&OsStr>, ci: bool) -> Result<Option<PathBuf>, String> {
    let found = path
        .map(std::env::split_paths)
        .into_iter()
        .flatten()
        .map(|dir| dir.join("promtool"))
        .find(|candidate| candidate.is_file());
    match found {
        Some(binary) => Ok(Some(binary)),
        None if ci => Err(
            "CI is set but `promtool` is not on PATH: CI must run the scaling rule agreement \
             test (.ci/run installs Debian's `prometheus` package, which ships it)"
                .to_owned(),
        ),
        None => {
            eprintln!(
                "SKIPPED scaling_rules: no `promtool` on PATH. Install Debian's `prometheus` \
                 package to run it (CI always does)."
            );
            Ok(None)
        }
    }
}

#[test]
fn a_missing_promtool_skips_locally_and_fails_under_ci() {
    let empty = tempfile::tempdir().expect("a temporary directory");
    let path = empty.path().as_os_str();
    assert_eq!(locate_promtool(Some(path), false), Ok(None));
    assert_eq!(locate_promtool(None, false), Ok(None));
    let error = locate_promtool(Some(path), true).expect_err("CI must not skip");
    assert!(
        error.starts_with("CI is set but `promtool` is not on PATH"),
        "{error}"
    );
    assert!(locate_promtool(None, true).is_err());

    let with_binary = tempfile::tempdir().expect("a temporary directory");
    let binary = with_binary.path().join("promtool");
    std::fs::write(&binary, "").expect("fake binary written");
    let path = std::env::join_paths([empty.path(), with_binary.path()]).expect("joinable");
    assert_eq!(locate_promtool(Some(&path), true), Ok(Some(binary)));
}

/// docs/scaling.md shows the fleet's formula as the rule computes it: the shown expression is
/// the shipped one, up to whitespace, so the page cannot drift from what Prometheus records.
#[test]
fn docs_show_the_rule_as_shipped() {
    let squeeze = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
    let rules = std::fs::read_to_string(SHIPPED_RULES).expect("alerts.yml reads");
    let start = rules
        .find("- record: keyrelay:workers_wanted:instant\n")
        .expect("the rule");
    let expr = &rules[start..];
    let expr = &expr[expr.find("expr: >-\n").expect("a folded expression") + 9..];
    let end = expr.find("\n\n").expect("a blank line after the rule");
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/scaling.md"))
        .expect("docs/scaling.md reads");
    let shown = &docs[docs.find("```promql\n").expect("a PromQL block") + 10..];
    let shown = &shown[..shown.find("```").expect("the block ends")];
    assert_eq!(squeeze(shown), squeeze(&expr[..end]));
}

//! What a caller token may spend (`budget` on `[[access.tokens]]`) and what tasks cost
//! (`[prices.<provider>]`, per 1,000 tasks by `in.php` method), in the one currency budgets
//! are written in.

use std::collections::HashMap;
use std::time::Duration;

use toml::Value;

use super::problems::{a_type, Problems};
use super::units::{duration, Zero};
use crate::provider::Provider;

pub const DEFAULT_BUDGET_PERIOD: Duration = Duration::from_secs(30 * 24 * 60 * 60);
pub const DEFAULT_BUDGET_SOFT: f64 = 0.8;

/// A token's budget over a rolling window of `period`.
#[derive(Clone, Debug, PartialEq)]
pub struct Budget {
    pub limit: BudgetLimit,
    pub period: Duration,
    /// The share of `limit` at which `KeyrelayTokenBudgetSoft` fires, in (0, 1].
    pub soft: f64,
}

/// What a budget counts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BudgetLimit {
    /// Money: the price of each task submitted, in the prices' currency.
    Spend(f64),
    /// Thread-hours: the time the token's tasks held a thread, over 3,600 seconds.
    ThreadHours(f64),
}

impl BudgetLimit {
    pub fn amount(self) -> f64 {
        match self {
            BudgetLimit::Spend(amount) | BudgetLimit::ThreadHours(amount) => amount,
        }
    }
}

/// `[prices.<provider>]`: per provider, the price of 1,000 tasks of each method.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Prices {
    by_provider: HashMap<Provider, HashMap<String, f64>>,
}

impl Prices {
    /// The price of one task of `method` at `provider`, if the table has one. Methods are
    /// compared without case, as the services read them.
    pub fn per_task(&self, provider: Provider, method: &str) -> Option<f64> {
        let method = method.trim().to_ascii_lowercase();
        self.by_provider
            .get(&provider)?
            .get(&method)
            .map(|per_thousand| per_thousand / 1000.0)
    }

    pub fn is_empty(&self) -> bool {
        self.by_provider.is_empty()
    }

    /// Sets the price of 1,000 tasks of `method` at `provider`.
    pub fn set(&mut self, provider: Provider, method: &str, per_thousand: f64) {
        self.by_provider
            .entry(provider)
            .or_default()
            .insert(method.trim().to_ascii_lowercase(), per_thousand);
    }
}

/// A number of 0 or more; `None` (with the problem) otherwise.
fn amount(p: &mut Problems, path: &str, value: &Value) -> Option<f64> {
    let number = match value {
        Value::Float(f) => *f,
        Value::Integer(i) => *i as f64,
        other => {
            p.add(path, format!("must be a number, got {}", a_type(other)));
            return None;
        }
    };
    if number.is_finite() && number >= 0.0 {
        Some(number)
    } else {
        p.add(path, format!("must be a finite number >= 0, got {number}"));
        None
    }
}

/// `budget = { spend = …, period = …, soft = … }` or `{ thread_hours = …, … }`.
pub(super) fn budget(p: &mut Problems, path: &str, raw: Value) -> Option<Budget> {
    let Value::Table(mut table) = raw else {
        p.add(
            path,
            format!(
                "must be a table such as {{ spend = 50.0, period = \"30d\" }}, got {}",
                a_type(&raw)
            ),
        );
        return None;
    };
    let spend = table.remove("spend");
    let hours = table.remove("thread_hours");
    let period = table.remove("period");
    let soft = table.remove("soft");
    if let Some(unknown) = table.keys().next() {
        p.add(
            path,
            format!(
                "unknown field {unknown:?}; a budget has spend or thread_hours, period and soft"
            ),
        );
        return None;
    }
    let limit = match (spend, hours) {
        (Some(spend), None) => BudgetLimit::Spend(positive(p, &format!("{path}.spend"), &spend)?),
        (None, Some(hours)) => {
            BudgetLimit::ThreadHours(positive(p, &format!("{path}.thread_hours"), &hours)?)
        }
        (Some(_), Some(_)) => {
            p.add(path, "has both spend and thread_hours; give one");
            return None;
        }
        (None, None) => {
            p.add(path, "needs spend = <amount> or thread_hours = <hours>");
            return None;
        }
    };
    let period = duration(
        p,
        &format!("{path}.period"),
        period,
        DEFAULT_BUDGET_PERIOD,
        Zero::Rejected,
    );
    let soft = match soft {
        None => DEFAULT_BUDGET_SOFT,
        Some(value) => match amount(p, &format!("{path}.soft"), &value)? {
            soft if soft > 0.0 && soft <= 1.0 => soft,
            soft => {
                p.add(
                    format!("{path}.soft"),
                    format!("must be a share above 0 and at most 1, got {soft}"),
                );
                return None;
            }
        },
    };
    Some(Budget {
        limit,
        period,
        soft,
    })
}

fn positive(p: &mut Problems, path: &str, value: &Value) -> Option<f64> {
    match amount(p, path, value)? {
        0.0 => {
            p.add(path, "must be above 0");
            None
        }
        amount => Some(amount),
    }
}

/// `[prices.<provider>]` tables: `method = <price of 1,000 tasks>`.
pub(super) fn prices(p: &mut Problems, raw: Option<Value>) -> Prices {
    let mut prices = Prices::default();
    let Some(raw) = raw else {
        return prices;
    };
    let Value::Table(providers) = raw else {
        p.add(
            "prices",
            format!(
                "must be tables such as [prices.2captcha], got {}",
                a_type(&raw)
            ),
        );
        return prices;
    };
    for (name, methods) in providers {
        let path = format!("prices.{name}");
        let Some(provider) = Provider::from_name(&name) else {
            p.add(
                &path,
                format!("{name:?} is no provider; one of {}", Provider::names()),
            );
            continue;
        };
        let Value::Table(methods) = methods else {
            p.add(
                &path,
                format!(
                    "must be a table of method = price of 1,000 tasks, got {}",
                    a_type(&methods)
                ),
            );
            continue;
        };
        for (method, price) in methods {
            if let Some(price) = amount(p, &format!("{path}.{method}"), &price) {
                prices.set(provider, &method, price);
            }
        }
    }
    prices
}

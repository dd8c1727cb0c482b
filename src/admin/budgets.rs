//! The admin API's view of what caller tokens spend: one row per token, with its spend and
//! thread-hours over its budget's period and how much of the budget that is. The same type
//! is read back by `keyrelay ctl budgets`.

use serde::{Deserialize, Serialize};

use crate::budgets::Budgets;
use crate::config::{BudgetLimit, DEFAULT_BUDGET_PERIOD};
use crate::tokens::Token;

/// `GET /admin/budgets`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BudgetList {
    pub tokens: Vec<BudgetRow>,
}

/// One caller token's spend.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BudgetRow {
    pub token: String,
    /// Settled and reserved spend over `period_secs`, in the `[prices]` currency.
    pub spend: f64,
    /// Thread-hours its tasks held over `period_secs`, the open ones so far included.
    pub thread_hours: f64,
    /// The budget's window (30 days for a token without a budget).
    pub period_secs: u64,
    /// `spend` or `thread_hours`; `null`: no budget.
    pub budget_kind: Option<String>,
    /// The budget's amount, in its kind's unit.
    pub budget: Option<f64>,
    /// Its use: 0 to 1; at 1 new submits are refused.
    pub used: Option<f64>,
    /// The share at which `KeyrelayTokenBudgetSoft` fires.
    pub soft: Option<f64>,
}

impl BudgetRow {
    /// `token`'s row at `now` (unix ms).
    pub fn of(budgets: &Budgets, token: &Token, now: u64) -> BudgetRow {
        let budget = token.budget.as_ref();
        let period = budget.map_or(DEFAULT_BUDGET_PERIOD, |b| b.period);
        let usage = budgets.usage(&token.name, period, now);
        BudgetRow {
            token: token.name.to_string(),
            spend: usage.spend,
            thread_hours: usage.thread_hours,
            period_secs: period.as_secs(),
            budget_kind: budget.map(|b| match b.limit {
                BudgetLimit::Spend(_) => "spend".to_owned(),
                BudgetLimit::ThreadHours(_) => "thread_hours".to_owned(),
            }),
            budget: budget.map(|b| b.limit.amount()),
            used: budget.map(|b| usage.ratio(b)),
            soft: budget.map(|b| b.soft),
        }
    }
}

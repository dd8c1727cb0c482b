//! `budget` on `[[access.tokens]]` and `[prices.<provider>]`: the forms the issue names,
//! the defaults (30 days, soft at 0.8), and a message naming the field for each mistake.

use super::*;

/// Tokens need an admin token beside them (the exposure rule).
const ADMIN: &str = "[admin]\ntoken = \"admin-token-000000000000000000001\"\n";

fn token_with(budget: &str) -> String {
    format!(
        "{}{ADMIN}[[access.tokens]]\nname = \"client-a\"\ntoken = \"token-client-a-0000000000000001\"\nbudget = {budget}\n",
        one_key()
    )
}

const PATH: &str = "access.tokens[0] (\"client-a\").budget";

#[test]
fn a_spend_or_thread_hours_budget_is_read_with_its_period_and_soft_share() {
    let config = parse(&token_with(
        "{ spend = 50.0, period = \"30d\", soft = 0.8 }",
    ));
    assert_eq!(
        config.access.tokens[0].budget,
        Some(Budget {
            limit: BudgetLimit::Spend(50.0),
            period: Duration::from_secs(30 * 86_400),
            soft: 0.8,
        })
    );
    let config = parse(&token_with("{ thread_hours = 720 }"));
    assert_eq!(
        config.access.tokens[0].budget,
        Some(Budget {
            limit: BudgetLimit::ThreadHours(720.0),
            period: DEFAULT_BUDGET_PERIOD,
            soft: DEFAULT_BUDGET_SOFT,
        })
    );
    assert_eq!(DEFAULT_BUDGET_SOFT, 0.8);
    let without = format!(
        "{}{ADMIN}[[access.tokens]]\nname = \"b\"\ntoken = \"token-client-b-0000000000000002\"\n",
        one_key()
    );
    assert_eq!(parse(&without).access.tokens[0].budget, None);
}

#[test]
fn a_wrong_budget_is_refused_with_the_field_named() {
    for (budget, problem) in [
        ("50", format!("{PATH}: must be a table such as {{ spend = 50.0, period = \"30d\" }}, got an integer")),
        ("{ period = \"30d\" }", format!("{PATH}: needs spend = <amount> or thread_hours = <hours>")),
        ("{ spend = 1.0, thread_hours = 2.0 }", format!("{PATH}: has both spend and thread_hours; give one")),
        ("{ spend = 0 }", format!("{PATH}.spend: must be above 0")),
        ("{ spend = -5.0 }", format!("{PATH}.spend: must be a finite number >= 0, got -5")),
        ("{ spend = \"5\" }", format!("{PATH}.spend: must be a number, got a string")),
        ("{ spend = 5.0, period = \"0s\" }", format!("{PATH}.period: must be greater than 0")),
        ("{ spend = 5.0, soft = 1.5 }", format!("{PATH}.soft: must be a share above 0 and at most 1, got 1.5")),
        ("{ spend = 5.0, limit = 3 }", format!("{PATH}: unknown field \"limit\"; a budget has spend or thread_hours, period and soft")),
    ] {
        assert_problem(&token_with(budget), &problem);
    }
}

#[test]
fn prices_are_per_1000_tasks_by_provider_and_method() {
    let config = parse(&format!(
        "{}[prices.2captcha]\nuserrecaptcha = 2.99\nbase64 = 1\n[prices.captchaai]\nturnstile = 0.5\n",
        one_key()
    ));
    let per_task = |provider, method| config.prices.per_task(provider, method);
    assert_eq!(
        per_task(Provider::TwoCaptcha, "userrecaptcha"),
        Some(0.00299)
    );
    assert_eq!(
        per_task(Provider::TwoCaptcha, "UserReCaptcha"),
        Some(0.00299)
    );
    assert_eq!(per_task(Provider::TwoCaptcha, "base64"), Some(0.001));
    assert_eq!(per_task(Provider::CaptchaAi, "turnstile"), Some(0.0005));
    assert_eq!(per_task(Provider::CaptchaAi, "base64"), None);
    assert_eq!(per_task(Provider::RuCaptcha, "base64"), None);
    assert!(parse(&one_key()).prices.is_empty());
}

#[test]
fn a_wrong_price_table_is_refused_with_the_field_named() {
    assert_problem(
        &format!("{}[prices.nowhere]\nbase64 = 1\n", one_key()),
        &format!(
            "prices.nowhere: \"nowhere\" is no provider; one of {}",
            Provider::names()
        ),
    );
    assert_problem(
        &format!("{}[prices.2captcha]\nbase64 = \"cheap\"\n", one_key()),
        "prices.2captcha.base64: must be a number, got a string",
    );
    assert_problem(
        &format!("{}[prices]\n2captcha = 3\n", one_key()),
        "prices.2captcha: must be a table of method = price of 1,000 tasks, got an integer",
    );
}

//! `keyrelay ctl`: the admin API's client, from the command line's action to
//! `keyrelay::ctl`'s.

use super::ConfigPath;
use crate::CtlAction;

/// Calls the admin API found from `--url` or the config, and prints its answer.
pub async fn ctl(source: &ConfigPath, url: Option<&str>, action: CtlAction) -> anyhow::Result<()> {
    use keyrelay::ctl::{Action, Target};
    let env = |name: &str| std::env::var(name).ok();
    let target = match (url, source) {
        (Some(url), ConfigPath::Given(path)) => Target::from_url(url, Some(path), &env)?,
        (Some(url), ConfigPath::Default) => Target::from_url(url, None, &env)?,
        (None, source) => Target::from_config(source.path(), &env)?,
    };
    let action = match action {
        CtlAction::Keys => Action::Keys,
        CtlAction::Budgets => Action::Budgets,
        CtlAction::Disable { name } => Action::Disable(name),
        CtlAction::Enable { name } => Action::Enable(name),
        CtlAction::Drain { name } => Action::Drain(name),
        CtlAction::Refresh { name } => Action::Refresh(name),
    };
    print!("{}", keyrelay::ctl::run(&target, &action).await?);
    Ok(())
}

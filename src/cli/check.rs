//! `keyrelay check`: validates the config and prints the pool (never the keys), and with
//! `--online` asks the upstream about every key.

use keyrelay::Config;

use super::{load_config, ConfigPath};

/// Loads the config as keyrelay would at start, prints it, and with `online` fails unless
/// the upstream finds enough keys usable.
pub async fn check(config: &ConfigPath, online: bool) -> anyhow::Result<()> {
    let loaded = load_config(config)?;
    // Read as keyrelay reads it at start, so that a bad bundle fails here first.
    keyrelay::upstream::roots::configured(loaded.upstream_ca.as_deref())?;
    println!("{} is valid", config.path().display());
    print!("{}", loaded.summary());
    if online {
        check_online(&loaded).await?;
    }
    Ok(())
}

/// `keyrelay check --online`: the upstream's table of the keys, and an error (so a
/// non-zero exit) when fewer than two are usable.
async fn check_online(config: &Config) -> anyhow::Result<()> {
    use keyrelay::online_check::{self, MIN_USABLE};
    let report = online_check::run(config).await?;
    println!();
    print!("{}", report.render());
    anyhow::ensure!(
        report.passes(),
        "only {} usable key(s) of {}: keyrelay needs at least {MIN_USABLE} to fail over \
         (the KeyrelayFewerThanTwoKeysActive alert's threshold)",
        report.usable(),
        report.rows.len()
    );
    Ok(())
}

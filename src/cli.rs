//! The binary's subcommands, one file each, and what they share: where the config comes
//! from and how a failure to load it is told. `main.rs` only parses the command line and
//! picks one of these.

mod ca;
mod check;
mod ctl;
mod serve;
mod simulate;

use std::path::{Path, PathBuf};

use keyrelay::config::ConfigError;
use keyrelay::Config;

pub use ca::ca;
pub use check::check;
pub use ctl::ctl;
pub use serve::serve;
pub use simulate::simulate;

/// The file a bare `keyrelay` (or `keyrelay check`) reads: the README's first run starts
/// from the directory that holds the shipped `proxy.toml`.
const DEFAULT_CONFIG: &str = "proxy.toml";

/// Where the config comes from: `--config`, or the default file, which may well be missing
/// for someone who just installed keyrelay.
pub enum ConfigPath {
    Given(PathBuf),
    Default,
}

impl ConfigPath {
    fn path(&self) -> &Path {
        match self {
            ConfigPath::Given(path) => path,
            ConfigPath::Default => Path::new(DEFAULT_CONFIG),
        }
    }
}

/// Loads the config, with an error that names the file once. `ConfigError`'s messages
/// already carry their cause, so it is flattened rather than chained, which would print the
/// cause twice. A missing default file gets a hint instead of a bare "No such file": that is
/// what a new user running `keyrelay` outside the repository meets first.
fn load_config(source: &ConfigPath) -> anyhow::Result<Config> {
    let path = source.path();
    Config::load(path).map_err(|e| match (&e, source) {
        (ConfigError::Io { source: io, .. }, ConfigPath::Default)
            if io.kind() == std::io::ErrorKind::NotFound =>
        {
            let here = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
            anyhow::anyhow!(
                "no {DEFAULT_CONFIG} in {}: pass --config PATH, start keyrelay where its \
                 {DEFAULT_CONFIG} is, or try `keyrelay demo`, which needs no config",
                here.display()
            )
        }
        (ConfigError::Io { .. }, _) => anyhow::anyhow!("{e}"),
        _ => anyhow::anyhow!("{}: {e}", path.display()),
    })
}

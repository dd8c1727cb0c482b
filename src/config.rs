//! proxy.toml (stub, being written).
pub struct Config;

//! The machine's name, read once where it is needed: the local CA's name and a cluster
//! replica's default name.

/// The host name, trimmed and at most `max` characters; `None` if the system gives none.
pub fn name(max: usize) -> Option<String> {
    let from_file = |path: &str| std::fs::read_to_string(path).ok();
    from_file("/proc/sys/kernel/hostname")
        .or_else(|| from_file("/etc/hostname"))
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|name| name.trim().chars().take(max).collect::<String>())
        .filter(|name| !name.is_empty())
}

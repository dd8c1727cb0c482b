//! The identity every store uses for a key: health, pins and thread counts refer to keys by
//! [`KeyId`], never by name or secret.

/// A key's identity within the process. The registry (`registry::KeyRegistry::admit`) hands
/// one out when a key is first configured and gives the same id back on every reload that
/// keeps the key's name, value and upstream, whatever its place in the file; a key removed
/// from the config keeps its id, so the tasks it created can still be polled with it. Ids
/// are never reused within a process, so pins and health cannot pass to another key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub u16);

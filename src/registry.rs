//! Every key this process has served, under an id that stays the same across reloads. The
//! pool of the moment is a view over it: a key removed from the config leaves rotation but
//! stays here, so the tasks it created can still be polled with it.

use std::sync::{Arc, RwLock};

use crate::config::KeyConfig;
use crate::key_id::KeyId;
use crate::pool::KeyEntry;

/// Why keys could not be admitted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "more than {} distinct keys since start; restart keyrelay to reclaim ids",
    u16::MAX
)]
pub struct RegistryFull;

/// Keys by stable id.
#[derive(Default)]
pub struct KeyRegistry {
    /// Indexed by `KeyId`; never shrinks. Read on every poll, written on reload only, so an
    /// `RwLock` (std: it is never held across an await).
    entries: RwLock<Vec<Arc<KeyEntry>>>,
}

impl KeyRegistry {
    pub fn new() -> KeyRegistry {
        KeyRegistry::default()
    }

    /// Entries for a config's keys, in config order. A key whose name, value, provider and
    /// upstream are already known keeps its id and what keyrelay learned about it (balance, threads,
    /// last error; health is kept by id); its weight and threads come from the new config.
    /// Any other key gets a new id.
    ///
    /// # Errors
    /// [`RegistryFull`] once 65,535 distinct keys have been admitted.
    pub fn admit(&self, keys: &[KeyConfig]) -> Result<Vec<Arc<KeyEntry>>, RegistryFull> {
        let mut entries = self.entries.write().expect("registry lock poisoned");
        let mut admitted = Vec::with_capacity(keys.len());
        for config in keys {
            let known = entries
                .iter()
                .rev()
                .find(|e| {
                    e.name == config.name
                        && e.key == config.key
                        && e.provider == config.provider
                        && e.upstream == config.upstream
                })
                .cloned();
            let entry = match known {
                Some(old) => Arc::new(KeyEntry::reconfigured(&old, config)),
                None => {
                    let id = u16::try_from(entries.len()).map_err(|_| RegistryFull)?;
                    let entry = Arc::new(KeyEntry::from_config(KeyId(id), config));
                    entries.push(entry.clone());
                    entry
                }
            };
            entries[usize::from(entry.id.0)] = entry.clone();
            admitted.push(entry);
        }
        Ok(admitted)
    }

    /// The key with this id, current or retired.
    pub fn get(&self, id: KeyId) -> Option<Arc<KeyEntry>> {
        let entries = self.entries.read().expect("registry lock poisoned");
        entries.get(usize::from(id.0)).cloned()
    }

    /// The most recently admitted key with this name.
    pub fn id_of(&self, name: &str) -> Option<KeyId> {
        let entries = self.entries.read().expect("registry lock poisoned");
        entries.iter().rev().find(|e| e.name == name).map(|e| e.id)
    }

    /// Keys ever admitted.
    pub fn len(&self) -> usize {
        self.entries.read().expect("registry lock poisoned").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Upstream;

    fn key(name: &str, value: &str, weight: f64) -> KeyConfig {
        let mut k = KeyConfig::new(name, value, Upstream::parse("http://127.0.0.1:1").unwrap());
        k.weight = weight;
        k
    }

    #[test]
    fn a_known_key_keeps_its_id_and_figures_with_new_settings() {
        let registry = KeyRegistry::new();
        let first = registry
            .admit(&[key("a", "key-a-0000000000000000000000001", 1.0)])
            .unwrap();
        first[0].stats.set_balance(Some(7.5));
        let second = registry
            .admit(&[
                key("b", "key-b-0000000000000000000000002", 1.0),
                key("a", "key-a-0000000000000000000000001", 3.0),
            ])
            .unwrap();
        assert_eq!(second[1].id, first[0].id);
        assert_eq!(second[1].weight, 3.0);
        assert_eq!(second[1].stats.balance(), Some(7.5));
        assert_eq!(second[0].id, KeyId(1));
        assert_eq!(registry.get(first[0].id).unwrap().weight, 3.0);
    }

    #[test]
    fn a_changed_value_under_the_same_name_is_a_new_key() {
        let registry = KeyRegistry::new();
        let old = registry
            .admit(&[key("a", "key-a-0000000000000000000000001", 1.0)])
            .unwrap();
        let new = registry
            .admit(&[key("a", "key-a-0000000000000000000000009", 1.0)])
            .unwrap();
        assert_ne!(new[0].id, old[0].id);
        assert_eq!(new[0].stats.balance(), None);
        // The old key stays resolvable for its tasks.
        assert_eq!(
            registry.get(old[0].id).unwrap().key.expose(),
            "key-a-0000000000000000000000001"
        );
        assert_eq!(registry.id_of("a"), Some(new[0].id));
    }

    #[test]
    fn a_removed_key_stays_resolvable() {
        let registry = KeyRegistry::new();
        let old = registry
            .admit(&[key("gone", "key-g-0000000000000000000000001", 1.0)])
            .unwrap();
        registry
            .admit(&[key("b", "key-b-0000000000000000000000002", 1.0)])
            .unwrap();
        assert_eq!(registry.get(old[0].id).unwrap().name, "gone");
        assert_eq!(registry.len(), 2);
    }
}

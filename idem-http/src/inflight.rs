//! The keys this process is running a request for: a retry of one gets its 409 at once, without
//! taking a pooled connection to learn what the database would tell it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use idem_runtime::MessageKey;

/// The keys of the requests running in this process, each held by its [`Running`] entry.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    keys: Mutex<HashSet<MessageKey>>,
}

impl InFlight {
    /// Enters `key`, held until the entry is dropped (the request ended, panicked or was
    /// dropped); `None` when a request with it is already running here.
    pub(crate) fn enter(self: &Arc<Self>, key: &MessageKey) -> Option<Running> {
        self.keys().insert(key.clone()).then(|| Running {
            registry: Arc::clone(self),
            key: key.clone(),
        })
    }

    /// How many keys are held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.keys().len()
    }

    fn keys(&self) -> MutexGuard<'_, HashSet<MessageKey>> {
        // Nothing panics while holding the lock: a poisoned set is whole.
        self.keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A key held in [`InFlight`], given back when dropped.
#[derive(Debug)]
pub(crate) struct Running {
    registry: Arc<InFlight>,
    key: MessageKey,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.registry.keys().remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_held_once_until_its_entry_goes() {
        let registry = Arc::new(InFlight::default());
        let key = MessageKey::new("-:k").unwrap();
        let running = registry.enter(&key).expect("a free key");
        assert!(registry.enter(&key).is_none());
        let other = registry.enter(&MessageKey::new("-:l").unwrap());
        assert!(other.is_some());
        drop(running);
        drop(other);
        assert_eq!(registry.len(), 0, "nothing is left behind");
        assert!(registry.enter(&key).is_some());
    }

    #[test]
    fn a_request_that_panics_gives_its_key_back() {
        let registry = Arc::new(InFlight::default());
        let key = MessageKey::new("-:k").unwrap();
        let panicked = std::panic::catch_unwind(|| {
            let _running = registry.enter(&key);
            panic!("the endpoint panicked");
        });
        assert!(panicked.is_err());
        assert_eq!(registry.len(), 0);
    }
}

//! What a run in entity mode learned of its marker, kept for the runtime to read once the
//! handler returns.

use std::sync::Mutex;

use sea_orm::Statement;

use crate::fingerprint::Fingerprint;

/// What creating the marker entity found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The entity was created: the message is new.
    Fresh,
    /// The entity existed, made from a message with the same content (or with no fingerprint to
    /// compare): a duplicate.
    Existing,
    /// The entity existed, made from a message with other content: a reused key.
    Mismatch {
        /// The fingerprint the stored entity gives.
        stored: Fingerprint,
        /// This message's.
        received: Fingerprint,
    },
}

/// The first marker a run created: its verdict, and the statement that reads it back, which
/// the runtime runs last in the run's transaction to prove the transaction still holds it.
#[derive(Debug, Clone)]
pub(crate) struct Marked {
    pub(crate) verdict: Verdict,
    pub(crate) find: Statement,
}

/// Where [`Context::create`](crate::Context::create) leaves what it found for the runtime.
#[derive(Debug, Default)]
pub(crate) struct MarkerSlot {
    marked: Mutex<Option<Marked>>,
}

impl MarkerSlot {
    /// Keeps `marked` unless a marker was created before in this run: the first one is the
    /// message's marker, later ones are the handler's other entities.
    pub(crate) fn mark(&self, marked: Marked) {
        let mut slot = self
            .marked
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        slot.get_or_insert(marked);
    }

    /// What the run's marker found, if it created one.
    pub(crate) fn take(&self) -> Option<Marked> {
        self.marked
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .take()
    }
}

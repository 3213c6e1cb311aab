//! What a run in entity mode learned of its marker, kept for the runtime to read once the
//! handler returns.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sea_orm::Statement;

use crate::fingerprint::Fingerprint;
use crate::store::dialect::Dialect;

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

/// The run's marker: its verdict, and the statement that reads it back, which the runtime runs
/// last in the run's transaction to prove the transaction still holds it.
#[derive(Debug, Clone)]
pub(crate) struct Marked {
    pub(crate) verdict: Verdict,
    pub(crate) find: Statement,
}

/// How long the marker's insert waits for another copy's transaction holding its key: the
/// inbox's claim wait, as its claims wait.
#[derive(Debug, Clone)]
pub(crate) struct MarkerWait {
    pub(crate) dialect: Dialect,
    pub(crate) wait: Duration,
    /// PostgreSQL's `lock_timeout` as configured, restored after the insert.
    pub(crate) restore: String,
}

/// Where [`Context::create`](crate::Context::create) leaves what it found for the runtime.
#[derive(Debug)]
pub(crate) struct MarkerSlot {
    pub(crate) wait: MarkerWait,
    attempted: AtomicBool,
    marked: Mutex<Option<Marked>>,
    /// Why the marker was refused, if it was.
    refused: Mutex<Option<String>>,
}

impl MarkerSlot {
    pub(crate) fn new(wait: MarkerWait) -> Self {
        Self {
            wait,
            attempted: AtomicBool::new(false),
            marked: Mutex::new(None),
            refused: Mutex::new(None),
        }
    }

    /// Notes that the run tries to create its marker; `false` if it tried before: a run has
    /// one marker.
    pub(crate) fn attempt(&self) -> bool {
        !self.attempted.swap(true, Ordering::AcqRel)
    }

    /// Whether the run tried to create its marker, whatever came of it.
    pub(crate) fn attempted(&self) -> bool {
        self.attempted.load(Ordering::Acquire)
    }

    /// Keeps what the run's marker found.
    pub(crate) fn mark(&self, marked: Marked) {
        *self
            .marked
            .lock()
            .unwrap_or_else(|poison| poison.into_inner()) = Some(marked);
    }

    /// Notes why the run's marker was refused (the first reason stands).
    pub(crate) fn refuse(&self, reason: &str) {
        let mut refused = self
            .refused
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        refused.get_or_insert_with(|| reason.to_owned());
    }

    /// Why the run's marker was refused, if it was: whatever the handler made of it, the
    /// message cannot be processed as the handler stands.
    pub(crate) fn refused(&self) -> Option<String> {
        self.refused
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .clone()
    }

    /// What the run's marker found, if it created one.
    pub(crate) fn take(&self) -> Option<Marked> {
        self.marked
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .take()
    }
}

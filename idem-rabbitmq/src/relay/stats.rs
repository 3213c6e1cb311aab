//! The relay's counts.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counts of a relay's work since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayStats {
    /// Messages the broker confirmed. One whose "sent" mark did not commit is published, and
    /// counted, again.
    pub published: u64,
    /// Publishes the broker did not take (unroutable, refused, not confirmed in time, the
    /// connection lost); each is tried again later, with its run held back meanwhile.
    pub failed: u64,
    /// Batches that could not be taken or marked sent because the database failed.
    pub database_errors: u64,
    /// Broker connections opened to replace a lost one.
    pub reconnections: u64,
}

/// The relay's counts as they grow.
#[derive(Debug, Default)]
pub(super) struct RelayCounters {
    pub(super) published: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) database_errors: AtomicU64,
    pub(super) reconnections: AtomicU64,
}

impl RelayCounters {
    /// Adds `n` to `counter`, one of these.
    pub(super) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// The counts so far.
    pub(super) fn snapshot(&self) -> RelayStats {
        RelayStats {
            published: self.published.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            database_errors: self.database_errors.load(Ordering::Relaxed),
            reconnections: self.reconnections.load(Ordering::Relaxed),
        }
    }
}

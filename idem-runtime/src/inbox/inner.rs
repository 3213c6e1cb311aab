//! What every room of the inbox shares: its connection, store, settings, telemetry and outbox.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sea_orm::{DatabaseConnection, DatabaseTransaction};

use crate::clock::{capped, duration_ms};
use crate::error::{ConfigError, Result};
use crate::handler::{Handler, Mode};
use crate::key::ConsumerName;
use crate::outbox::{Outbox, RunStatements};
use crate::retention::{Cleaner, CleanerParts, RedeliveryWindow, RetentionPolicy};
use crate::store::Store;
use crate::telemetry::Telemetry;

/// How many claims a two-phase key may have by default before it needs intervention.
pub(crate) const DEFAULT_MAX_ATTEMPTS: u32 = 5;

/// An inbox's state, shared by its clones: the rooms of `inbox/` each add what they do.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) db: DatabaseConnection,
    pub(crate) store: Arc<Store>,
    /// What it learns of its duplicates, shared with the inboxes derived from it.
    pub(crate) telemetry: Arc<Telemetry>,
    pub(crate) retention: RetentionPolicy,
    pub(crate) window: Option<RedeliveryWindow>,
    pub(crate) max_attempts: u32,
    pub(crate) claim_wait: Duration,
    /// Two-phase leases set at run time, by consumer.
    pub(crate) leases: HashMap<String, Duration>,
    /// Where handlers stage outgoing messages.
    pub(crate) outbox: Option<Outbox>,
    /// The statements that stage under this inbox's claims, with an outbox.
    pub(crate) run_statements: Option<RunStatements>,
    /// Taken by each batch's transaction on SQLite, which writes one transaction at a time:
    /// batches waiting here take their turn at once, where SQLite's busy handler would have
    /// them sleep and poll.
    pub(crate) sqlite_batches: Arc<tokio::sync::Mutex<()>>,
}

impl Inner {
    /// The retention and, for a two-phase handler, the lease that `handler` runs with. Less
    /// than a millisecond is refused (a handler's own, which the builder never saw): its records
    /// would expire, or its claims be taken over, at once.
    pub(crate) fn settings_for<H: Handler>(
        &self,
        consumer: &ConsumerName,
        handler: &H,
    ) -> Result<(Duration, Option<Duration>), ConfigError> {
        let retention = self
            .retention
            .retention_for(consumer.as_str(), handler.retention());
        // Stored in whole milliseconds: less than one is none.
        if duration_ms(retention) == 0 {
            return Err(ConfigError::Zero("retention"));
        }
        let lease = match handler.mode() {
            Mode::Transactional | Mode::Entity | Mode::Natural => None,
            Mode::TwoPhase { lease } => {
                let lease = self.leases.get(consumer.as_str()).copied().unwrap_or(lease);
                if duration_ms(lease) == 0 {
                    return Err(ConfigError::Zero("lease"));
                }
                Some(capped(lease))
            }
        };
        Ok((capped(retention), lease))
    }

    /// Commits a run's transaction, which `staged` messages, and wakes the relays for them.
    pub(crate) async fn commit(&self, staged: u32, tx: DatabaseTransaction) -> Result<()> {
        tx.commit().await?;
        self.staged(staged);
        Ok(())
    }

    /// Wakes the outbox's relays after a commit that staged `count` messages, and counts them.
    pub(crate) fn staged(&self, count: u32) {
        if let Some(outbox) = &self.outbox
            && count > 0
        {
            outbox.notify_staged();
            metrics::counter!(
                crate::metrics::OUTBOX_STAGED_TOTAL,
                "table" => outbox.table().to_string()
            )
            .increment(u64::from(count));
        }
    }

    /// This inbox with claims that do not wait for another transaction holding their key (see
    /// `Inbox::without_claim_wait`).
    pub(crate) fn without_claim_wait(&self) -> Inner {
        Inner {
            db: self.db.clone(),
            store: Arc::new(self.store.with_claim_wait(Duration::ZERO)),
            telemetry: Arc::clone(&self.telemetry),
            retention: self.retention.clone(),
            window: self.window,
            max_attempts: self.max_attempts,
            claim_wait: Duration::ZERO,
            leases: self.leases.clone(),
            outbox: self.outbox.clone(),
            run_statements: self.run_statements.clone(),
            sqlite_batches: Arc::clone(&self.sqlite_batches),
        }
    }

    /// The cleaner of this inbox's table (and of its outbox's sent rows).
    pub(crate) fn cleaner(&self) -> Cleaner {
        Cleaner::new(CleanerParts {
            db: self.db.clone(),
            store: Arc::clone(&self.store),
            telemetry: Arc::clone(&self.telemetry),
            retention: self.retention.clone(),
            outbox: self.outbox.clone(),
        })
    }
}

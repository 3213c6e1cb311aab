//! The operators' side of an outbox (see `crate::admin`): counts, held runs, holds lifted.

use sea_orm::DbErr;

use super::handle::Outbox;
use super::holds::{self, HeldRun, HeldSubject, PendingRow};
use super::stats::{self, OutboxStats};

/// What an operator does with an outbox besides staging and relaying: counts, the runs held
/// back, one run's pending messages, a hold lifted. Import it to call these on an [`Outbox`]
/// (the `idem` command does).
pub trait OutboxAdmin {
    /// Counts the table's messages by the database's clock: two scans of the table, for an
    /// operator (the `idem` command), not for a service's hot path.
    ///
    /// # Errors
    ///
    /// The database failed.
    fn stats(&self) -> impl Future<Output = Result<OutboxStats, DbErr>> + Send;

    /// The runs and messages of no run the relays hold back, the oldest first, at most `limit`
    /// of each kind.
    ///
    /// # Errors
    ///
    /// The database failed.
    fn held_runs(&self, limit: u32) -> impl Future<Output = Result<Vec<HeldRun>, DbErr>> + Send;

    /// The pending messages of `subject` in the table's order (a run's, from its first unsent
    /// one), at most `limit`.
    ///
    /// # Errors
    ///
    /// The database failed.
    fn pending_of(
        &self,
        subject: &HeldSubject,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<PendingRow>, DbErr>> + Send;

    /// Lifts the holds of `subject` now: the relays take its messages at their next look at
    /// the table (woken at once on PostgreSQL, within their poll interval elsewhere). Returns
    /// how many messages were held. A relay that found the messages' exchange itself missing
    /// also holds messages to it on sight, until its own hold of the exchange runs out.
    ///
    /// # Errors
    ///
    /// The database failed.
    fn lift_holds(&self, subject: &HeldSubject) -> impl Future<Output = Result<u64, DbErr>> + Send;
}

impl OutboxAdmin for Outbox {
    async fn stats(&self) -> Result<OutboxStats, DbErr> {
        stats::stats(self.shared()).await
    }

    async fn held_runs(&self, limit: u32) -> Result<Vec<HeldRun>, DbErr> {
        holds::held_runs(self.shared(), limit).await
    }

    async fn pending_of(
        &self,
        subject: &HeldSubject,
        limit: u32,
    ) -> Result<Vec<PendingRow>, DbErr> {
        holds::pending_of(self.shared(), subject, limit).await
    }

    async fn lift_holds(&self, subject: &HeldSubject) -> Result<u64, DbErr> {
        holds::lift_holds(self.shared(), subject).await
    }
}

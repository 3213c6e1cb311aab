//! Relaying: what a relay of any broker asks of an outbox, as an extension of [`Outbox`].

use std::sync::Arc;

use sea_orm::DbErr;

use super::handle::{LocalRelay, Outbox};
use super::pending::{self, PendingBatch};
use super::stats::{self, Pending};

/// What a relay asks of an outbox: committed messages in batches, locked while it holds them,
/// the holds that ran out released, the backlog counted, and wake-ups from commits in this
/// process. Import it where a relay of another broker drives an outbox (idem-rabbitmq's `Relay`
/// does).
pub trait Relaying {
    /// Takes up to `limit` committed, unsent messages ready to publish, oldest first, skipping
    /// those another relay holds (`FOR UPDATE SKIP LOCKED` on PostgreSQL and MySQL/MariaDB) and
    /// those held back ([`PendingBatch::hold`]). Messages of one run go out in their order: a
    /// run whose earlier message another relay has in hand is left for later, and one whose
    /// earlier message is held back is held back with it.
    ///
    /// SQLite serves one process, whose relays of this outbox (this value and its clones) take
    /// turns: a batch waits for the one in hand to be marked sent or dropped. No transaction is
    /// held meanwhile, so handlers can write while the batch is published: a write lock held
    /// across the broker's confirms would stop every handler for as long.
    fn take_pending(&self, limit: u32) -> impl Future<Output = Result<PendingBatch, DbErr>> + Send;

    /// [`Relaying::take_pending`](crate::outbox::Relaying::take_pending) from the message after seq `after` on: a relay whose whole
    /// batch waited for earlier messages takes the next ones.
    fn take_pending_after(
        &self,
        limit: u32,
        after: Option<i64>,
    ) -> impl Future<Output = Result<PendingBatch, DbErr>> + Send;

    /// Releases the holds that ran out, whoever set them (a relay that stopped meanwhile);
    /// returns how many messages it released.
    ///
    /// # Errors
    ///
    /// The database failed.
    fn release_holds(&self) -> impl Future<Output = Result<u64, DbErr>> + Send;

    /// The messages not published yet, held ones included: how many, and how long the oldest
    /// has waited, by the database's clock. One range of the table's pending index, cheap enough
    /// for a relay to gauge now and then, whether or not it reaches the broker.
    ///
    /// # Errors
    ///
    /// The database failed.
    fn pending(&self) -> impl Future<Output = Result<Pending, DbErr>> + Send;

    /// Resolves at the next [`Outbox::notify_staged`] in this process.
    fn staged(&self) -> impl Future<Output = ()> + Send;

    /// Says that a relay of this outbox (this value or a clone) runs in this process, until the
    /// returned guard is dropped; a relay calls it when it starts.
    ///
    /// Meanwhile handler runs in this process do not announce their stagings on PostgreSQL
    /// (`pg_notify` on [`Relaying::channel`](crate::outbox::Relaying::channel)): the inbox wakes the local relay after each commit,
    /// and an announcement would only send relays in other processes after the same rows, at a
    /// price every handler pays: PostgreSQL serializes the commits of transactions that notify,
    /// one flush after another. Relays elsewhere still find these rows when they poll, should
    /// this process's relay fail. [`Outbox::stage`] announces whatever runs here (the wake-up
    /// in this process is up to its caller).
    fn local_relay(&self) -> LocalRelay;

    /// The PostgreSQL channel on which committed stagings are announced (`LISTEN` on it to wake
    /// a relay in another process).
    fn channel(&self) -> String;

    /// Whether this outbox's backend announces committed stagings on [`Relaying::channel`]
    /// (PostgreSQL does); elsewhere a relay in another process learns of them by polling. Not
    /// unless an implementation says so.
    fn announces(&self) -> bool {
        false
    }
}

impl Relaying for Outbox {
    async fn take_pending(&self, limit: u32) -> Result<PendingBatch, DbErr> {
        pending::take_pending_after(self.shared(), limit, None).await
    }

    async fn take_pending_after(
        &self,
        limit: u32,
        after: Option<i64>,
    ) -> Result<PendingBatch, DbErr> {
        pending::take_pending_after(self.shared(), limit, after).await
    }

    async fn release_holds(&self) -> Result<u64, DbErr> {
        pending::release_holds(self.shared()).await
    }

    async fn pending(&self) -> Result<Pending, DbErr> {
        stats::pending(self.shared()).await
    }

    async fn staged(&self) {
        self.shared().staged.notified().await;
    }

    fn local_relay(&self) -> LocalRelay {
        LocalRelay::start(Arc::clone(self.shared()))
    }

    fn channel(&self) -> String {
        self.shared().channel()
    }

    fn announces(&self) -> bool {
        self.shared().statements.stage().announces()
    }
}

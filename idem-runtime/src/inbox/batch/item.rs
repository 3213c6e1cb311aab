//! What a batch is made of and how it is checked: its items, its checks, the largest batch,
//! and the span of each chunk of a larger one.

use tracing::Instrument;

use crate::key::{KeyError, MessageKey};
use crate::metadata::Metadata;

/// One message of a batch: the key [`Handler::key`](crate::Handler::key) gave for it, the message, and what the
/// transport knows about its delivery.
#[derive(Debug)]
pub struct BatchItem<M> {
    /// The message's key, or why it has none.
    pub key: Result<MessageKey, KeyError>,
    /// The decoded message.
    pub message: M,
    /// The delivery's metadata.
    pub metadata: Metadata,
}

pub use crate::store::MAX_BATCH;

/// How a batch checks what its handlers did to the transaction they share.
///
/// Either way a failing or panicking handler fails alone, keeping its own settle decision and
/// attempt count, and the others commit once: unguarded handlers (the default; PostgreSQL
/// checked after each) are rolled back and run again, each under a savepoint; elsewhere each
/// checked handler has its savepoint from the first try.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum BatchChecks {
    /// Once, before the commit (the default): the handlers run as a hand-written batch runs
    /// its own business code, without a savepoint or a check between them, and the completion
    /// of their claims finds a transaction aborted under them (a failed statement swallowed
    /// on PostgreSQL) or lost (fewer claims to complete than taken, or on PostgreSQL another
    /// transaction's id). Such a batch is rolled back and runs again checked after each
    /// handler, which finds the culprit and counts its attempt. Nothing is committed half way
    /// by idem; but a handler that breaks the contract (it ends the transaction itself, or
    /// swallows an error that rolls the whole transaction back: a MySQL/MariaDB deadlock, on
    /// SQLite a full disk or a `RAISE(ROLLBACK)`) leaves the handlers after it writing outside
    /// the transaction, their writes committed on their own, and they run again.
    #[default]
    BeforeCommit,
    /// After each handler, for handlers not trusted to keep that contract: a savepoint per
    /// message on MySQL/MariaDB and SQLite, a look at the transaction on PostgreSQL. A handler
    /// that swallows a failed statement, or ends the transaction itself, fails alone or loses
    /// the batch, and no later handler's writes commit outside it. One round trip per message.
    EachMessage,
}

/// Runs one transaction's worth of a batch, of `size` messages, in its span; records its size
/// and how long it took.
pub(crate) async fn in_chunk<F: Future>(consumer: &str, size: usize, work: F) -> F::Output {
    let span = tracing::info_span!("idem.batch", consumer, size);
    let begun = std::time::Instant::now();
    let output = work.instrument(span).await;
    crate::observe::batch(consumer, size, begun);
    output
}

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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum BatchChecks {
    /// After each handler: a savepoint per message on MySQL/MariaDB and SQLite, a look at the
    /// transaction on PostgreSQL. A handler that swallows a failed statement, or ends the
    /// transaction itself, fails alone or loses the batch, and no later handler's writes commit
    /// outside it. One round trip per message.
    #[default]
    EachMessage,
    /// Once, before the commit: for handlers that return the error of every statement that
    /// fails and never commit or roll back the transaction they are given, as hand-written
    /// batch code trusts its own. A failing handler still fails alone: the batch is rolled back
    /// and the others run again, checked after each (on PostgreSQL, a handler whose statement
    /// failed runs again with them: the transaction it failed in may have been aborted by a
    /// handler before it). A transaction found aborted (a failed statement swallowed on
    /// PostgreSQL) or lost (fewer claims to complete than taken) before the commit is rolled
    /// back, and the batch runs again, checked after each, which finds the culprit and counts
    /// its attempt. What the trust costs when it is broken: after a handler that ends the
    /// transaction (its own `ROLLBACK` or `COMMIT`, a statement that commits implicitly on
    /// MySQL) or swallows an error that rolls the whole transaction back (a MySQL/MariaDB
    /// deadlock; on SQLite a full disk, an I/O error, a `RAISE(ROLLBACK)`), the handlers after
    /// it write outside the transaction, their writes committed on their own, and run again.
    BeforeCommit,
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

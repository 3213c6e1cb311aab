//! Batch mode: many messages of one transactional consumer in one transaction, each message
//! settled as it would be on its own.
//!
//! The path of a batch, file by file:
//! - `fates.rs`: the items sorted into first copies of each key (in key order), later copies,
//!   and the results known before any statement; at the end, each fate turned into a result;
//! - `attempt.rs`: the batch's transaction, tried until it commits or is lost;
//! - `claims.rs`: a try begins with one statement claiming every key, and one reading the
//!   known ones;
//! - `guard.rs`: the fresh messages' handlers run under a savepoint each, or unguarded with the
//!   transaction checked;
//! - `slice.rs`: or a slice handler runs them all in one call, culprits found by halving;
//! - `finish.rs`: one statement completes the processed messages, one commit;
//! - `lost.rs`: why a try ended without committing, and what each message gets then.
//!
//! Records that need more than a read (expired, or held by a two-phase claim), and later
//! copies of a key whose first copy was left for later, are processed on their own after the
//! commit, by the per-message path.

mod attempt;
mod claims;
mod fates;
mod finish;
mod guard;
mod lost;
mod slice;

use std::time::Duration;

use tracing::Instrument;

use crate::error::{Error, Result};
use crate::handler::{Handler, Mode, Outcome};
use crate::inbox::Inbox;
use crate::key::{ConsumerName, KeyError, MessageKey};
use crate::metadata::Metadata;
use attempt::Batch;
use fates::{Fate, Lead, Sorted, record, sort_out};
use lost::Lost;

/// One message of a batch: the key [`Handler::key`] gave for it, the message, and what the
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

impl Inbox {
    /// Processes `items` with `handler` in one transaction, returning one result per item, in
    /// order, each what [`Inbox::process`] would have returned for that message.
    ///
    /// - Fresh keys are claimed in one statement, and their handlers run one after the other in
    ///   the batch's transaction: a failing or panicking handler is rolled back, its claim
    ///   removed, and its error returned, while the others commit. So is a handler whose error
    ///   says a database of its own is unreachable, while the batch's is not, and a handler
    ///   whose output the database will not store.
    /// - Known keys are read in one statement: a completed record answers as a
    ///   [`Outcome::Duplicate`] (after the fingerprint check) without running the handler. An
    ///   expired record, or one a two-phase claim holds, is processed on its own after the
    ///   commit, as is a second copy of a key in the batch whose first copy was.
    /// - The outputs are recorded in one statement, and the batch commits once. If the commit
    ///   fails or its result is unknown, or the batch's database is lost, every message it
    ///   held gets the database's error (to be requeued, counted as it would be alone: never
    ///   for an outage, a server that takes no writes or a pool without a free connection).
    /// - On MySQL/MariaDB and SQLite each handler runs under its own savepoint. On PostgreSQL,
    ///   where a savepoint costs a subtransaction (and a transaction with more than 64 of them
    ///   slows every statement), the handlers first run without one, the transaction checked
    ///   after each: when one fails, its error stands, the transaction is rolled back, and the
    ///   others run again under savepoints. A handler may thus run twice, its effects committed
    ///   once; messages are cloned for it.
    /// - Handlers that return every failed statement's error and never end their transaction can
    ///   save that round trip per message: see [`Inbox::process_batch_with`].
    /// - A handler that carries on after a failed statement breaks the transaction on
    ///   PostgreSQL ([`Error::TransactionAborted`] for it, the others unharmed). Where the
    ///   database rolls back the whole transaction instead (a MySQL/MariaDB deadlock), or the
    ///   handler ends it itself, that message gets its own error and every other message the
    ///   transaction held gets [`Error::BatchRolledBack`], which does not count as an attempt.
    ///   A handler must not commit the transaction it is given: what it commits by itself
    ///   (other messages' claims and writes included) is outside these guarantees.
    ///
    /// A batch trades latency for throughput: its messages are committed together, after the
    /// slowest of them. A two-phase handler's messages are processed one by one. At most
    /// [`MAX_BATCH`] messages share a transaction; larger batches are split. On SQLite, which
    /// writes one transaction at a time, an inbox's batches take turns.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future rolls the batch's transaction back: nothing of it is recorded.
    pub async fn process_batch<H: Handler>(
        &self,
        handler: &H,
        items: Vec<BatchItem<H::Message>>,
    ) -> Vec<Result<Outcome<H::Output>>>
    where
        H::Message: Clone,
    {
        self.process_batch_with(handler, items, BatchChecks::EachMessage)
            .await
    }

    /// [`Inbox::process_batch`], checking the handlers as `checks` says: after each of them (the
    /// default), or once before the commit for handlers trusted to leave the transaction whole
    /// ([`BatchChecks::BeforeCommit`], one round trip less per message).
    pub async fn process_batch_with<H: Handler>(
        &self,
        handler: &H,
        items: Vec<BatchItem<H::Message>>,
        checks: BatchChecks,
    ) -> Vec<Result<Outcome<H::Output>>>
    where
        H::Message: Clone,
    {
        if handler.mode() != Mode::Transactional {
            let mut results = Vec::with_capacity(items.len());
            for item in items {
                let result = self
                    .process_with_key(handler, item.key, item.message, &item.metadata)
                    .await;
                results.push(result);
            }
            return results;
        }
        let mut results = Vec::with_capacity(items.len());
        let mut items = items.into_iter().peekable();
        while items.peek().is_some() {
            let chunk: Vec<_> = items.by_ref().take(MAX_BATCH).collect();
            let size = chunk.len();
            let one = self.one_batch(handler, chunk, checks);
            results.extend(in_chunk(handler.consumer(), size, one).await);
        }
        results
    }

    /// One transaction's worth of a batch, each fresh message run by its own call.
    async fn one_batch<H: Handler>(
        &self,
        handler: &H,
        items: Vec<BatchItem<H::Message>>,
        checks: BatchChecks,
    ) -> Vec<Result<Outcome<H::Output>>>
    where
        H::Message: Clone,
    {
        let (mut sorted, consumer, retention) = match self.sort(handler, items) {
            Ok(sorted) => sorted,
            Err(failed) => return failed,
        };
        let mut leads = std::mem::take(&mut sorted.leads);
        let batch = Batch {
            handler,
            consumer: &consumer,
            metadata: &sorted.metadata,
            retention,
            checks,
        };
        let transacted = self.transact(&batch, &mut leads).await;
        self.conclude(handler, sorted, leads, &consumer, transacted)
            .await
    }

    /// The items sorted into fates, with the handler's consumer and retention; every item
    /// failed when the handler's configuration cannot work.
    #[allow(clippy::type_complexity)]
    fn sort<H: Handler>(
        &self,
        handler: &H,
        items: Vec<BatchItem<H::Message>>,
    ) -> Result<
        (Sorted<H::Message, H::Output>, ConsumerName, Duration),
        Vec<Result<Outcome<H::Output>>>,
    > {
        let consumer = match ConsumerName::new(handler.consumer()) {
            Ok(consumer) => consumer,
            Err(error) => {
                let error = || Error::InvalidConsumer(error.clone());
                return Err(fail_all(handler.consumer(), &items, error));
            }
        };
        let retention = match self.settings_for(&consumer, handler) {
            Ok((retention, _)) => retention,
            Err(error) => {
                return Err(fail_all(consumer.as_str(), &items, || {
                    Error::Config(error.clone())
                }));
            }
        };
        Ok((sort_out(handler, &consumer, items), consumer, retention))
    }

    /// Turns the fates into results once the transaction ended (every message it held
    /// failed with its error when it was lost), and processes the messages left for later one
    /// by one.
    async fn conclude<H: Handler>(
        &self,
        handler: &H,
        mut sorted: Sorted<H::Message, H::Output>,
        mut leads: Vec<Lead<H::Message, H::Output>>,
        consumer: &ConsumerName,
        transacted: Result<(), Lost>,
    ) -> Vec<Result<Outcome<H::Output>>> {
        if let Err(lost) = transacted {
            // A statement of the batch refused for a reason of the database's own (a statement
            // timeout on a large batch, say) is no message's fault: each goes the per-message
            // way, which tells.
            let alone = lost.refused();
            for lead in &mut leads {
                if matches!(
                    lead.fate,
                    Fate::Fresh | Fate::Processed(..) | Fate::Deferred
                ) {
                    lead.fate = if alone {
                        Fate::Deferred
                    } else {
                        Fate::Failed(lost.error_for(&lead.key))
                    };
                }
            }
        }
        sorted.leads = leads;
        for (index, key, message) in sorted.answer(consumer, &self.inner.telemetry) {
            let metadata = &sorted.metadata[index];
            let result = self
                .process_with_key(handler, Ok(key), message, metadata)
                .await;
            sorted.put(index, result);
        }
        sorted.results()
    }
}

/// Runs one transaction's worth of a batch, of `size` messages, in its span; records its size
/// and how long it took.
pub(super) async fn in_chunk<F: Future>(consumer: &str, size: usize, work: F) -> F::Output {
    let span = tracing::info_span!("idem.batch", consumer, size);
    let begun = std::time::Instant::now();
    let output = work.instrument(span).await;
    crate::observe::batch(consumer, size, begun);
    output
}

/// Fails every item with `error` (a configuration that cannot work), recorded for `consumer`.
fn fail_all<M, T>(
    consumer: &str,
    items: &[BatchItem<M>],
    error: impl Fn() -> Error,
) -> Vec<Result<Outcome<T>>> {
    let results: Vec<_> = items.iter().map(|_| Err(error())).collect();
    for (item, result) in items.iter().zip(&results) {
        record(consumer, &item.metadata, result);
    }
    results
}

//! Batch mode: many messages of one transactional consumer in one transaction, each message
//! settled as it would be on its own.
//!
//! One statement claims every key and tells which are fresh; one reads the known ones; each
//! fresh message's handler runs under its own savepoint; one statement completes the
//! successful ones; one commit. A failing message is rolled back to its savepoint and its
//! claim removed, while the rest commit. Records that need more than a read (expired, or held
//! by a two-phase claim), and second copies of a key whose first copy was left for later, are
//! processed on their own after the commit, by the per-message path.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, RuntimeErr};
use tracing::Instrument;

use super::claim::{check_stored_fingerprint, new_token};
use super::{Inbox, MAX_CLAIM_DEADLOCKS, decode_stored, fingerprint_of, outage_or, run};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::handler::{Context, Handler, Mode, Outcome};
use crate::key::{ConsumerName, InboxKey, KeyError, MessageKey};
use crate::metadata::Metadata;
use crate::observe;
use crate::outbox::{Outbox, RunClaim};
use crate::store::dialect::{Failure, classify, refuses_value};
use crate::store::{BatchClaim, Row, Status, Store};

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

/// The most messages one batch transaction carries: its statements bind a few values per
/// message, and every backend limits how many one statement may have. Larger batches are split.
pub const MAX_BATCH: usize = 1000;

/// What became of the first copy of a key in the batch.
enum Fate<T> {
    /// Claimed fresh; its handler has not run yet.
    Fresh,
    /// Processed here, to be committed: the output and its JSON as stored.
    Processed(T, Option<String>),
    /// A completed record: its stored output and fingerprint.
    Duplicate(Option<String>, Option<Vec<u8>>),
    /// Left for the per-message path after the commit.
    Deferred,
    /// Failed with this error; nothing of it is committed.
    Failed(Error),
}

/// The first copy of a key in the batch.
struct Lead<M, T> {
    index: usize,
    key: InboxKey,
    fingerprint: Option<Fingerprint>,
    message: Option<M>,
    fate: Fate<T>,
    /// Whether this batch inserted its claim.
    claimed: bool,
    /// Whether its handler failed in an unguarded try: its error stands, and the next try
    /// leaves it out.
    failed_alone: bool,
    /// How many messages its handler staged in the outbox.
    staged: u32,
}

/// What a later copy of a key learns from its first copy.
enum First {
    /// It is recorded: the output and fingerprint stored.
    Stored(Option<String>, Option<Vec<u8>>),
    /// It failed.
    Failed,
}

/// A later copy of a key already in the batch.
struct Copy<M> {
    index: usize,
    key: MessageKey,
    fingerprint: Option<Fingerprint>,
    message: M,
}

/// Why a batch's transaction ended without committing.
enum Lost {
    /// A statement of the batch failed, or the commit did.
    Database(DbErr),
    /// A handler broke the transaction: the database rolled back or aborted more than the
    /// handler's savepoint.
    RolledBack,
}

impl Lost {
    /// Whether a statement of the batch was refused (not lost to an outage or contention).
    fn refused(&self) -> bool {
        matches!(self, Lost::Database(error) if classify(error) == Failure::Refused)
    }

    /// The error a message whose work the lost transaction held gets: retried later, not
    /// counted as an attempt (a batch whose statement was [`refused`](Lost::refused) goes the
    /// per-message way instead).
    fn error_for(&self, key: &InboxKey) -> Error {
        let Lost::Database(error) = self else {
            return Error::BatchRolledBack { key: key.clone() };
        };
        let detail = format!("the batch's transaction failed: {error}");
        match classify(error) {
            Failure::Unreachable => {
                Error::StoreUnavailable(DbErr::Conn(RuntimeErr::Internal(detail)))
            }
            Failure::Deadlock | Failure::LockTimeout => Error::Contention(DbErr::Custom(detail)),
            Failure::Aborted => Error::BatchRolledBack { key: key.clone() },
            Failure::Refused => Error::Database(DbErr::Custom(detail)),
        }
    }
}

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

/// How one try at a batch runs its handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Guard {
    /// One savepoint per message: a failing message is rolled back alone.
    Savepoints,
    /// None, the transaction checked after each handler: the first failure rolls the whole
    /// transaction back.
    CheckEach,
    /// None, the transaction checked once before the commit ([`BatchChecks::BeforeCommit`]).
    Trusted,
}

/// How one try at a batch's transaction ended, short of losing it.
enum Tried {
    /// Committed, or nothing to commit (every message left for the per-message path).
    Ended,
    /// A handler failed without a savepoint, or broke the transaction; it was rolled back, to
    /// run the others again with savepoints.
    HandlerFailed,
}

/// What every try at one batch shares.
struct Attempt<'a, H> {
    handler: &'a H,
    consumer: &'a ConsumerName,
    metadata: &'a [Metadata],
    retention: Duration,
}

/// The items of a batch sorted out: first copies of each key (sorted by key, the order their
/// claims lock in), later copies, and the results already known (an invalid key, a message
/// that cannot be fingerprinted).
struct Sorted<M, T> {
    leads: Vec<Lead<M, T>>,
    copies: Vec<Copy<M>>,
    metadata: Vec<Metadata>,
    results: Vec<Option<Result<Outcome<T>>>>,
}

impl Inbox {
    /// Processes `items` with `handler` in one transaction, returning one result per item, in
    /// order, each what [`Inbox::process`] would have returned for that message.
    ///
    /// - Fresh keys are claimed in one statement, and their handlers run one after the other in
    ///   the batch's transaction: a failing or panicking handler is rolled back, its claim
    ///   removed, and its error returned, while the others commit.
    /// - Known keys are read in one statement: a completed record answers as a
    ///   [`Outcome::Duplicate`] (after the fingerprint check) without running the handler. An
    ///   expired record, or one a two-phase claim holds, is processed on its own after the
    ///   commit, as is a second copy of a key in the batch whose first copy was.
    /// - The outputs are recorded in one statement, and the batch commits once. If the commit
    ///   fails or its result is unknown, every message it held gets the error, to be requeued.
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
        let mut results = Vec::with_capacity(items.len());
        if handler.mode() != Mode::Transactional {
            for item in items {
                let result = self
                    .process_with_key(handler, item.key, item.message, &item.metadata)
                    .await;
                results.push(result);
            }
            return results;
        }
        let mut items = items.into_iter().peekable();
        while items.peek().is_some() {
            let chunk: Vec<_> = items.by_ref().take(MAX_BATCH).collect();
            let span = tracing::info_span!(
                "idem.batch",
                consumer = handler.consumer(),
                size = chunk.len()
            );
            results.extend(
                self.one_batch(handler, chunk, checks)
                    .instrument(span)
                    .await,
            );
        }
        results
    }

    /// One transaction's worth of a batch.
    async fn one_batch<H: Handler>(
        &self,
        handler: &H,
        items: Vec<BatchItem<H::Message>>,
        checks: BatchChecks,
    ) -> Vec<Result<Outcome<H::Output>>>
    where
        H::Message: Clone,
    {
        let consumer = match ConsumerName::new(handler.consumer()) {
            Ok(consumer) => consumer,
            Err(error) => {
                let error = || Error::InvalidConsumer(error.clone());
                return fail_all(handler.consumer(), &items, error);
            }
        };
        let retention = match self.settings_for(&consumer, handler) {
            Ok((retention, _)) => retention,
            Err(error) => {
                return fail_all(consumer.as_str(), &items, || Error::Config(error.clone()));
            }
        };
        let Sorted {
            mut leads,
            copies,
            metadata,
            mut results,
        } = sort_out(handler, &consumer, items);
        if let Err(lost) = self
            .transact(handler, &consumer, &mut leads, &metadata, retention, checks)
            .await
        {
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
        // What a later copy of a key learns from its first copy.
        let mut firsts: HashMap<MessageKey, First> = HashMap::new();
        let mut later: Vec<(usize, MessageKey, H::Message)> = Vec::new();
        for lead in leads {
            let Lead {
                index, key, fate, ..
            } = lead;
            let result = match fate {
                Fate::Processed(output, json) => {
                    let stored = lead.fingerprint.map(|print| print.as_bytes().to_vec());
                    firsts.insert(key.message_key.clone(), First::Stored(json, stored));
                    Ok(Outcome::Processed(output))
                }
                Fate::Duplicate(output, stored) => {
                    let result = decode_stored(&key, output.clone()).map(Outcome::Duplicate);
                    firsts.insert(key.message_key.clone(), First::Stored(output, stored));
                    result
                }
                Fate::Failed(error) => {
                    firsts.insert(key.message_key.clone(), First::Failed);
                    Err(error)
                }
                Fate::Deferred => {
                    let message = lead.message.expect("a deferred message was not run");
                    later.push((index, key.message_key, message));
                    continue;
                }
                Fate::Fresh => unreachable!("a fresh claim either ran or its batch was lost"),
            };
            record(consumer.as_str(), &metadata[index], &result);
            results[index] = Some(result);
        }
        for copy in copies {
            let key = InboxKey {
                consumer: consumer.clone(),
                message_key: copy.key,
            };
            let result = match firsts.get(&key.message_key) {
                Some(First::Stored(output, stored)) => {
                    check_stored_fingerprint(&key, stored.as_deref(), copy.fingerprint.as_ref())
                        .and_then(|()| decode_stored(&key, output.clone()))
                        .map(Outcome::Duplicate)
                }
                // The first copy failed: this one is retried after it, not beside it.
                Some(First::Failed) => Err(Error::InProgressElsewhere {
                    key,
                    remaining: Duration::ZERO,
                }),
                None => {
                    later.push((copy.index, key.message_key, copy.message));
                    continue;
                }
            };
            record(consumer.as_str(), &metadata[copy.index], &result);
            results[copy.index] = Some(result);
        }
        // First copies come before their later copies.
        later.sort_by_key(|(index, ..)| *index);
        for (index, key, message) in later {
            let result = self
                .process_with_key(handler, Ok(key), message, &metadata[index])
                .await;
            results[index] = Some(result);
        }
        results
            .into_iter()
            .map(|result| result.expect("every message of a batch has a result"))
            .collect()
    }

    /// The batch's transaction: claims, reads, handlers, completion, commit. Each first copy's
    /// fate is set as it is decided; an error means nothing was committed.
    ///
    /// Where a failed statement aborts the whole transaction (PostgreSQL), the handlers first
    /// run without savepoints, which cost a subtransaction each (and slow every statement once
    /// a transaction has more than 64), with one check of the transaction after each handler:
    /// if one fails, its error stands, but nothing can be kept apart from it, so the
    /// transaction is rolled back and the others run again with a savepoint per message.
    /// Elsewhere a handler could carry on past a transaction the database ended under it, its
    /// later writes committed on their own, so each message always has its savepoint there.
    /// Trusted handlers ([`BatchChecks::BeforeCommit`]) first run without savepoints or checks
    /// on every backend, the transaction checked once before the commit.
    async fn transact<H: Handler>(
        &self,
        handler: &H,
        consumer: &ConsumerName,
        leads: &mut [Lead<H::Message, H::Output>],
        metadata: &[Metadata],
        retention: Duration,
        checks: BatchChecks,
    ) -> Result<(), Lost>
    where
        H::Message: Clone,
    {
        let batch = Attempt {
            handler,
            consumer,
            metadata,
            retention,
        };
        let _turn = match self.inner.store.backend() {
            DbBackend::Sqlite => Some(self.inner.sqlite_batches.lock().await),
            _ => None,
        };
        let first = match checks {
            BatchChecks::BeforeCommit => Some(Guard::Trusted),
            BatchChecks::EachMessage if self.inner.store.dialect().aborts_on_error() => {
                Some(Guard::CheckEach)
            }
            BatchChecks::EachMessage => None,
        };
        if let Some(first) = first {
            match self.attempt(&batch, leads, first).await? {
                Tried::Ended => return Ok(()),
                Tried::HandlerFailed => {
                    tracing::debug!(
                        consumer = consumer.as_str(),
                        "a handler of the batch failed, or broke its transaction; running the \
                         others again with a savepoint per message"
                    );
                }
            }
        }
        self.attempt(&batch, leads, Guard::Savepoints).await?;
        Ok(())
    }

    /// One try at the batch's transaction.
    async fn attempt<H: Handler>(
        &self,
        batch: &Attempt<'_, H>,
        leads: &mut [Lead<H::Message, H::Output>],
        guard: Guard,
    ) -> Result<Tried, Lost>
    where
        H::Message: Clone,
    {
        let (handler, consumer, metadata, retention) = (
            batch.handler,
            batch.consumer,
            batch.metadata,
            batch.retention,
        );
        let store = &self.inner.store;
        let token = new_token();
        let mut deadlocks = 0;
        let (tx, fresh) = loop {
            let tx = store
                .dialect()
                .begin(&self.inner.db)
                .await
                .map_err(Lost::Database)?;
            match self.claim_all(&tx, consumer, leads, token, retention).await {
                Ok(fresh) => break (tx, fresh),
                // Batches sharing keys claim them in one order; a deadlock can still come from
                // elsewhere. Nothing has run yet, so the claims are simply tried again.
                Err(error)
                    if classify(&error) == Failure::Deadlock && deadlocks < MAX_CLAIM_DEADLOCKS =>
                {
                    deadlocks += 1;
                }
                // A key of the batch is held by a long transaction elsewhere, or a value of one
                // claim is refused (a constraint of the table's operators): each message goes
                // the per-message way, so that only that key waits, or fails.
                Err(error) if classify(&error) == Failure::LockTimeout || refuses_value(&error) => {
                    for lead in leads.iter_mut().filter(|lead| !lead.failed_alone) {
                        lead.fate = Fate::Deferred;
                    }
                    return Ok(Tried::Ended);
                }
                Err(error) => return Err(Lost::Database(error)),
            }
        };
        if fresh < leads.len() {
            self.read_known(&tx, consumer, leads)
                .await
                .map_err(Lost::Database)?;
        }
        // Unguarded handlers are checked to leave the transaction they were given, on
        // PostgreSQL against its id; elsewhere a transaction rolled back under a handler shows in
        // the completion's count.
        let checked = match guard {
            Guard::CheckEach => true,
            Guard::Trusted => store.dialect().aborts_on_error(),
            Guard::Savepoints => false,
        };
        let transaction_id = if checked && fresh > 0 {
            Some(
                store
                    .end_claim_wait_with_id(&tx)
                    .await
                    .map_err(Lost::Database)?,
            )
        } else {
            store.end_claim_wait(&tx).await.map_err(Lost::Database)?;
            None
        };
        let staging = Staging {
            outbox: self.inner.outbox.as_ref(),
            claim: RunClaim {
                inbox_table: store.quoted_table(),
                token,
            },
        };
        let unguarded = (guard != Guard::Savepoints).then_some(Unguarded {
            store,
            tx: &tx,
            transaction_id,
            check_each: guard == Guard::CheckEach,
            staging,
        });
        let mut savepoints = Savepoints {
            tx: &tx,
            open: None,
        };
        for at in 0..leads.len() {
            if !matches!(leads[at].fate, Fate::Fresh) {
                continue;
            }
            let metadata = &metadata[leads[at].index];
            let Some(unguarded) = &unguarded else {
                savepoints.take(leads).await?;
                if run_fresh(handler, &tx, &mut leads[at], metadata, staging).await? {
                    savepoints.open = Some(at);
                }
                continue;
            };
            match unguarded.run(handler, &mut leads[at], metadata).await? {
                Ran::Processed => {}
                Ran::Failed => {
                    // Its claim goes with the transaction.
                    leads[at].claimed = false;
                    leads[at].failed_alone = true;
                    roll_back(tx).await?;
                    return Ok(Tried::HandlerFailed);
                }
                Ran::Unsure => {
                    roll_back_broken(tx).await?;
                    return Ok(Tried::HandlerFailed);
                }
            }
        }
        if guard == Guard::Trusted
            && let Some(unguarded) = &unguarded
        {
            match unguarded.check().await? {
                Checked::Open => {}
                // A handler swallowed a failed statement, or ended the transaction: which one,
                // only a checked try tells.
                Checked::Aborted | Checked::Ended => {
                    roll_back_broken(tx).await?;
                    return Ok(Tried::HandlerFailed);
                }
            }
        }
        savepoints.release(leads).await?;
        let released: Vec<&MessageKey> = leads
            .iter()
            .filter(|lead| lead.claimed && matches!(lead.fate, Fate::Failed(_)))
            .map(|lead| &lead.key.message_key)
            .collect();
        if !released.is_empty() {
            store
                .release_many(&tx, consumer, token, &released)
                .await
                .map_err(Lost::Database)?;
        }
        if !self
            .complete_all(&tx, consumer, leads, token, retention)
            .await?
        {
            // Fewer claims completed than this transaction took: the database rolled it back
            // under a handler, or a handler ended it. Trusted, which handler only a checked try
            // tells; checked, that handler was found, and the batch is lost.
            if guard != Guard::Trusted {
                return Err(Lost::RolledBack);
            }
            roll_back_broken(tx).await?;
            return Ok(Tried::HandlerFailed);
        }
        if let Err(error) = tx.commit().await {
            if classify(&error) != Failure::Refused {
                return Err(Lost::Database(error));
            }
            // A constraint checked at the commit refused what a handler wrote; nothing is
            // committed, and only each message's own commit tells whose write it was.
            for lead in leads.iter_mut() {
                if matches!(lead.fate, Fate::Processed(..)) {
                    lead.fate = Fate::Deferred;
                }
            }
            return Ok(Tried::Ended);
        }
        let staged = leads
            .iter()
            .filter(|lead| matches!(lead.fate, Fate::Processed(..)))
            .map(|lead| lead.staged)
            .sum();
        self.staged(staged);
        Ok(Tried::Ended)
    }

    /// Claims every first copy's key in one statement; the fresh ones are marked so. Returns how
    /// many were fresh.
    async fn claim_all<M, T>(
        &self,
        tx: &DatabaseTransaction,
        consumer: &ConsumerName,
        leads: &mut [Lead<M, T>],
        token: i64,
        retention: Duration,
    ) -> Result<usize, DbErr> {
        let store = &self.inner.store;
        store.bound_claim_wait(tx).await?;
        let claims: Vec<BatchClaim<'_>> = leads
            .iter()
            .filter(|lead| !lead.failed_alone)
            .map(|lead| BatchClaim {
                key: &lead.key.message_key,
                fingerprint: lead.fingerprint.as_ref(),
            })
            .collect();
        if claims.is_empty() {
            return Ok(0);
        }
        let fresh: HashSet<String> = store
            .insert_claims(tx, consumer, &claims, token, retention)
            .await?;
        for lead in leads.iter_mut().filter(|lead| !lead.failed_alone) {
            lead.claimed = fresh.contains(lead.key.message_key.as_str());
            lead.fate = if lead.claimed {
                Fate::Fresh
            } else {
                Fate::Deferred
            };
        }
        Ok(fresh.len())
    }

    /// Reads the records of the keys that were not fresh, in one statement: a completed,
    /// unexpired record answers as a duplicate; anything else is left for the per-message path.
    async fn read_known<M, T>(
        &self,
        tx: &DatabaseTransaction,
        consumer: &ConsumerName,
        leads: &mut [Lead<M, T>],
    ) -> Result<(), DbErr> {
        let known: Vec<&MessageKey> = leads
            .iter()
            .filter(|lead| matches!(lead.fate, Fate::Deferred))
            .map(|lead| &lead.key.message_key)
            .collect();
        if known.is_empty() {
            return Ok(());
        }
        let mut rows = self.inner.store.find_many(tx, consumer, &known).await?;
        for lead in leads.iter_mut() {
            if !matches!(lead.fate, Fate::Deferred) {
                continue;
            }
            if let Some(row) = rows.remove(lead.key.message_key.as_str()) {
                lead.fate = known_fate(lead, row);
            }
        }
        Ok(())
    }

    /// Records the outputs of the messages processed here in one statement; returns whether it
    /// completed every claim it was given (fewer: the transaction was lost under a handler). A
    /// statement the database refuses (an output too large for it) is tried message by message
    /// to find which, and the batch is rolled back. Where a refused statement aborts the transaction
    /// (PostgreSQL), the statement runs under a savepoint, rolled back to before the search;
    /// elsewhere the database undoes the refused statement alone.
    async fn complete_all<M, T>(
        &self,
        tx: &DatabaseTransaction,
        consumer: &ConsumerName,
        leads: &mut [Lead<M, T>],
        token: i64,
        retention: Duration,
    ) -> Result<bool, Lost> {
        let store = &self.inner.store;
        let outputs: Vec<(&MessageKey, Option<&str>)> = leads
            .iter()
            .filter_map(|lead| match &lead.fate {
                Fate::Processed(_, json) => Some((&lead.key.message_key, json.as_deref())),
                _ => None,
            })
            .collect();
        if outputs.is_empty() {
            return Ok(true);
        }
        let expected = outputs.len() as u64;
        let aborts = store.dialect().aborts_on_error();
        if aborts {
            savepoint(tx, "SAVEPOINT idem_complete").await?;
        }
        match store
            .complete_many(tx, consumer, token, &outputs, retention)
            .await
        {
            // Each claim is this batch's, in progress, in this transaction: fewer completed
            // means the database rolled the transaction back under a handler, or a handler
            // ended it.
            Ok(completed) => Ok(completed == expected),
            Err(error) if refuses_value(&error) => {
                drop(outputs);
                if aborts {
                    savepoint(tx, "ROLLBACK TO SAVEPOINT idem_complete").await?;
                }
                self.find_refused_outputs(tx, leads, token, retention)
                    .await?;
                Err(Lost::RolledBack)
            }
            Err(error) => Err(Lost::Database(error)),
        }
    }

    /// Completes each processed message on its own, each under a savepoint rolled back at once,
    /// and marks the ones whose output the database refuses.
    async fn find_refused_outputs<M, T>(
        &self,
        tx: &DatabaseTransaction,
        leads: &mut [Lead<M, T>],
        token: i64,
        retention: Duration,
    ) -> Result<(), Lost> {
        for lead in leads.iter_mut() {
            let Fate::Processed(_, json) = &lead.fate else {
                continue;
            };
            savepoint(tx, "SAVEPOINT idem_probe").await?;
            let tried = self
                .inner
                .store
                .complete(tx, &lead.key, token, json.as_deref(), retention)
                .await;
            savepoint(tx, "ROLLBACK TO SAVEPOINT idem_probe").await?;
            if let Err(error) = tried
                && refuses_value(&error)
            {
                lead.fate = Fate::Failed(Error::OutputNotStorable(Box::new(error)));
            }
        }
        Ok(())
    }
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

/// Sorts the items out: their metadata, the results known before any statement, the first copy
/// of each key (sorted by key) and the later copies.
fn sort_out<H: Handler>(
    handler: &H,
    consumer: &ConsumerName,
    items: Vec<BatchItem<H::Message>>,
) -> Sorted<H::Message, H::Output> {
    let mut sorted = Sorted {
        leads: Vec::with_capacity(items.len()),
        copies: Vec::new(),
        metadata: Vec::with_capacity(items.len()),
        results: Vec::with_capacity(items.len()),
    };
    let mut seen = HashSet::new();
    for (index, item) in items.into_iter().enumerate() {
        let early = match item.key {
            Err(error) => Some(Err(Error::InvalidKey(error))),
            Ok(key) => match fingerprint_of(handler, &item.message, &item.metadata) {
                Err(error) => Some(Err(error)),
                Ok(fingerprint) if seen.contains(&key) => {
                    sorted.copies.push(Copy {
                        index,
                        key,
                        fingerprint,
                        message: item.message,
                    });
                    None
                }
                Ok(fingerprint) => {
                    seen.insert(key.clone());
                    sorted.leads.push(Lead {
                        index,
                        key: InboxKey {
                            consumer: consumer.clone(),
                            message_key: key,
                        },
                        fingerprint,
                        message: Some(item.message),
                        fate: Fate::Deferred,
                        claimed: false,
                        failed_alone: false,
                        staged: 0,
                    });
                    None
                }
            },
        };
        if let Some(result) = &early {
            record(consumer.as_str(), &item.metadata, result);
        }
        sorted.results.push(early);
        sorted.metadata.push(item.metadata);
    }
    sorted
        .leads
        .sort_by(|a, b| a.key.message_key.cmp(&b.key.message_key));
    sorted
}

/// What a record found for a first copy means: a completed, unexpired record is a duplicate
/// (or a mismatch); an unreadable one is corrupt; anything else goes the per-message way.
fn known_fate<M, T>(lead: &Lead<M, T>, row: Row) -> Fate<T> {
    let Some(status) = Status::parse(&row.status) else {
        return Fate::Failed(Error::CorruptRecord {
            key: lead.key.clone(),
            detail: format!("unknown status {:?}", row.status),
        });
    };
    if status != Status::Completed || row.expires_at <= row.now {
        return Fate::Deferred;
    }
    match check_stored_fingerprint(
        &lead.key,
        row.fingerprint.as_deref(),
        lead.fingerprint.as_ref(),
    ) {
        Ok(()) => Fate::Duplicate(row.output, row.fingerprint),
        Err(error) => Fate::Failed(error),
    }
}

/// What running a handler with no savepoint needs.
struct Unguarded<'a> {
    store: &'a Store,
    tx: &'a DatabaseTransaction,
    /// The batch's transaction, which the handler must leave open, where the database tells it
    /// (PostgreSQL).
    transaction_id: Option<i64>,
    /// Whether the transaction is checked after each handler.
    check_each: bool,
    staging: Staging<'a>,
}

/// What the check after an unguarded handler found of the batch's transaction.
enum Checked {
    /// Open and unbroken.
    Open,
    /// Aborted by a failed statement: the handler's own when the one before was checked.
    Aborted,
    /// Ended by the handler's own `COMMIT` or `ROLLBACK`.
    Ended,
}

/// What became of an unguarded handler's message.
enum Ran {
    /// Processed; its fate is set.
    Processed,
    /// Failed by its own doing; its fate is set.
    Failed,
    /// Failed in a transaction that may have been aborted or ended before it ran (by an earlier
    /// handler, unchecked): only a try with savepoints tells whose.
    Unsure,
}

impl Unguarded<'_> {
    /// Runs a fresh message's handler on a copy of its message, and says what became of it.
    /// Checked after each handler, the transaction tells whether a failure is the message's
    /// own; but nothing of the transaction can be kept apart from it: the caller rolls it back
    /// and runs the others again. An error means the transaction is lost: the database, or a
    /// handler that ended it.
    async fn run<H: Handler>(
        &self,
        handler: &H,
        lead: &mut Lead<H::Message, H::Output>,
        metadata: &Metadata,
    ) -> Result<Ran, Lost>
    where
        H::Message: Clone,
    {
        let message = lead.message_copy();
        let ran = handle(handler, self.tx, &lead.key, metadata, self.staging, message).await;
        let (failure, checked) = match ran {
            Err(failure) if failure.is_store_unavailable() => return Err(lost_database()),
            Ok(handled) if !self.check_each => {
                lead.processed(handled);
                return Ok(Ran::Processed);
            }
            Err(failure) => match self.check().await? {
                // Aborted by a failed statement, or ended: by this handler, unless an unchecked
                // handler before it did so.
                Checked::Aborted | Checked::Ended if !self.check_each => return Ok(Ran::Unsure),
                // Where the database cannot tell, the claim does: gone with a transaction an
                // unchecked handler before this one let the database roll back, or ended.
                Checked::Open
                    if self.transaction_id.is_none() && !self.holds(&lead.key).await? =>
                {
                    return Ok(Ran::Unsure);
                }
                checked => (failure, checked),
            },
            Ok(handled) => match self.check().await? {
                Checked::Open => {
                    lead.processed(handled);
                    return Ok(Ran::Processed);
                }
                // A failed statement the handler swallowed, or a transaction it ended.
                checked => (
                    Error::TransactionAborted {
                        key: lead.key.clone(),
                    },
                    checked,
                ),
            },
        };
        lead.fate = Fate::Failed(failure);
        if matches!(checked, Checked::Ended) {
            // Whatever the handler wrote after ending the transaction committed on its own, as
            // it would have alone; nothing else may run outside the transaction.
            return Err(Lost::RolledBack);
        }
        Ok(Ran::Failed)
    }

    /// Whether the batch's transaction still holds its claim on `key`.
    async fn holds(&self, key: &InboxKey) -> Result<bool, Lost> {
        match self.store.find(self.tx, key).await {
            Ok(row) => Ok(row.is_some_and(|row| row.claim_token == self.staging.claim.token)),
            Err(error) if classify(&error) == Failure::Unreachable => Err(Lost::Database(error)),
            // Not told: the checked try will.
            Err(_) => Ok(false),
        }
    }

    /// Looks at the batch's transaction after a handler; open where the database cannot tell.
    async fn check(&self) -> Result<Checked, Lost> {
        let Some(expected) = self.transaction_id else {
            return Ok(Checked::Open);
        };
        match self.store.transaction_id(self.tx).await {
            Ok(id) if id == Some(expected) => Ok(Checked::Open),
            Ok(_) => Ok(Checked::Ended),
            Err(error) if classify(&error) == Failure::Unreachable => Err(Lost::Database(error)),
            Err(_) => Ok(Checked::Aborted),
        }
    }
}

/// Where a batch's handlers stage: the outbox, under the batch's claims.
#[derive(Debug, Clone, Copy)]
struct Staging<'a> {
    outbox: Option<&'a Outbox>,
    claim: RunClaim<'a>,
}

/// What a handler that succeeded gave: its output, the JSON stored for it, and how many
/// messages it staged in the outbox.
struct Handled<T> {
    output: T,
    stored: Option<String>,
    staged: u32,
}

impl<M, T> Lead<M, T> {
    /// A copy of the message for its handler: the message is kept until it commits, for the
    /// batch may run again, or leave it to the per-message path.
    fn message_copy(&self) -> M
    where
        M: Clone,
    {
        self.message
            .clone()
            .expect("a fresh message is kept until it commits")
    }

    fn processed(&mut self, handled: Handled<T>) {
        self.staged = handled.staged;
        self.fate = Fate::Processed(handled.output, handled.stored);
    }
}

/// Runs a fresh message's handler on `message` in the batch's transaction: what it gave, or
/// why it failed (an outage of the store when the handler lost the database).
async fn handle<H: Handler>(
    handler: &H,
    tx: &DatabaseTransaction,
    key: &InboxKey,
    metadata: &Metadata,
    staging: Staging<'_>,
    message: H::Message,
) -> Result<Handled<H::Output>> {
    let cx = Context::new(&key.message_key, metadata, Some(tx))
        .with_origin(key, staging.outbox)
        .with_run_claim(staging.claim);
    match run(handler, &cx, message).await {
        Ok(output) => match serde_json::to_string(&output) {
            Ok(json) => Ok(Handled {
                output,
                stored: (json != "null").then_some(json),
                staged: cx.outbound().staged(),
            }),
            Err(error) => Err(Error::OutputNotStorable(Box::new(error))),
        },
        Err(error) => Err(outage_or(error, tx).await),
    }
}

/// Rolls back a batch's transaction to run it again.
async fn roll_back(tx: DatabaseTransaction) -> Result<(), Lost> {
    tx.rollback().await.map_err(Lost::Database)
}

/// Rolls back a batch's transaction that a handler may have ended or broken, to run it again:
/// only an unreachable database loses it (SQLite refuses to roll back what already ended).
async fn roll_back_broken(tx: DatabaseTransaction) -> Result<(), Lost> {
    match tx.rollback().await {
        Err(error) if classify(&error) == Failure::Unreachable => Err(Lost::Database(error)),
        _ => Ok(()),
    }
}

/// A handler of the batch lost the database.
fn lost_database() -> Lost {
    Lost::Database(DbErr::Conn(RuntimeErr::Internal(
        "a handler of the batch lost the database".to_owned(),
    )))
}

/// The savepoints of a guarded batch, one per message. A message's savepoint is released in the
/// same round trip as the next one is taken: releasing fails when the handler broke it
/// (PostgreSQL aborted it after a failed statement, or the database rolled the whole
/// transaction back), and that message is then failed and rolled back to it.
struct Savepoints<'a> {
    tx: &'a DatabaseTransaction,
    /// The lead whose handler succeeded under the savepoint still open.
    open: Option<usize>,
}

impl Savepoints<'_> {
    /// Takes the next message's savepoint, releasing the open one.
    async fn take<M, T>(&mut self, leads: &mut [Lead<M, T>]) -> Result<(), Lost> {
        if let Some(open) = self.open.take() {
            let both = "RELEASE SAVEPOINT idem_message; SAVEPOINT idem_message";
            match self.tx.execute_unprepared(both).await {
                Ok(_) => return Ok(()),
                Err(error) if classify(&error) == Failure::Unreachable => {
                    return Err(Lost::Database(error));
                }
                Err(_) => self.broken(&mut leads[open]).await?,
            }
        }
        savepoint(self.tx, "SAVEPOINT idem_message").await
    }

    /// Releases the open savepoint, after the last message.
    async fn release<M, T>(&mut self, leads: &mut [Lead<M, T>]) -> Result<(), Lost> {
        let Some(open) = self.open.take() else {
            return Ok(());
        };
        match self
            .tx
            .execute_unprepared("RELEASE SAVEPOINT idem_message")
            .await
        {
            Ok(_) => Ok(()),
            Err(error) if classify(&error) == Failure::Unreachable => Err(Lost::Database(error)),
            Err(_) => self.broken(&mut leads[open]).await,
        }
    }

    /// Fails a message whose handler broke its savepoint, and rolls its work back.
    async fn broken<M, T>(&self, lead: &mut Lead<M, T>) -> Result<(), Lost> {
        lead.staged = 0;
        lead.fate = Fate::Failed(Error::TransactionAborted {
            key: lead.key.clone(),
        });
        roll_back_to_savepoint(self.tx).await
    }
}

/// Runs a fresh message's handler under the savepoint just taken, and sets its fate:
/// processed, or failed and rolled back to the savepoint; returns whether it was processed.
/// An error means the transaction is lost.
async fn run_fresh<H: Handler>(
    handler: &H,
    tx: &DatabaseTransaction,
    lead: &mut Lead<H::Message, H::Output>,
    metadata: &Metadata,
    staging: Staging<'_>,
) -> Result<bool, Lost>
where
    H::Message: Clone,
{
    let message = lead.message_copy();
    let failure = match handle(handler, tx, &lead.key, metadata, staging, message).await {
        Ok(handled) => {
            lead.processed(handled);
            return Ok(true);
        }
        Err(failure) => failure,
    };
    let outage = failure.is_store_unavailable();
    lead.fate = Fate::Failed(failure);
    if outage {
        return Err(lost_database());
    }
    roll_back_to_savepoint(tx).await?;
    Ok(false)
}

/// Rolls back to the message's savepoint, which the whole transaction may have gone with, and
/// releases it: no older savepoint of the same name is left for a later rollback to reach.
async fn roll_back_to_savepoint(tx: &DatabaseTransaction) -> Result<(), Lost> {
    match tx
        .execute_unprepared("ROLLBACK TO SAVEPOINT idem_message; RELEASE SAVEPOINT idem_message")
        .await
    {
        Ok(_) => Ok(()),
        Err(error) if classify(&error) == Failure::Unreachable => Err(Lost::Database(error)),
        Err(_) => Err(Lost::RolledBack),
    }
}

/// Runs a savepoint statement of the batch; its failure loses the transaction.
async fn savepoint(tx: &DatabaseTransaction, sql: &str) -> Result<(), Lost> {
    match tx.execute_unprepared(sql).await {
        Ok(_) => Ok(()),
        Err(error) if classify(&error) == Failure::Unreachable => Err(Lost::Database(error)),
        Err(_) => Err(Lost::RolledBack),
    }
}

/// Counts and logs one message's result, as the per-message path does.
fn record<T>(consumer: &str, metadata: &Metadata, result: &Result<Outcome<T>>) {
    let span = observe::span(consumer, metadata);
    observe::record(&span, consumer, result);
}

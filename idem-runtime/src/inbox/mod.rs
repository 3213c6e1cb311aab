//! The inbox: runs a handler at most once per key, in transactional or two-phase mode.

mod batch;
mod builder;
mod claim;
mod completion;
mod operate;
mod record;
mod renewal;
mod two_phase;
mod unrecorded;

use std::any::Any;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction};
use serde::de::DeserializeOwned;
use tracing::Instrument;

use crate::clock::{capped, duration_ms, from_epoch_ms};
use crate::context::Context;
use crate::error::{ConfigError, Error, Result};
use crate::handler::{Handler, Mode, Outcome};
use crate::key::{ConsumerName, InboxKey, KeyError, MessageKey};
use crate::metadata::Metadata;
use crate::observe;
use crate::outbox::{Outbox, RunClaim, RunStatements};
use crate::retention::policy::check_covers;
use crate::retention::{RedeliveryWindow, RetentionPolicy};
use crate::store::Store;
use crate::store::dialect::{Failure, classify, database_error_in, refuses_value};
use crate::store::table::TableName;
use crate::telemetry::Telemetry;

pub use batch::{BatchChecks, BatchItem, MAX_BATCH};
pub use builder::InboxBuilder;
pub use operate::{ConsumerStats, Forgotten, Released};
pub use record::InboxRecord;

use claim::{ClaimRequest, Claimed, Deadlocks};

/// The inbox of processed messages, kept in the application's database.
///
/// [`Inbox::process`] runs a [`Handler`] at most once per inbox key `(consumer, message key)`:
/// a new message is processed and its output recorded; a duplicate gets the recorded output back
/// without running the handler. Cloning an inbox is cheap; clones share the connection pool.
///
/// ```
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_runtime::{Inbox, Metadata, Outcome};
/// # use idem_runtime::{Context, Fingerprint, FingerprintError, Handler, KeyError, MessageKey};
/// # struct Greeter;
/// # impl Handler for Greeter {
/// #     type Message = String; type Output = usize; type Error = std::io::Error;
/// #     fn consumer(&self) -> &str { "greeter" }
/// #     fn key(&self, m: &String, _: &Metadata) -> Result<MessageKey, KeyError> { MessageKey::new(m.as_str()) }
/// #     fn fingerprint(&self, m: &String, meta: &Metadata) -> Result<Option<Fingerprint>, FingerprintError> { meta.content_fingerprint(m).map(Some) }
/// #     async fn handle(&self, _: &Context<'_>, m: String) -> Result<usize, std::io::Error> { Ok(m.len()) }
/// # }
/// let db = sea_orm::Database::connect("sqlite::memory:").await?;
/// let inbox = Inbox::builder(db).build().await?;
/// let meta = Metadata::default();
/// let first = inbox.process(&Greeter, "hello".to_owned(), &meta).await?;
/// let again = inbox.process(&Greeter, "hello".to_owned(), &meta).await?;
/// assert_eq!(first, Outcome::Processed(5));
/// assert_eq!(again, Outcome::Duplicate(5));
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct Inbox {
    inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) db: DatabaseConnection,
    pub(crate) store: Store,
    /// What it learns of its duplicates, shared with the inboxes derived from it.
    pub(crate) telemetry: Arc<Telemetry>,
    pub(crate) retention: RetentionPolicy,
    window: Option<RedeliveryWindow>,
    max_attempts: u32,
    claim_wait: Duration,
    /// Two-phase leases set at run time, by consumer.
    leases: HashMap<String, Duration>,
    /// Where handlers stage outgoing messages.
    pub(crate) outbox: Option<Outbox>,
    /// The statements that stage under this inbox's claims, with an outbox.
    pub(crate) run_statements: Option<RunStatements>,
    /// Taken by each batch's transaction on SQLite, which writes one transaction at a time:
    /// batches waiting here take their turn at once, where SQLite's busy handler would have
    /// them sleep and poll.
    pub(crate) sqlite_batches: Arc<tokio::sync::Mutex<()>>,
}

impl Inbox {
    /// Starts configuring an inbox on `db` (SQLite, PostgreSQL or MySQL/MariaDB).
    pub fn builder(db: DatabaseConnection) -> InboxBuilder {
        InboxBuilder::new(db)
    }

    /// This inbox (its pool, table, settings and outbox) with claims that do not wait for
    /// another transaction holding their key: such a claim is
    /// [`Error::InProgressElsewhere`] at once, and its connection goes back to the pool. For
    /// callers that answer a busy key themselves, as an HTTP guard answers a retry 409, rather
    /// than hold a pooled connection waiting for it.
    ///
    /// PostgreSQL bounds the claim's lock waits to a millisecond (`lock_timeout`), MariaDB to
    /// none (`innodb_lock_wait_timeout = 0`, for the claim's statements only). SQLite, which
    /// locks the whole file, still waits up to the connection's busy timeout, and MySQL the
    /// server's `innodb_lock_wait_timeout`.
    pub fn without_claim_wait(&self) -> Inbox {
        let inner = &self.inner;
        Inbox {
            inner: Arc::new(Inner {
                db: inner.db.clone(),
                store: inner.store.with_claim_wait(Duration::ZERO),
                telemetry: Arc::clone(&inner.telemetry),
                retention: inner.retention.clone(),
                window: inner.window,
                max_attempts: inner.max_attempts,
                claim_wait: Duration::ZERO,
                leases: inner.leases.clone(),
                outbox: inner.outbox.clone(),
                run_statements: inner.run_statements.clone(),
                sqlite_batches: Arc::clone(&inner.sqlite_batches),
            }),
        }
    }

    /// Processes `message` with `handler`, at most once per key.
    ///
    /// Returns [`Outcome::Processed`] with the handler's output, or [`Outcome::Duplicate`] with
    /// the output recorded the first time. Every error says how to settle the delivery
    /// ([`Error::settle`]).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it completes is a crash of this worker as far as the message
    /// is concerned: in transactional, entity and natural modes the transaction rolls back and
    /// nothing is recorded (entity mode: the marker entity with the rest);
    /// in two-phase mode the handler and the renewal of its lease stop together, and the claim
    /// stays in progress until its lease runs out, when a redelivery takes it over.
    //
    // The future is boxed (one allocation per message, beside a database round trip) so that a
    // value that is not a handler, such as an `#[idempotent]` function passed instead of its
    // `<name>_handler()`, is one error at the argument: an `async fn`'s future carries the
    // `H: Handler` bound, and the compiler would report it again at the call and at `.await`.
    pub fn process<'a, H: Handler>(
        &'a self,
        handler: &'a H,
        message: H::Message,
        metadata: &'a Metadata,
    ) -> BoxFuture<'a, Result<Outcome<H::Output>>> {
        Box::pin(async move {
            let key = handler.key(&message, metadata);
            self.process_with_key(handler, key, message, metadata).await
        })
    }

    /// [`Inbox::process`] with the key [`Handler::key`] gave for this message, for a caller that
    /// needs the key itself (a transport puts it in its logs and dead-letter headers) and should
    /// not compute it twice.
    pub async fn process_with_key<H: Handler>(
        &self,
        handler: &H,
        key: Result<MessageKey, KeyError>,
        message: H::Message,
        metadata: &Metadata,
    ) -> Result<Outcome<H::Output>> {
        let consumer = handler.consumer();
        let span = observe::span(consumer, metadata);
        let begun = std::time::Instant::now();
        let result = self
            .process_in_span(handler, key, message, metadata)
            .instrument(span.clone())
            .await;
        observe::processing_duration(consumer, begun, &result);
        let expected = result
            .as_ref()
            .is_err_and(|error| handler.is_expected(error));
        observe::record(&span, consumer, &result, expected);
        result
    }

    async fn process_in_span<H: Handler>(
        &self,
        handler: &H,
        key: Result<MessageKey, KeyError>,
        message: H::Message,
        metadata: &Metadata,
    ) -> Result<Outcome<H::Output>> {
        let consumer = ConsumerName::new(handler.consumer()).map_err(Error::InvalidConsumer)?;
        let message_key = key.map_err(Error::InvalidKey)?;
        tracing::Span::current().record("key", message_key.as_str());
        let key = InboxKey {
            consumer,
            message_key,
        };
        match handler.mode() {
            Mode::Entity => {
                let fingerprint = fingerprint_of(handler, &message, metadata)?;
                return self
                    .entity(handler, &key, fingerprint, message, metadata)
                    .await;
            }
            // Nothing to compare a copy with.
            Mode::Natural => return self.natural(handler, &key, message, metadata).await,
            Mode::Transactional | Mode::TwoPhase { .. } => {}
        }
        let fingerprint = fingerprint_of(handler, &message, metadata)?;
        let (retention, lease) = self.settings_for(&key.consumer, handler)?;
        let request = ClaimRequest {
            key: &key,
            fingerprint: fingerprint.as_ref(),
            lease,
            retention,
            max_attempts: self.inner.max_attempts,
            claim_wait: self.inner.claim_wait,
        };
        if request.lease.is_some() {
            self.two_phase(handler, request, message, metadata).await
        } else {
            self.transactional(handler, request, message, metadata)
                .await
        }
    }

    /// Claim, handler and output in one transaction.
    async fn transactional<H: Handler>(
        &self,
        handler: &H,
        request: ClaimRequest<'_>,
        message: H::Message,
        metadata: &Metadata,
    ) -> Result<Outcome<H::Output>> {
        let store = &self.inner.store;
        let mut deadlocks = Deadlocks::default();
        let (tx, token, attempt, previous_claim_at) = loop {
            let tx = store.dialect().begin(&self.inner.db).await?;
            match claim::claim(store, &tx, request).await {
                Ok(Claimed::Completed { output, age }) => {
                    tx.commit().await?;
                    let duplicate = decode_stored(request.key, output)?;
                    (self.inner.telemetry).duplicate(request.key.consumer.as_str(), age);
                    return Ok(Outcome::Duplicate(duplicate));
                }
                Ok(Claimed::Acquired {
                    token,
                    attempt,
                    previous_claim_at,
                    before,
                }) => {
                    (self.inner.telemetry).claimed(request.key, before, request.retention);
                    break (tx, token, attempt, previous_claim_at);
                }
                Err(Error::Contention(error)) if deadlocks.try_again(&error) => drop(tx),
                Err(error) => return Err(error),
            }
        };
        let claim = RunClaim {
            statements: self.inner.run_statements.as_ref(),
            token,
        };
        let cx = Context::new(&request.key.message_key, metadata, Some(&tx))
            .with_attempt(attempt, previous_claim_at.map(from_epoch_ms))
            .with_origin(request.key, self.inner.outbox.as_ref())
            .with_run_claim(claim);
        let output = match run(handler, &cx, message).await {
            Ok(output) => output,
            Err(error) => return Err(outage_or(error, &tx).await),
        };
        let json = serde_json::to_string(&output)
            .map_err(|error| Error::OutputNotStorable(Box::new(error)))?;
        let stored = (json != "null").then_some(json.as_str());
        if let Some(json) = stored {
            store
                .check_output(&request.key.message_key, json)
                .map_err(|error| Error::OutputNotStorable(Box::new(error)))?;
        }
        // The completion is the transaction's last statement, whatever the output: it must find
        // this claim in progress, which a transaction the database aborted or rolled back no
        // longer has. Only then does the commit mean the effects and the record are stored.
        let key = request.key;
        match store
            .complete(&tx, key, token, stored, request.retention)
            .await
        {
            Ok(true) => {}
            Ok(false) => return Err(Error::TransactionAborted { key: key.clone() }),
            Err(error) => {
                return Err(match classify(&error) {
                    Failure::Aborted => Error::TransactionAborted { key: key.clone() },
                    Failure::Refused if stored.is_some() && refuses_value(&error) => {
                        Error::OutputNotStorable(Box::new(error))
                    }
                    _ => error.into(),
                });
            }
        }
        self.commit(cx.outbound().staged(), tx).await?;
        Ok(Outcome::Processed(output))
    }

    /// Commits a run's transaction, which `staged` messages, and wakes the relays for them.
    async fn commit(&self, staged: u32, tx: DatabaseTransaction) -> Result<()> {
        tx.commit().await?;
        self.staged(staged);
        Ok(())
    }

    /// Wakes the outbox's relays after a commit that staged `count` messages, and counts them.
    fn staged(&self, count: u32) {
        if let Some(outbox) = &self.inner.outbox
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

    /// Checks a handler against this inbox's configuration before it processes anything: its
    /// consumer name, and its retention against the redelivery window if one was given. Its
    /// consumer's `idem_late_duplicates_total` is registered at zero then.
    pub fn check_handler<H: Handler>(&self, handler: &H) -> Result<(), Error> {
        let consumer = ConsumerName::new(handler.consumer()).map_err(Error::InvalidConsumer)?;
        if matches!(handler.mode(), Mode::Entity | Mode::Natural) {
            // No record to keep, no retention to cover the window.
            return Ok(());
        }
        // Its counter of late duplicates is scraped at zero from its start.
        self.inner.telemetry.known(consumer.as_str());
        let (retention, _) = self.settings_for(&consumer, handler)?;
        if let Some(window) = &self.inner.window {
            check_covers(consumer.as_str(), retention, window.duration())?;
        }
        Ok(())
    }

    /// The retention and, for a two-phase handler, the lease that `handler` runs with. Less
    /// than a millisecond is refused (a handler's own, which the builder never saw): its records
    /// would expire, or its claims be taken over, at once.
    pub(crate) fn settings_for<H: Handler>(
        &self,
        consumer: &ConsumerName,
        handler: &H,
    ) -> Result<(Duration, Option<Duration>), ConfigError> {
        let retention = self
            .inner
            .retention
            .retention_for(consumer.as_str(), handler.retention());
        // Stored in whole milliseconds: less than one is none.
        if duration_ms(retention) == 0 {
            return Err(ConfigError::Zero("retention"));
        }
        let lease = match handler.mode() {
            Mode::Transactional | Mode::Entity | Mode::Natural => None,
            Mode::TwoPhase { lease } => {
                let lease = self
                    .inner
                    .leases
                    .get(consumer.as_str())
                    .copied()
                    .unwrap_or(lease);
                if duration_ms(lease) == 0 {
                    return Err(ConfigError::Zero("lease"));
                }
                Some(capped(lease))
            }
        };
        Ok((capped(retention), lease))
    }

    /// Reads the record of `key` as committed, if any, without waiting for a claim still in
    /// its transaction (for operators and tests).
    pub async fn lookup(&self, key: &InboxKey) -> Result<Option<InboxRecord>> {
        let Some(row) = self.inner.store.peek(&self.inner.db, key).await? else {
            return Ok(None);
        };
        let status = row.status.clone();
        InboxRecord::from_row(row)
            .map(Some)
            .ok_or_else(|| Error::CorruptRecord {
                key: key.clone(),
                detail: format!("unknown status {status:?}"),
            })
    }

    /// The database connection the inbox uses.
    pub fn connection(&self) -> &DatabaseConnection {
        &self.inner.db
    }

    /// The inbox table's name.
    pub fn table(&self) -> &TableName {
        self.inner.store.table()
    }

    /// The retention policy.
    pub fn retention(&self) -> &RetentionPolicy {
        &self.inner.retention
    }

    /// How many claims a key may have before it needs intervention.
    pub fn max_attempts(&self) -> u32 {
        self.inner.max_attempts
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }
}

/// Runs `work` to its end, polling the `renewal` beside it while there is one: once it ends
/// (the claim lost), it is dropped and `work` goes on alone.
async fn beside<T, R: Future<Output = ()>>(
    work: impl Future<Output = T>,
    renewal: &mut Option<std::pin::Pin<Box<R>>>,
) -> T {
    tokio::pin!(work);
    let Some(renewing) = renewal.as_mut() else {
        return work.await;
    };
    tokio::select! {
        biased;
        done = &mut work => done,
        () = renewing => {
            *renewal = None;
            work.await
        }
    }
}

/// A transactional handler's failure, or the database outage or contention behind it: when the
/// handler's statements failed because the database went away, or met a deadlock or a lock not
/// granted in time, the message is not at fault. Told by a database error in the handler
/// error's source chain, or by the transaction itself no longer reaching the database.
async fn outage_or(error: Error, tx: &DatabaseTransaction) -> Error {
    let Error::Handler { source, .. } = &error else {
        return error;
    };
    if let Some(db_error) = database_error_in(source.as_ref()) {
        match classify(&db_error) {
            // The database's own error, whose kind (no connection free, a server that takes no
            // writes) decides how the delivery is retried.
            Failure::Unreachable => return Error::StoreUnavailable(db_error),
            // Retried without counting an attempt, as a claim's contention is.
            Failure::Deadlock | Failure::LockTimeout => return Error::Contention(db_error),
            Failure::Aborted | Failure::Refused => {}
        }
    }
    match tx.execute_unprepared("SELECT 1").await {
        Err(probe) if classify(&probe) == Failure::Unreachable => Error::StoreUnavailable(probe),
        _ => error,
    }
}

/// Runs the handler, turning its error and its panic into [`Error`]s.
async fn run<H: Handler>(handler: &H, cx: &Context<'_>, message: H::Message) -> Result<H::Output> {
    match AssertUnwindSafe(handler.handle(cx, message))
        .catch_unwind()
        .await
    {
        Ok(Ok(output)) => Ok(output),
        Ok(Err(error)) => Err(Error::Handler {
            permanent: handler.is_permanent(&error),
            source: Box::new(error),
        }),
        Err(panic) => Err(Error::HandlerPanicked(panic_message(panic.as_ref()))),
    }
}

/// The handler's fingerprint of `message`; a panic in it (user code) is the message's own
/// failure, [`Error::HandlerPanicked`], not its batch's.
fn fingerprint_of<H: Handler>(
    handler: &H,
    message: &H::Message,
    metadata: &Metadata,
) -> Result<Option<crate::Fingerprint>> {
    std::panic::catch_unwind(AssertUnwindSafe(|| handler.fingerprint(message, metadata)))
        .map_err(|panic| Error::HandlerPanicked(panic_message(panic.as_ref())))?
        .map_err(Error::from)
}

/// The message a panic carries, for errors and logs.
pub fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

fn decode_stored<T: DeserializeOwned>(key: &InboxKey, output: Option<String>) -> Result<T> {
    serde_json::from_str(output.as_deref().unwrap_or("null")).map_err(|source| {
        Error::StoredOutputUnreadable {
            key: key.clone(),
            source,
        }
    })
}

/// The default number of claims before a key needs intervention.
pub(crate) const DEFAULT_MAX_ATTEMPTS: u32 = 5;

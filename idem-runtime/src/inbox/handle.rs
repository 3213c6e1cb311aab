//! The inbox as its users hold it: built once, cloned freely; every public method is here,
//! each handing the work to the room that does it.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use sea_orm::DatabaseConnection;

use super::batch::BatchItem;
use super::builder::InboxBuilder;
use super::inner::Inner;
use crate::error::Result;
use crate::handler::{Handler, Outcome};
use crate::metadata::Metadata;
use crate::retention::{Cleaner, RetentionPolicy};
use crate::store::table::TableName;

/// The inbox of processed messages, kept in the application's database.
///
/// [`Inbox::process`] runs a [`Handler`] at most once per inbox key `(consumer, message key)`:
/// a new message is processed and its output recorded; a duplicate gets the recorded output back
/// without running the handler. Cloning an inbox is cheap; clones share the connection pool.
///
/// ```
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_runtime::{Inbox, Metadata, Outcome};
/// # use idem_runtime::{Context, Handler, KeyError, MessageKey};
/// # use idem_runtime::fingerprint::{Fingerprint, FingerprintError};
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

impl Inbox {
    /// The state of this inbox, for the traits of other audiences (`admin`, `transport`).
    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }

    /// An inbox of `inner`, built and checked.
    pub(crate) fn of(inner: Inner) -> Self {
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Starts configuring an inbox on `db` (SQLite, PostgreSQL or MySQL/MariaDB).
    pub fn builder(db: DatabaseConnection) -> InboxBuilder {
        InboxBuilder::new(db)
    }

    /// Processes `message` with `handler`, at most once per key.
    ///
    /// Returns [`Outcome::Processed`] with the handler's output, or [`Outcome::Duplicate`] with
    /// the output recorded the first time. Every error says how to settle the delivery
    /// ([`Error::settle`](crate::Error::settle)).
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
            self.inner
                .process_with_key(handler, key, message, metadata)
                .await
        })
    }

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
    /// - The handlers run one after the other with no savepoint or check between them, as
    ///   hand-written batch code runs its own ([`BatchChecks::BeforeCommit`](crate::transport::BatchChecks::BeforeCommit)); the completion
    ///   finds a transaction aborted or lost under them. When a handler fails, its error stands,
    ///   the transaction is rolled back, and the others run again, each under a savepoint. A
    ///   handler may thus run twice, its effects committed once; messages are cloned for it.
    /// - Handlers not trusted to return every failed statement's error and leave their
    ///   transaction open can be checked after each, one round trip per message: see
    ///   [`Processing::process_batch_with`](crate::transport::Processing::process_batch_with).
    /// - A handler that carries on after a failed statement breaks the transaction on
    ///   PostgreSQL ([`Error::TransactionAborted`](crate::Error::TransactionAborted) for it, the others unharmed). Where the
    ///   database rolls back the whole transaction instead (a MySQL/MariaDB deadlock), or the
    ///   handler ends it itself, that message gets its own error and every other message the
    ///   transaction held gets [`Error::BatchRolledBack`](crate::Error::BatchRolledBack), which does not count as an attempt.
    ///   A handler must not commit the transaction it is given: what it commits by itself
    ///   (other messages' claims and writes included) is outside these guarantees.
    ///
    /// A batch trades latency for throughput: its messages are committed together, after the
    /// slowest of them. A two-phase handler's messages are processed one by one. At most
    /// [`MAX_BATCH`](crate::transport::MAX_BATCH) messages share a transaction; larger batches are split. On SQLite, which
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
        self.inner.process_batch(handler, items).await
    }

    /// The cleaner of this inbox's table.
    pub fn cleaner(&self) -> Cleaner {
        self.inner.cleaner()
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
}

impl InboxBuilder {
    /// Validates the configuration, creates the table if asked, checks that the table has the
    /// schema this version uses, and returns the inbox.
    ///
    /// # Errors
    ///
    /// A setting is invalid, the database is unreachable, or the table has another schema.
    pub async fn build(self) -> Result<Inbox> {
        Ok(Inbox::of(self.open().await?))
    }
}

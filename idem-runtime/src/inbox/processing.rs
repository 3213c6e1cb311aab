//! The transports' side of an inbox (see `crate::transport`): a message whose key the transport
//! has, batches with their checks, slices, a handler checked at start, claims that do not wait.

use super::batch::{BatchChecks, BatchItem};
use super::handle::Inbox;
use crate::error::{Error, Result};
use crate::handler::{Handler, Outcome};
use crate::key::{KeyError, MessageKey};
use crate::metadata::Metadata;
use crate::slice::SliceHandler;

/// What a transport adapter asks of an inbox beyond [`Inbox::process`]: a message whose key it
/// has, batches with its choice of checks, slices, a handler checked at start, claims that do
/// not wait. Import it where an adapter drives an inbox (the RabbitMQ consumer does).
pub trait Processing {
    /// [`Inbox::process`] with the key [`Handler::key`] gave for this message, for a caller that
    /// needs the key itself (a transport puts it in its logs and dead-letter headers) and should
    /// not compute it twice.
    fn process_with_key<H: Handler>(
        &self,
        handler: &H,
        key: Result<MessageKey, KeyError>,
        message: H::Message,
        metadata: &Metadata,
    ) -> impl Future<Output = Result<Outcome<H::Output>>> + Send;

    /// [`Inbox::process_batch`], checking the handlers as `checks` says: once before the
    /// commit (the default, [`BatchChecks::BeforeCommit`]), or after each of them for handlers
    /// not trusted to leave the transaction whole ([`BatchChecks::EachMessage`], one round
    /// trip more per message).
    fn process_batch_with<H: Handler>(
        &self,
        handler: &H,
        items: Vec<BatchItem<H::Message>>,
        checks: BatchChecks,
    ) -> impl Future<Output = Vec<Result<Outcome<H::Output>>>> + Send
    where
        H::Message: Clone;

    /// Processes `items` with a slice handler in one transaction, returning one result per item,
    /// in order, each what [`Inbox::process`] would have returned for that message: as
    /// [`Inbox::process_batch`] does, but with the fresh messages handled in one call of
    /// [`SliceHandler::handle_slice`].
    ///
    /// The call runs under a savepoint. When it fails (an error, a panic, an output count that
    /// is not the slice's, an output the database would not store), it is rolled back and each
    /// half of the slice runs again under a savepoint of its own, down to single messages:
    /// a message that fails alone gets its error, and the others commit. A handler whose
    /// failure says the database is unreachable loses the batch when the batch's own
    /// transaction no longer reaches it, as in [`Inbox::process_batch`]. A slice handler that
    /// ends its transaction (or carries on after a MySQL/MariaDB deadlock rolled it back) fails
    /// every message of that slice with [`Error::TransactionAborted`].
    ///
    /// A slice handler that is not transactional processes its messages one by one.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future rolls the batch's transaction back: nothing of it is recorded.
    fn process_slices<S: SliceHandler>(
        &self,
        handler: &S,
        items: Vec<BatchItem<S::Message>>,
    ) -> impl Future<Output = Vec<Result<Outcome<S::Output>>>> + Send
    where
        S::Message: Clone;

    /// Checks a handler against this inbox's configuration before it processes anything: its
    /// consumer name, and its retention against the redelivery window if one was given. Its
    /// consumer's `idem_late_duplicates_total` is registered at zero then.
    fn check_handler<H: Handler>(&self, handler: &H) -> Result<(), Error>;

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
    fn without_claim_wait(&self) -> Inbox;
}

impl Processing for Inbox {
    async fn process_with_key<H: Handler>(
        &self,
        handler: &H,
        key: Result<MessageKey, KeyError>,
        message: H::Message,
        metadata: &Metadata,
    ) -> Result<Outcome<H::Output>> {
        self.inner()
            .process_with_key(handler, key, message, metadata)
            .await
    }

    async fn process_batch_with<H: Handler>(
        &self,
        handler: &H,
        items: Vec<BatchItem<H::Message>>,
        checks: BatchChecks,
    ) -> Vec<Result<Outcome<H::Output>>>
    where
        H::Message: Clone,
    {
        self.inner()
            .process_batch_with(handler, items, checks)
            .await
    }

    async fn process_slices<S: SliceHandler>(
        &self,
        handler: &S,
        items: Vec<BatchItem<S::Message>>,
    ) -> Vec<Result<Outcome<S::Output>>>
    where
        S::Message: Clone,
    {
        self.inner().process_slices(handler, items).await
    }

    fn check_handler<H: Handler>(&self, handler: &H) -> Result<(), Error> {
        self.inner().check_handler(handler)
    }

    fn without_claim_wait(&self) -> Inbox {
        Self::of(self.inner().without_claim_wait())
    }
}

//! What a handler run sends on: messages staged in its transaction, and keys for downstream
//! calls, each with an id derived from the message being processed.

use std::sync::atomic::{AtomicU32, Ordering};

use sea_orm::DatabaseTransaction;

use super::handle::Outbox;
use super::staging::RunClaim;
use super::{OutboxMessage, StagingError, derived_id};
use crate::key::{ConsumerName, InboxKey, MessageKey};
use crate::metadata::Metadata;

/// A handler run's way out: [`Outbound::stage`] stages a message in the handler's transaction,
/// [`Outbound::downstream_key`] gives a key for a call to another service. Both number what they
/// give in the order the handler asks, and derive the id from (consumer, message key, number):
/// every run of the handler for the same message, on any worker, gives the same ids, so the next
/// hop recognises a repeat. A handler that stages or calls in a different order on a repeat gets
/// different ids: keep the order deterministic.
///
/// Take it as a handler parameter (`outbound: &Outbound<'_>`) or through
/// [`Context::outbound`](crate::Context::outbound).
#[derive(Debug)]
pub struct Outbound<'a> {
    transaction: Option<&'a DatabaseTransaction>,
    outbox: Option<&'a Outbox>,
    origin: Origin<'a>,
    /// The run's inbox claim, which each staging checks is still its transaction's.
    claim: Option<RunClaim<'a>>,
    /// The message whose trace what it stages continues, where the current span is not that
    /// message's (a slice's handler runs in its batch's span); the current span's otherwise.
    trace_of: Option<&'a Metadata>,
    next: AtomicU32,
    staged: AtomicU32,
}

/// Which message's run this is.
#[derive(Debug)]
enum Origin<'a> {
    Inbox(&'a InboxKey),
    /// A context made for a unit test: its message key, under no consumer.
    Key(&'a MessageKey),
}

impl<'a> Outbound<'a> {
    pub(crate) fn new(
        message_key: &'a MessageKey,
        transaction: Option<&'a DatabaseTransaction>,
    ) -> Self {
        Self {
            transaction,
            outbox: None,
            origin: Origin::Key(message_key),
            claim: None,
            trace_of: None,
            next: AtomicU32::new(0),
            staged: AtomicU32::new(0),
        }
    }

    pub(crate) fn with_origin(mut self, origin: &'a InboxKey, outbox: Option<&'a Outbox>) -> Self {
        self.origin = Origin::Inbox(origin);
        self.outbox = outbox;
        self
    }

    pub(crate) fn with_run_claim(mut self, claim: RunClaim<'a>) -> Self {
        self.claim = Some(claim);
        self
    }

    /// Stages in the trace the message of `metadata` carries rather than the current span's.
    pub(crate) fn in_trace_of(mut self, metadata: &'a Metadata) -> Self {
        self.trace_of = Some(metadata);
        self
    }

    /// Stages `message` in the handler's transaction: it is published after the commit, with
    /// the returned message id, or never if the transaction rolls back. Only a staging that
    /// was kept takes its place in the run's order: one that failed (refused inside a
    /// savepoint the handler rolled back, say) leaves its id to the next, as a replay derives
    /// them.
    ///
    /// # Errors
    ///
    /// The handler is not transactional ([`StagingError::NoTransaction`]: a two-phase handler
    /// has no transaction to stage in; pass [`Outbound::downstream_key`] to the service it
    /// calls instead), the inbox has no outbox ([`StagingError::NoOutbox`],
    /// [`InboxBuilder::outbox`](crate::InboxBuilder::outbox)), the message cannot be published
    /// as it is ([`StagingError::Invalid`]), the run's transaction was lost
    /// ([`StagingError::ClaimLost`]), or the database failed ([`StagingError::Database`]).
    pub async fn stage(&self, message: OutboxMessage) -> Result<String, StagingError> {
        let Some(tx) = self.transaction else {
            return Err(StagingError::NoTransaction);
        };
        let (Some(outbox), Origin::Inbox(key)) = (self.outbox, &self.origin) else {
            return Err(StagingError::NoOutbox);
        };
        // Relays in other processes are told once per run (one announcement wakes them for
        // all), and only when none runs here: the inbox wakes that one after the commit.
        let message = match self.trace_of {
            Some(metadata) => message.with_trace_of(metadata),
            None => message.with_current_trace(),
        };
        let announce = self.staged() == 0 && !outbox.has_local_relay();
        let position = self.next.fetch_add(1, Ordering::Relaxed);
        let id = self.id_at(position);
        let staged = outbox
            .stage_for_run(tx, &id, &message, announce, key, self.claim)
            .await;
        if let Err(error) = staged {
            // Given back, unless a later position was taken meanwhile (stagings at once, in
            // no order a replay could follow anyway).
            let _ = self.next.compare_exchange(
                position + 1,
                position,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            return Err(error);
        }
        self.staged.fetch_add(1, Ordering::Relaxed);
        Ok(id)
    }

    /// The next derived id, for a call to another service (its `Idempotency-Key`): a repeat of
    /// this run, after a takeover or a redelivery, passes the same keys in the same order.
    pub fn downstream_key(&self) -> String {
        let position = self.next.fetch_add(1, Ordering::Relaxed);
        self.id_at(position)
    }

    /// The id derived for `position`.
    fn id_at(&self, position: u32) -> String {
        match self.origin {
            Origin::Inbox(origin) => derived_id(origin, position),
            Origin::Key(key) => derived_id(
                &InboxKey {
                    consumer: ConsumerName::new("test").expect("a valid name"),
                    message_key: key.clone(),
                },
                position,
            ),
        }
    }

    /// How many messages this run staged.
    pub fn staged(&self) -> u32 {
        self.staged.load(Ordering::Relaxed)
    }
}

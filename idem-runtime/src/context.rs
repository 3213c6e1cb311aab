//! What a handler learns about the message it is processing ([`Context`]), and the watch on a
//! two-phase claim it shares with the runtime's renewal ([`ClaimWatch`]).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use sea_orm::DatabaseTransaction;
use tokio::sync::Notify;

use crate::entity::slot::MarkerSlot;
use crate::fingerprint::Fingerprint;
use crate::key::{InboxKey, MessageKey};
use crate::metadata::Metadata;
use crate::outbox::{Outbound, Outbox, OutboxMessage, RunClaim, StagingError};

/// What a handler learns about the message it is processing.
#[derive(Debug)]
pub struct Context<'a> {
    message_key: &'a MessageKey,
    metadata: &'a Metadata,
    transaction: Option<&'a DatabaseTransaction>,
    attempt: u32,
    previous_claim_at: Option<SystemTime>,
    /// The two-phase claim's renewal state; `None` in transactional mode and in unit tests.
    claim: Option<&'a ClaimWatch>,
    /// What the run stages and the keys it passes downstream.
    outbound: Outbound<'a>,
    /// The message's fingerprint, in entity mode.
    fingerprint: Option<Fingerprint>,
    /// Where [`Context::create`] leaves the marker it found, in entity mode.
    marker: Option<&'a MarkerSlot>,
}

impl<'a> Context<'a> {
    /// A context for running a handler without the inbox, as a unit test does: a first
    /// attempt, with the given transaction (transactional handlers) or none (two-phase).
    pub fn new(
        message_key: &'a MessageKey,
        metadata: &'a Metadata,
        transaction: Option<&'a DatabaseTransaction>,
    ) -> Self {
        Self {
            message_key,
            metadata,
            transaction,
            attempt: 1,
            previous_claim_at: None,
            claim: None,
            outbound: Outbound::new(message_key, transaction),
            fingerprint: None,
            marker: None,
        }
    }

    /// The same context for a run in entity mode: the message's `fingerprint`, and the `slot`
    /// where its marker's verdict goes.
    pub(crate) fn with_marker(
        mut self,
        fingerprint: Option<Fingerprint>,
        slot: &'a MarkerSlot,
    ) -> Self {
        self.fingerprint = fingerprint;
        self.marker = Some(slot);
        self
    }

    /// The message's fingerprint in entity mode ([`Mode::Entity`](crate::Mode::Entity)), to
    /// store with the marker entity for [`Marker::fingerprint`](crate::entity::Marker) to
    /// return; `None` in the other modes, or when the handler turns the check off.
    pub fn fingerprint(&self) -> Option<Fingerprint> {
        self.fingerprint
    }

    pub(crate) fn marker_slot(&self) -> Option<&'a MarkerSlot> {
        self.marker
    }

    /// The same context for a run of the inbox's `origin`, staging in `outbox`: the inbox makes
    /// its handlers' contexts so, and a unit test of a handler that stages may too.
    pub fn with_origin(mut self, origin: &'a InboxKey, outbox: Option<&'a Outbox>) -> Self {
        self.outbound = self.outbound.with_origin(origin, outbox);
        self
    }

    /// The same context for a run whose transaction holds `claim`, which its stagings check.
    pub(crate) fn with_run_claim(mut self, claim: RunClaim<'a>) -> Self {
        self.outbound = self.outbound.with_run_claim(claim);
        self
    }

    /// The same context staging in its message's own trace rather than the current span's: a
    /// slice handler's, which runs once for many messages in the batch's span.
    pub(crate) fn staging_in_message_trace(mut self) -> Self {
        self.outbound = self.outbound.in_trace_of(self.metadata);
        self
    }

    /// Where the run stages outgoing messages and gets keys for downstream calls.
    pub fn outbound(&self) -> &Outbound<'a> {
        &self.outbound
    }

    /// Stages `message` in the handler's transaction ([`Outbound::stage`]): published after the
    /// commit with the returned message id, derived from this message, or never.
    ///
    /// # Errors
    ///
    /// See [`Outbound::stage`].
    pub async fn stage(&self, message: OutboxMessage) -> Result<String, StagingError> {
        self.outbound.stage(message).await
    }

    /// The next key for a call to another service ([`Outbound::downstream_key`]), derived from
    /// this message: a repeat of the run passes the same keys.
    pub fn downstream_key(&self) -> String {
        self.outbound.downstream_key()
    }

    /// The same context watching a two-phase claim that the runtime renews.
    pub(crate) fn with_claim(mut self, claim: &'a ClaimWatch) -> Self {
        self.claim = Some(claim);
        self
    }

    /// The same context as the `attempt`-th claim, after a takeover of a claim that started at
    /// `previous_claim_at`: to test a handler's reconciliation path.
    pub fn with_attempt(mut self, attempt: u32, previous_claim_at: Option<SystemTime>) -> Self {
        self.attempt = attempt;
        self.previous_claim_at = previous_claim_at;
        self
    }

    /// The message's key: pass it downstream as that service's idempotency key.
    pub fn message_key(&self) -> &'a MessageKey {
        self.message_key
    }

    /// What the transport knows about the delivery.
    pub fn metadata(&self) -> &'a Metadata {
        self.metadata
    }

    /// The transaction the handler writes its effects through (transactional, entity and
    /// natural modes); `None` in two-phase mode.
    pub fn transaction(&self) -> Option<&'a DatabaseTransaction> {
        self.transaction
    }

    /// Which attempt this is: 1 for a first claim, more after taking over an expired claim
    /// (two-phase mode), when an earlier attempt may have done part of the work. A takeover
    /// that fails hands its claim on: the next copy's attempt follows it, so that a chain of
    /// crashes and failures ends in [`Error::NeedsIntervention`](crate::Error::NeedsIntervention) after the
    /// inbox's `max_attempts`; a first attempt that fails releases its claim.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// When the claim that was taken over had started, on a takeover.
    pub fn previous_claim_at(&self) -> Option<SystemTime> {
        self.previous_claim_at
    }

    /// Whether an earlier attempt may have done part of the work: reconcile with the downstream
    /// system (look the key up there) before repeating an external call.
    pub fn is_takeover(&self) -> bool {
        self.attempt > 1
    }

    /// Whether this worker lost its two-phase claim: another worker took the message over, or
    /// the lease could not be renewed (the database unreachable) before it ran out. A cheap
    /// check (one atomic load): call it before each external call, and stop if it says `true`,
    /// since another worker may be processing the message.
    ///
    /// The runtime renews the lease while the handler runs, so a live worker keeps its claim
    /// however long the handler takes; only a worker that cannot reach the database loses it.
    /// Whatever the handler does after a loss, its completion stays fenced: the record is not
    /// completed by a worker that lost the claim. Always `false` in transactional mode (the
    /// transaction holds the key) and for a context made with [`Context::new`].
    pub fn claim_lost(&self) -> bool {
        self.claim.is_some_and(ClaimWatch::is_lost)
    }

    /// Resolves when this worker loses its two-phase claim (see [`Context::claim_lost`]); never
    /// resolves while the claim is held, in transactional mode, or for a context made with
    /// [`Context::new`]. Race it against a long external call to abandon the call on a loss:
    ///
    /// ```
    /// # async fn call_downstream() {}
    /// # async fn demo(cx: &idem_runtime::Context<'_>) {
    /// tokio::select! {
    ///     () = call_downstream() => {}
    ///     () = cx.lost() => return, // another worker may have the message now
    /// }
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future only stops waiting.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'a {
        let claim = self.claim;
        async move {
            match claim {
                Some(claim) => claim.lost().await,
                None => std::future::pending().await,
            }
        }
    }
}

/// Whether a two-phase claim was lost, shared between the renewal and the handler's context.
#[derive(Debug, Default)]
pub(crate) struct ClaimWatch {
    lost: AtomicBool,
    notify: Notify,
}

impl ClaimWatch {
    /// Whether the claim was lost: taken over, or not renewed before its lease ran out.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Resolves once the claim is lost.
    pub(crate) async fn lost(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before the flag is read: a loss between the read and the wait still
            // wakes this waiter.
            notified.as_mut().enable();
            if self.is_lost() {
                return;
            }
            notified.await;
        }
    }

    /// Marks the claim lost, waking every waiter.
    pub(crate) fn set_lost(&self) {
        self.lost.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }
}

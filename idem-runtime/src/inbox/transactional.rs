//! One message in transactional mode: its claim, its handler's writes and its completion in
//! one transaction; and the dispatch of a message to its mode's room.

use sea_orm::DatabaseTransaction;
use tracing::Instrument;

use super::claim::{self, ClaimRequest, Claimed, Deadlocks};
use super::handling::{
    abandon, decode_stored, fingerprint_of, outage_or_handler_error, roll_back_quietly, run_handler,
};
use super::inner::Inner;
use super::record::InboxRecord;
use crate::clock::from_epoch_ms;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::handler::{Handler, Mode, Outcome};
use crate::key::{ConsumerName, InboxKey, KeyError, MessageKey};
use crate::metadata::Metadata;
use crate::observe;
use crate::outbox::RunClaim;
use crate::retention::policy::check_covers;
use crate::store::dialect::{Failure, classify, refuses_value};

impl Inner {
    /// [`Inbox::process`] with the key [`Handler::key`] gave for this message, for a caller that
    /// needs the key itself (a transport puts it in its logs and dead-letter headers) and should
    /// not compute it twice.
    pub(crate) async fn process_with_key<H: Handler>(
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
            max_attempts: self.max_attempts,
            claim_wait: self.claim_wait,
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
        let store = &self.store;
        let mut deadlocks = Deadlocks::default();
        let (tx, token, attempt, previous_claim_at) = loop {
            let tx = store.dialect().begin(&self.db).await?;
            match claim::claim(store, &tx, request).await {
                Ok(Claimed::Completed { output, age }) => {
                    tx.commit().await?;
                    let duplicate = decode_stored(request.key, output)?;
                    (self.telemetry).duplicate(request.key.consumer.as_str(), age);
                    return Ok(Outcome::Duplicate(duplicate));
                }
                Ok(Claimed::Acquired {
                    token,
                    attempt,
                    previous_claim_at,
                    before,
                }) => {
                    (self.telemetry).claimed(request.key, before, request.retention);
                    break (tx, token, attempt, previous_claim_at);
                }
                Err(Error::Contention(error)) if deadlocks.try_again(&error) => {
                    roll_back_quietly(tx).await;
                }
                Err(error) => return Err(abandon(tx, error).await),
            }
        };
        let claim = RunClaim {
            statements: self.run_statements.as_ref(),
            token,
        };
        let cx = Context::new(&request.key.message_key, metadata, Some(&tx))
            .with_attempt(attempt, previous_claim_at.map(from_epoch_ms))
            .with_origin(request.key, self.outbox.as_ref())
            .with_run_claim(claim);
        let output = match self
            .run_claimed(handler, &request, token, &cx, &tx, message)
            .await
        {
            Ok(output) => output,
            Err(error) => return Err(abandon(tx, error).await),
        };
        self.commit(cx.outbound().staged(), tx).await?;
        Ok(Outcome::Processed(output))
    }

    /// What a claimed message's transaction runs before its commit: the handler, then the
    /// completion of its claim with the handler's output.
    async fn run_claimed<H: Handler>(
        &self,
        handler: &H,
        request: &ClaimRequest<'_>,
        token: i64,
        cx: &Context<'_>,
        tx: &DatabaseTransaction,
        message: H::Message,
    ) -> Result<H::Output> {
        let store = &self.store;
        let output = match run_handler(handler, cx, message).await {
            Ok(output) => output,
            Err(error) => return Err(outage_or_handler_error(error, tx).await),
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
            .complete(tx, key, token, stored, request.retention)
            .await
        {
            Ok(true) => Ok(output),
            Ok(false) => Err(Error::TransactionAborted { key: key.clone() }),
            Err(error) => Err(match classify(&error) {
                Failure::Aborted => Error::TransactionAborted { key: key.clone() },
                Failure::Refused if stored.is_some() && refuses_value(&error) => {
                    Error::OutputNotStorable(Box::new(error))
                }
                _ => error.into(),
            }),
        }
    }

    /// Checks a handler against this inbox's configuration before it processes anything: its
    /// consumer name, and its retention against the redelivery window if one was given. Its
    /// consumer's `idem_late_duplicates_total` is registered at zero then.
    pub(crate) fn check_handler<H: Handler>(&self, handler: &H) -> Result<(), Error> {
        let consumer = ConsumerName::new(handler.consumer()).map_err(Error::InvalidConsumer)?;
        if matches!(handler.mode(), Mode::Entity | Mode::Natural) {
            // No record to keep, no retention to cover the window.
            return Ok(());
        }
        // Its counter of late duplicates is scraped at zero from its start.
        self.telemetry.known(consumer.as_str());
        let (retention, _) = self.settings_for(&consumer, handler)?;
        if let Some(window) = &self.window {
            check_covers(consumer.as_str(), retention, window.duration())?;
        }
        Ok(())
    }

    /// Reads the record of `key` as committed, if any, without waiting for a claim still in
    /// its transaction (for operators and tests).
    pub(crate) async fn lookup(&self, key: &InboxKey) -> Result<Option<InboxRecord>> {
        let Some(row) = self.store.peek(&self.db, key).await? else {
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
}

//! Two-phase processing: the message claimed with a lease, its handler run outside any
//! transaction while the lease is renewed beside it, and the record completed only while the
//! claim is still this worker's.

use std::time::Duration;

use sea_orm::DbErr;
use serde::Serialize;

use super::claim::{self, ClaimRequest, Claimed};
use super::completion;
use super::handling::{decode_stored, run_beside_renewal, run_handler};
use super::inner::Inner;
use super::renewal::{Held, Unconfirmed, confirm_held, renew_until_lost};
use crate::clock::from_epoch_ms;
use crate::context::{ClaimWatch, Context};
use crate::error::{BoxError, Error, Result};
use crate::handler::{Handler, Mode, Outcome};
use crate::key::{InboxKey, MessageKey};
use crate::metadata::Metadata;
use crate::store::dialect::{Failure, classify};

impl Inner {
    /// Claim with a lease, handler outside any transaction, completion fenced by the claim token.
    pub(super) async fn two_phase<H: Handler>(
        &self,
        handler: &H,
        request: ClaimRequest<'_>,
        message: H::Message,
        metadata: &Metadata,
    ) -> Result<Outcome<H::Output>> {
        let store = &self.store;
        let db = &self.db;
        let claim_sent = tokio::time::Instant::now();
        let (token, attempt, previous_claim_at) = match claim::claim(store, db, request).await? {
            Claimed::Completed { output, age } => {
                let duplicate = decode_stored(request.key, output)?;
                (self.telemetry).duplicate(request.key.consumer.as_str(), age);
                return Ok(Outcome::Duplicate(duplicate));
            }
            Claimed::Acquired {
                token,
                attempt,
                previous_claim_at,
                before,
            } => {
                (self.telemetry).claimed(request.key, before, request.retention);
                (token, attempt, previous_claim_at)
            }
        };
        let lease = request.lease.unwrap_or(Mode::DEFAULT_LEASE);
        let claim_sent = (self.confirm(request, token, attempt, lease, claim_sent)).await?;
        let watch = ClaimWatch::default();
        let cx = Context::new(&request.key.message_key, metadata, None)
            .with_attempt(attempt, previous_claim_at.map(from_epoch_ms))
            .with_origin(request.key, None)
            .with_claim(&watch);
        let held = Held {
            request,
            token,
            lease,
            claim_sent,
        };
        // The renewal runs beside the handler and its completion, in this task: dropping this
        // future (a crashed worker) stops them all. A lost claim ends the renewal; the handler
        // still runs to its end.
        let mut renewal = Some(Box::pin(renew_until_lost(store, db, held, &watch)));
        let output =
            match run_beside_renewal(run_handler(handler, &cx, message), &mut renewal).await {
                Ok(output) => output,
                Err(error) => {
                    // A renewal under way would hold its pooled connection, and could extend the
                    // lease after it is ended.
                    drop(renewal);
                    self.give_up(request.key, token, attempt).await;
                    return Err(error);
                }
            };
        // The side effect has happened: an output that cannot be stored (it does not serialize,
        // or the database refuses it) still completes the record, without it, so that no
        // redelivery repeats the effect.
        let json = self.storable(&request.key.message_key, &output);
        let stored = json.as_deref().ok().filter(|json| *json != "null");
        let completing = self.complete_storing(held, stored, &watch);
        let completed = run_beside_renewal(completing, &mut renewal).await?;
        match completed {
            None => Err(Error::ClaimLost {
                key: request.key.clone(),
            }),
            Some(Some(refused)) => Err(Error::OutputNotStorable(Box::new(refused))),
            Some(None) => {
                json.map_err(Error::OutputNotStorable)?;
                Ok(Outcome::Processed(output))
            }
        }
    }

    /// The instant the claim's lease counts from, once confirmed (`confirm_held`); a claim not
    /// confirmed is given up, its handler not run, and the delivery requeued without counting.
    async fn confirm(
        &self,
        request: ClaimRequest<'_>,
        token: i64,
        attempt: u32,
        lease: Duration,
        claim_sent: tokio::time::Instant,
    ) -> Result<tokio::time::Instant> {
        let (store, db) = (&self.store, &self.db);
        let renew = || store.renew(db, request.key, token, lease, request.retention);
        let unconfirmed = match confirm_held(renew, lease, claim_sent).await {
            Ok(claim_sent) => return Ok(claim_sent),
            Err(unconfirmed) => unconfirmed,
        };
        self.give_up(request.key, token, attempt).await;
        let elsewhere = |remaining| Error::InProgressElsewhere {
            key: request.key.clone(),
            remaining,
        };
        Err(match unconfirmed {
            Unconfirmed::TakenOver => elsewhere(lease),
            Unconfirmed::TimedOut => elsewhere(Duration::ZERO),
            Unconfirmed::Failed(error) => Error::from(error),
        })
    }

    /// Gives up the claim of a handler that failed: never hold a key after a failed handler,
    /// the redelivery must be able to retry. A first attempt's claim is deleted; a takeover's
    /// is handed on, its lease ended, so that the next claim knows it follows attempts whose
    /// side effects may have happened (`Context::is_takeover`), and they count toward
    /// `max_attempts`.
    async fn give_up(&self, key: &InboxKey, token: i64, attempt: u32) {
        let (store, db) = (&self.store, &self.db);
        let released = if attempt > 1 {
            store.hand_on(db, key, token).await
        } else {
            store.release(db, key, token).await
        };
        if let Err(release) = released {
            tracing::warn!(error = %release, "could not release the claim; it expires with its lease");
        }
    }

    /// The output's JSON as the record would store it, or why it cannot be stored.
    fn storable<T: Serialize>(&self, key: &MessageKey, output: &T) -> Result<String, BoxError> {
        let json = serde_json::to_string(output)?;
        self.store.check_output(key, &json)?;
        Ok(json)
    }

    /// Completes the held claim with `stored` while it is still held; an output the database
    /// refuses completes the record without it. `None` when the claim was lost; otherwise the
    /// refusal, if the output was left out.
    async fn complete_storing(
        &self,
        held: Held<'_>,
        stored: Option<&str>,
        watch: &ClaimWatch,
    ) -> Result<Option<Option<DbErr>>, DbErr> {
        let (store, db) = (&self.store, &self.db);
        let claim = (held.request, held.token);
        let complete =
            |output| completion::complete_while_held(store, db, claim, output, watch, held.lease);
        match complete(stored).await {
            Ok(completed) => Ok(completed.then_some(None)),
            Err(error) if stored.is_some() && classify(&error) == Failure::Refused => {
                Ok(complete(None).await?.then_some(Some(error)))
            }
            Err(error) => Err(error),
        }
    }
}

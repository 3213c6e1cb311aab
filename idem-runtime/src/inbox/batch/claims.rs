//! The start of a try at a batch's transaction: every key claimed in one statement, and the
//! known ones read in another.

use std::collections::HashSet;

use sea_orm::{DatabaseTransaction, DbErr};

use super::attempt::Batch;
use super::fates::{Fate, Lead, known_fate};
use super::lost::Lost;
use crate::handler::Handler;
use crate::inbox::claim::{Deadlocks, new_token};
use crate::inbox::inner::Inner;
use crate::key::MessageKey;
use crate::store::dialect::{Failure, classify, refuses_value};
use crate::store::{BatchClaim, Batches, Claims, Store};
use crate::telemetry::Before;

/// A try's transaction, its keys claimed.
pub(super) struct Claimed {
    pub(super) tx: DatabaseTransaction,
    /// The token every claim of this try carries.
    pub(super) token: i64,
    /// The batch's transaction as the database identifies it (PostgreSQL, when a key was
    /// fresh): its handlers must leave it open, and its completion runs only in it.
    pub(super) transaction_id: Option<i64>,
}

impl Inner {
    /// Begins a try's transaction and claims every first copy's key in it (the fresh ones are
    /// marked so), reads the records of the known ones, and ends the claims' bounded lock
    /// wait. `None` when every message goes
    /// the per-message way instead: a key held by a long transaction elsewhere, or a claim's
    /// value the table refuses (a constraint of its operators), so that only that key waits,
    /// or fails.
    pub(super) async fn claim_batch<H: Handler>(
        &self,
        batch: &Batch<'_, H>,
        leads: &mut [Lead<H::Message, H::Output>],
    ) -> Result<Option<Claimed>, Lost> {
        let store = &self.store;
        let token = new_token();
        let claims: Vec<BatchClaim<'_>> = leads
            .iter()
            .filter(|lead| !lead.failed_alone)
            .map(|lead| BatchClaim {
                key: &lead.key.message_key,
                fingerprint: lead.fingerprint.as_ref(),
            })
            .collect();
        // Batches sharing keys claim them in one order; a deadlock can still come from
        // elsewhere, and is tried again as the per-message path does.
        let mut deadlocks = Deadlocks::default();
        let (tx, taken) = loop {
            let tx = store
                .dialect()
                .begin(&self.db)
                .await
                .map_err(Lost::Database)?;
            match claim_all(store, &tx, batch, &claims, token).await {
                Ok(taken) => break (tx, taken),
                Err(error) if deadlocks.try_again(&error) => {}
                Err(error) if classify(&error) == Failure::LockTimeout || refuses_value(&error) => {
                    for lead in leads.iter_mut().filter(|lead| !lead.failed_alone) {
                        lead.fate = Fate::Deferred;
                    }
                    return Ok(None);
                }
                Err(error) => return Err(Lost::Database(error)),
            }
        };
        drop(claims);
        for lead in leads.iter_mut().filter(|lead| !lead.failed_alone) {
            lead.claimed = taken.fresh.contains(lead.key.message_key.as_str());
            lead.fate = if lead.claimed {
                (self.telemetry).claimed(&lead.key, Before::Nothing, batch.retention);
                Fate::Fresh
            } else {
                Fate::Deferred
            };
        }
        if taken.fresh.len() < leads.len() {
            read_known(store, &tx, batch, leads)
                .await
                .map_err(Lost::Database)?;
        }
        // The handlers' statements wait for locks as long as the application configured, not
        // as long as a claim does (nothing runs when nothing is fresh).
        if !taken.fresh.is_empty() && taken.waits_bounded {
            store.end_claim_wait(&tx).await.map_err(Lost::Database)?;
        }
        Ok(Some(Claimed {
            tx,
            token,
            transaction_id: taken.transaction_id,
        }))
    }
}

/// Claims every key of `claims` in one statement.
async fn claim_all<H: Handler>(
    store: &Store,
    tx: &DatabaseTransaction,
    batch: &Batch<'_, H>,
    claims: &[BatchClaim<'_>],
    token: i64,
) -> Result<Claims, DbErr> {
    if claims.is_empty() {
        return Ok(Claims {
            fresh: HashSet::new(),
            transaction_id: None,
            waits_bounded: false,
        });
    }
    Batches::of(store)
        .insert_claims(tx, batch.consumer, claims, token, batch.retention)
        .await
}

/// Reads the records of the keys that were not fresh, in one statement: a completed,
/// unexpired record answers as a duplicate; anything else is left for the per-message path.
async fn read_known<H: Handler>(
    store: &Store,
    tx: &DatabaseTransaction,
    batch: &Batch<'_, H>,
    leads: &mut [Lead<H::Message, H::Output>],
) -> Result<(), DbErr> {
    let known: Vec<&MessageKey> = leads
        .iter()
        .filter(|lead| matches!(lead.fate, Fate::Deferred) && !lead.failed_alone)
        .map(|lead| &lead.key.message_key)
        .collect();
    if known.is_empty() {
        return Ok(());
    }
    let mut rows = Batches::of(store)
        .find_many(tx, batch.consumer, &known)
        .await?;
    for lead in leads.iter_mut() {
        if !matches!(lead.fate, Fate::Deferred) || lead.failed_alone {
            continue;
        }
        if let Some(row) = rows.remove(lead.key.message_key.as_str()) {
            lead.fate = known_fate(lead, row);
        }
    }
    Ok(())
}

//! The end of a try at a batch's transaction: the failed messages' claims released, the
//! processed ones completed with their outputs in one statement, one commit.

use sea_orm::DatabaseTransaction;

use super::attempt::{Batch, Finishing, Tried};
use super::claims::Claimed;
use super::fates::{Fate, Lead};
use super::lost::{self, Lost};
use crate::error::Error;
use crate::handler::Handler;
use crate::inbox::inner::Inner;
use crate::key::MessageKey;
use crate::store::Batches;
use crate::store::dialect::{Failure, classify, refuses_value};

impl Inner {
    /// Releases the claims of the messages that failed, completes the processed ones and
    /// commits. A transaction found lost under a handler (fewer claims completed than taken,
    /// or aborted) is lost, or, for trusted handlers, run again checked, which tells whose
    /// doing it was. An output the database refuses fails its message alone: the try is rolled
    /// back and the others run again.
    pub(super) async fn finish<H: Handler>(
        &self,
        claimed: Claimed,
        batch: &Batch<'_, H>,
        leads: &mut [Lead<H::Message, H::Output>],
        finishing: Finishing,
    ) -> Result<Tried, Lost> {
        let Claimed {
            tx,
            token,
            transaction_id,
        } = claimed;
        let store = &self.store;
        let released: Vec<&MessageKey> = leads
            .iter()
            .filter(|lead| lead.claim_to_release())
            .map(|lead| &lead.key.message_key)
            .collect();
        if !released.is_empty()
            && let Err(error) = Batches::of(store)
                .release_many(&tx, batch.consumer, token, &released)
                .await
        {
            return Err(lost::abandon(tx, Lost::Database(error)).await);
        }
        let completing = Completing {
            token,
            transaction_id,
            under_savepoints: finishing.under_savepoints,
        };
        let completion = match self.complete_all(&tx, batch, leads, completing).await {
            Ok(completion) => completion,
            Err(lost) => return Err(lost::abandon(tx, lost).await),
        };
        match completion {
            Completion::All => {}
            // Fewer claims completed than this transaction took: the database rolled it back
            // under a handler, or a handler ended it or swallowed a failed statement. Trusted,
            // which handler only a checked try tells; checked, that handler was found, and the
            // batch is lost.
            Completion::Lost if finishing.trusted => {
                tracing::warn!(
                    consumer = batch.consumer.as_str(),
                    "a batch's transaction was found aborted or lost before its commit: one of its \
                     handlers swallowed a failed statement or ended the transaction. The batch \
                     runs again checked, which finds it. Where a failed statement leaves the \
                     transaction going (MySQL/MariaDB, SQLite), what the handlers wrote after it \
                     ended committed on its own: give such handlers BatchChecks::EachMessage"
                );
                lost::roll_back(tx).await?;
                return Ok(Tried::Broken);
            }
            Completion::Lost => return Err(lost::abandon(tx, Lost::RolledBack).await),
            // The refused outputs' messages failed alone, or are to be found by a try under
            // savepoints; the others run again without them.
            Completion::Refused => {
                lost::roll_back(tx).await?;
                return Ok(Tried::Again);
            }
        }
        if let Err(error) = tx.commit().await {
            if classify(&error) != Failure::Refused {
                return Err(Lost::Database(error));
            }
            // A constraint checked at the commit refused what a handler wrote; nothing is
            // committed, and only each message's own commit tells whose write it was.
            for lead in leads.iter_mut().filter(|lead| lead.is_processed()) {
                lead.fate = Fate::Deferred;
            }
            return Ok(Tried::Ended);
        }
        let staged = leads
            .iter()
            .filter(|lead| lead.is_processed())
            .map(|lead| lead.staged)
            .sum();
        self.staged(staged);
        Ok(Tried::Ended)
    }

    /// Records the outputs of the messages processed here in one statement, in the batch's
    /// transaction only where its id is known. A statement the database refuses (an output
    /// too large for it, against a constraint) is tried message by message to find which;
    /// where a refused statement aborts the transaction (PostgreSQL), the search needs the
    /// statement under a savepoint, taken in a try under savepoints only (another try runs
    /// again so); elsewhere the database undoes the refused statement alone.
    async fn complete_all<H: Handler>(
        &self,
        tx: &DatabaseTransaction,
        batch: &Batch<'_, H>,
        leads: &mut [Lead<H::Message, H::Output>],
        completing: Completing,
    ) -> Result<Completion, Lost> {
        let Completing {
            token,
            transaction_id,
            under_savepoints,
        } = completing;
        let store = &self.store;
        let outputs: Vec<(&MessageKey, Option<&str>)> = leads
            .iter()
            .filter_map(|lead| match &lead.fate {
                Fate::Processed(_, json) => Some((&lead.key.message_key, json.as_deref())),
                _ => None,
            })
            .collect();
        if outputs.is_empty() {
            return Ok(Completion::All);
        }
        let expected = outputs.len() as u64;
        let aborts = store.dialect().aborts_on_error();
        let searchable = !aborts || under_savepoints;
        if aborts && under_savepoints {
            lost::execute(tx, "SAVEPOINT idem_complete").await?;
        }
        let completed = Batches::of(store)
            .complete_many(
                tx,
                batch.consumer,
                token,
                &outputs,
                batch.retention,
                transaction_id,
            )
            .await;
        drop(outputs);
        match completed {
            // Each claim is this batch's, in progress, in this transaction: fewer completed
            // means the database rolled the transaction back under a handler, or a handler
            // ended it.
            Ok(completed) if completed == expected => Ok(Completion::All),
            Ok(_) => Ok(Completion::Lost),
            // A failed statement a handler swallowed aborted the transaction (PostgreSQL).
            Err(error) if classify(&error) == Failure::Aborted => Ok(Completion::Lost),
            Err(error) if refuses_value(&error) && searchable => {
                if aborts {
                    lost::execute(tx, "ROLLBACK TO SAVEPOINT idem_complete").await?;
                }
                if self.find_refused_outputs(tx, leads, token, batch).await? {
                    Ok(Completion::Refused)
                } else {
                    // No output of its own is refused: the statement as a whole was (its size,
                    // say). Each message goes the per-message way, which tells.
                    Err(Lost::Database(error))
                }
            }
            Err(error) if refuses_value(&error) => Ok(Completion::Refused),
            Err(error) => Err(Lost::Database(error)),
        }
    }

    /// Completes each processed message on its own, each under a savepoint rolled back at once,
    /// and fails the ones whose output the database refuses; the next try leaves them out.
    /// Returns whether it found one.
    async fn find_refused_outputs<H: Handler>(
        &self,
        tx: &DatabaseTransaction,
        leads: &mut [Lead<H::Message, H::Output>],
        token: i64,
        batch: &Batch<'_, H>,
    ) -> Result<bool, Lost> {
        let mut found = false;
        for lead in leads.iter_mut() {
            let Fate::Processed(_, json) = &lead.fate else {
                continue;
            };
            lost::execute(tx, "SAVEPOINT idem_probe").await?;
            let tried = self
                .store
                .complete(tx, &lead.key, token, json.as_deref(), batch.retention)
                .await;
            lost::execute(tx, "ROLLBACK TO SAVEPOINT idem_probe").await?;
            // An unreachable database fails the next savepoint statement.
            if let Err(error) = tried
                && refuses_value(&error)
            {
                lead.fail_alone(Error::OutputNotStorable(Box::new(error)));
                found = true;
            }
        }
        Ok(found)
    }
}

/// What completing a try's processed messages needs.
#[derive(Debug, Clone, Copy)]
struct Completing {
    token: i64,
    transaction_id: Option<i64>,
    under_savepoints: bool,
}

/// What completing a try's processed messages found.
enum Completion {
    /// Every one completed.
    All,
    /// Fewer than its claims: the transaction was lost under a handler.
    Lost,
    /// The database refused some outputs; their messages failed.
    Refused,
}

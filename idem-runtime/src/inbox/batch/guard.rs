//! How a batch's handlers share its transaction: each under a savepoint of its own
//! ([`Savepoints`]), or none, the transaction checked after each handler or once before the
//! commit ([`Unguarded`]). Both run a fresh message's handler the same way ([`handle`]).

use std::future::Future;

use sea_orm::DatabaseTransaction;
use tracing::Instrument;

use super::fates::{Handled, Lead};
use super::lost::{self, Lost};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::handler::Handler;
use crate::inbox::handling::{outage_or_handler_error, run_handler};
use crate::key::InboxKey;
use crate::metadata::Metadata;
use crate::outbox::{Outbox, RunClaim};
use crate::store::Store;
use crate::store::dialect::{Failure, classify};

/// What running a batch's handlers needs: the handler, the batch's transaction, and where its
/// handlers stage.
pub(super) struct Run<'a, H> {
    pub(super) handler: &'a H,
    pub(super) tx: &'a DatabaseTransaction,
    pub(super) store: &'a Store,
    pub(super) metadata: &'a [Metadata],
    pub(super) staging: Staging<'a>,
}

/// Where a batch's handlers stage: the outbox, under the batch's claims.
#[derive(Debug, Clone, Copy)]
pub(super) struct Staging<'a> {
    pub(super) outbox: Option<&'a Outbox>,
    pub(super) claim: RunClaim<'a>,
}

/// What a guard says after a handler, or after the last one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Go on.
    Next,
    /// Nothing of this try can be kept apart from a handler's failure: roll it back and run
    /// the batch again under savepoints.
    Again,
}

/// How a batch's handlers are kept apart in the transaction they share.
pub(super) trait Guard: Send {
    /// Runs the handler of the fresh message `leads[at]` and sets its fate. An error means the
    /// transaction is lost.
    fn run<H: Handler>(
        &mut self,
        run: &Run<'_, H>,
        leads: &mut [Lead<H::Message, H::Output>],
        at: usize,
    ) -> impl Future<Output = Result<Step, Lost>> + Send
    where
        H::Message: Clone;

    /// After the last handler: whether the transaction is whole, to complete the processed
    /// messages and commit.
    fn close<M: Send, T: Send>(
        &mut self,
        leads: &mut [Lead<M, T>],
    ) -> impl Future<Output = Result<Step, Lost>> + Send;
}

/// Runs a fresh message's handler on a copy of its message in the batch's transaction: what it
/// gave, or why it failed. A failure that says the database is unreachable is the batch's
/// outage when the batch's own transaction no longer reaches it (`Err`); otherwise it is the
/// handler's own (another database it uses), and that message fails alone, as it would on its
/// own.
pub(super) async fn handle<H: Handler>(
    run: &Run<'_, H>,
    key: &InboxKey,
    index: usize,
    message: H::Message,
) -> Result<Result<Handled<H::Output>>, Lost> {
    let cx = Context::new(&key.message_key, &run.metadata[index], Some(run.tx))
        .with_origin(key, run.staging.outbox)
        .with_run_claim(run.staging.claim);
    // In the message's own trace: what the handler publishes or stages goes on in it.
    let span = tracing::info_span!("idem.batch_message", key = key.message_key.as_str());
    #[cfg(feature = "otel")]
    crate::trace_context::continue_message_trace(&span, &run.metadata[index]);
    let ran = run_handler(run.handler, &cx, message)
        .instrument(span)
        .await;
    let failure = match ran {
        Ok(output) => {
            let stored = match serde_json::to_string(&output) {
                Ok(json) if json == "null" => None,
                Ok(json) => Some(json),
                Err(error) => return Ok(Err(Error::OutputNotStorable(Box::new(error)))),
            };
            if let Some(json) = &stored
                && let Err(error) = run.store.check_output(&key.message_key, json)
            {
                return Ok(Err(Error::OutputNotStorable(Box::new(error))));
            }
            return Ok(Ok(Handled {
                output,
                stored,
                staged: cx.outbound().staged(),
            }));
        }
        Err(error) => outage_or_handler_error(error, run.tx).await,
    };
    if failure.is_store_unavailable() {
        lost::still_reached(run.tx).await?;
    }
    Ok(Err(failure))
}

/// One savepoint per message: a failing message is rolled back alone. A message's savepoint is
/// released in the same round trip as the next one is taken: releasing fails when the handler
/// broke it (PostgreSQL aborted it after a failed statement, or the database rolled the whole
/// transaction back), and that message is then failed and rolled back to it.
pub(super) struct Savepoints<'a> {
    tx: &'a DatabaseTransaction,
    /// The lead whose handler succeeded under the savepoint still open.
    open: Option<usize>,
}

impl<'a> Savepoints<'a> {
    pub(super) fn new(tx: &'a DatabaseTransaction) -> Self {
        Self { tx, open: None }
    }

    /// Takes the next message's savepoint, releasing the open one.
    async fn take<M, T>(&mut self, leads: &mut [Lead<M, T>]) -> Result<(), Lost> {
        if let Some(open) = self.open.take() {
            let both = "RELEASE SAVEPOINT idem_message; SAVEPOINT idem_message";
            match lost::execute(self.tx, both).await {
                Err(Lost::RolledBack) => self.broken(&mut leads[open]).await?,
                done => return done,
            }
        }
        lost::execute(self.tx, "SAVEPOINT idem_message").await
    }

    /// Fails a message whose handler broke its savepoint, and rolls its work back.
    async fn broken<M, T>(&self, lead: &mut Lead<M, T>) -> Result<(), Lost> {
        lead.failed(Error::TransactionAborted {
            key: lead.key.clone(),
        });
        roll_back_to_savepoint(self.tx).await
    }
}

impl Guard for Savepoints<'_> {
    async fn run<H: Handler>(
        &mut self,
        run: &Run<'_, H>,
        leads: &mut [Lead<H::Message, H::Output>],
        at: usize,
    ) -> Result<Step, Lost>
    where
        H::Message: Clone,
    {
        self.take(leads).await?;
        let lead = &mut leads[at];
        let message = lead.message_copy();
        match handle(run, &lead.key, lead.index, message).await? {
            Ok(handled) => {
                lead.processed(handled);
                self.open = Some(at);
            }
            Err(failure) => {
                lead.failed(failure);
                roll_back_to_savepoint(self.tx).await?;
            }
        }
        Ok(Step::Next)
    }

    async fn close<M: Send, T: Send>(&mut self, leads: &mut [Lead<M, T>]) -> Result<Step, Lost> {
        if let Some(open) = self.open.take() {
            let release = "RELEASE SAVEPOINT idem_message";
            match lost::execute(self.tx, release).await {
                Err(Lost::RolledBack) => self.broken(&mut leads[open]).await?,
                released => released?,
            }
        }
        Ok(Step::Next)
    }
}

/// Rolls back to the message's savepoint, which the whole transaction may have gone with, and
/// releases it: no older savepoint of the same name is left for a later rollback to reach.
pub(super) async fn roll_back_to_savepoint(tx: &DatabaseTransaction) -> Result<(), Lost> {
    let sql = "ROLLBACK TO SAVEPOINT idem_message; RELEASE SAVEPOINT idem_message";
    lost::execute(tx, sql).await
}

/// No savepoint: the transaction checked after each handler ([`Unguarded::each`]), or once
/// before the commit for trusted handlers. A failing handler's error stands, but nothing of the
/// transaction can be kept apart from it: the try is rolled back and the others run again.
pub(super) struct Unguarded<'a> {
    store: &'a Store,
    tx: &'a DatabaseTransaction,
    /// The batch's transaction, which the handler must leave open, where the database tells it
    /// (PostgreSQL).
    transaction_id: Option<i64>,
    /// Whether the transaction is checked after each handler.
    check_each: bool,
    /// The batch's claim token, which its claims carry while its transaction holds them.
    token: i64,
}

/// What a check of the batch's transaction found.
enum Checked {
    /// Open and unbroken.
    Open,
    /// Aborted by a failed statement: the handler's own when the one before was checked.
    Aborted,
    /// Ended by a handler's own `COMMIT` or `ROLLBACK`.
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

impl<'a> Unguarded<'a> {
    /// Checked after each handler (`check_each`), or trusted; `transaction_id` is the batch's
    /// transaction where the database tells it.
    pub(super) fn new(
        store: &'a Store,
        tx: &'a DatabaseTransaction,
        transaction_id: Option<i64>,
        check_each: bool,
        token: i64,
    ) -> Self {
        Self {
            store,
            tx,
            transaction_id,
            check_each,
            token,
        }
    }

    /// Runs a fresh message's handler and says what became of it. An error means the
    /// transaction is lost: the database, or a handler that ended it.
    async fn run_one<H: Handler>(
        &self,
        run: &Run<'_, H>,
        lead: &mut Lead<H::Message, H::Output>,
    ) -> Result<Ran, Lost>
    where
        H::Message: Clone,
    {
        let message = lead.message_copy();
        let (failure, checked) = match handle(run, &lead.key, lead.index, message).await? {
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
        lead.failed(failure);
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
            Ok(row) => Ok(row.is_some_and(|row| row.claim_token == self.token)),
            // Not told: the checked try will.
            Err(error) => Lost::unless_unreachable(error).map(|_| false),
        }
    }

    /// Looks at the batch's transaction; open where the database cannot tell.
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

impl Guard for Unguarded<'_> {
    async fn run<H: Handler>(
        &mut self,
        run: &Run<'_, H>,
        leads: &mut [Lead<H::Message, H::Output>],
        at: usize,
    ) -> Result<Step, Lost>
    where
        H::Message: Clone,
    {
        let lead = &mut leads[at];
        match self.run_one(run, lead).await? {
            Ran::Processed => Ok(Step::Next),
            Ran::Failed => {
                // Its error stands; its claim goes with the transaction, and the next try
                // leaves it out.
                lead.set_aside();
                Ok(Step::Again)
            }
            Ran::Unsure => Ok(Step::Again),
        }
    }

    async fn close<M: Send, T: Send>(&mut self, _: &mut [Lead<M, T>]) -> Result<Step, Lost> {
        // Nothing to look at: the completion runs in the batch's transaction only, where its
        // id is known, and finds it aborted or ended (fewer claims completed), as it finds a
        // transaction rolled back elsewhere.
        Ok(Step::Next)
    }
}

//! A batch's transaction, tried until it commits or is lost: each try claims every key
//! (`claims.rs`), runs the fresh messages' handlers under a guard (`guard.rs`), and completes and
//! commits (`finish.rs`).

use std::time::Duration;

use super::fates::Lead;
use super::guard::{Guard, Run, Savepoints, Staging, Step, Unguarded};
use super::item::BatchChecks;
use super::lost::{self, Lost};
use crate::handler::Handler;
use crate::inbox::inner::Inner;
use crate::key::ConsumerName;
use crate::metadata::Metadata;
use crate::outbox::RunClaim;

/// What every try at one batch shares.
pub(super) struct Batch<'a, H> {
    pub(super) handler: &'a H,
    pub(super) consumer: &'a ConsumerName,
    pub(super) metadata: &'a [Metadata],
    pub(super) retention: Duration,
    pub(super) checks: BatchChecks,
}

/// How one try at a batch's transaction ended, short of losing it.
pub(super) enum Tried {
    /// Committed, or nothing to commit (every message left for the per-message path).
    Ended,
    /// A message failed in a way nothing else of the try could be kept apart from (a handler
    /// without a savepoint, an output the database refused): rolled back, to run the others
    /// again under savepoints. Its error stands.
    Again,
    /// The transaction was found aborted or lost under trusted handlers before the commit, and
    /// rolled back: a try under savepoints finds which handler did it.
    Broken,
}

/// How a try's handlers ran, for its end.
#[derive(Debug, Clone, Copy)]
pub(super) struct Finishing {
    /// Trusted: a transaction found lost runs again checked, which tells whose doing it was.
    pub(super) trusted: bool,
    /// Under savepoints: a refused output is searched for in this try, under a savepoint of
    /// its own; otherwise (on PostgreSQL, where a refusal aborts the transaction) the try runs
    /// again under savepoints, which finds it.
    pub(super) under_savepoints: bool,
}

/// How one try keeps its handlers apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keeping {
    /// A savepoint per message.
    Savepoints,
    /// None, the transaction checked after each handler.
    CheckEach,
    /// None, the transaction checked once before the commit ([`BatchChecks::BeforeCommit`]).
    Trusted,
}

impl Inner {
    /// Runs the batch's transaction to its end; each first copy's fate is set as it is
    /// decided; an error means nothing was committed.
    ///
    /// By default ([`BatchChecks::BeforeCommit`]) the handlers first run without savepoints or
    /// checks, the transaction checked once before the commit: when one fails, its error
    /// stands, but nothing can be kept apart from it, so the transaction is rolled back and the
    /// others run again with a savepoint per message. Checked after each handler
    /// ([`BatchChecks::EachMessage`]), PostgreSQL, where a savepoint costs a subtransaction (and
    /// a transaction with more than 64 slows every statement), also first runs them without
    /// savepoints, with a look at the transaction after each; elsewhere a handler could carry on
    /// past a transaction the database ended under it, its later writes committed on their own,
    /// so each message has its savepoint from the first try.
    pub(super) async fn transact<H: Handler>(
        &self,
        batch: &Batch<'_, H>,
        leads: &mut [Lead<H::Message, H::Output>],
    ) -> Result<(), Lost>
    where
        H::Message: Clone,
    {
        // One process owns the database: its batches take turns here.
        let _turn = match self.store.dialect().one_process() {
            true => Some(self.sqlite_batches.lock().await),
            false => None,
        };
        let mut keeping = match batch.checks {
            BatchChecks::BeforeCommit => Keeping::Trusted,
            BatchChecks::EachMessage if self.store.dialect().aborts_on_error() => {
                Keeping::CheckEach
            }
            BatchChecks::EachMessage => Keeping::Savepoints,
        };
        // Each try again leaves out at least one message whose failure stands, or runs under
        // savepoints where every failure is kept apart: it ends.
        for _ in 0..=leads.len() + 1 {
            match self.attempt(batch, leads, keeping).await? {
                Tried::Ended => return Ok(()),
                Tried::Again | Tried::Broken => {
                    tracing::debug!(
                        consumer = batch.consumer.as_str(),
                        "a message of the batch failed, or broke its transaction; running the \
                         others again with a savepoint per message"
                    );
                    keeping = Keeping::Savepoints;
                }
            }
        }
        Err(Lost::RolledBack)
    }

    /// One try at the batch's transaction.
    async fn attempt<H: Handler>(
        &self,
        batch: &Batch<'_, H>,
        leads: &mut [Lead<H::Message, H::Output>],
        keeping: Keeping,
    ) -> Result<Tried, Lost>
    where
        H::Message: Clone,
    {
        let store = &self.store;
        let Some(claimed) = self.claim_batch(batch, leads).await? else {
            return Ok(Tried::Ended);
        };
        let run = Run {
            handler: batch.handler,
            tx: &claimed.tx,
            metadata: batch.metadata,
            store,
            staging: Staging {
                outbox: self.outbox.as_ref(),
                claim: RunClaim {
                    statements: self.run_statements.as_ref(),
                    token: claimed.token,
                },
            },
        };
        let ran = match keeping {
            Keeping::Savepoints => run_all(&run, leads, Savepoints::new(&claimed.tx)).await,
            _ => {
                let guard = Unguarded::new(
                    store,
                    &claimed.tx,
                    // Unguarded handlers are checked to leave the transaction they were given,
                    // on PostgreSQL against its id; elsewhere a transaction rolled back under
                    // a handler shows in the completion's count.
                    claimed.transaction_id,
                    keeping == Keeping::CheckEach,
                    claimed.token,
                );
                run_all(&run, leads, guard).await
            }
        };
        let step = match ran {
            Ok(step) => step,
            Err(lost) => return Err(lost::abandon(claimed.tx, lost).await),
        };
        if step == Step::Again {
            lost::roll_back(claimed.tx).await?;
            return Ok(Tried::Again);
        }
        let finishing = Finishing {
            trusted: keeping == Keeping::Trusted,
            under_savepoints: keeping == Keeping::Savepoints,
        };
        self.finish(claimed, batch, leads, finishing).await
    }
}

/// Runs every fresh message's handler under `guard`, in the order of their keys.
async fn run_all<H: Handler, G: Guard>(
    run: &Run<'_, H>,
    leads: &mut [Lead<H::Message, H::Output>],
    mut guard: G,
) -> Result<Step, Lost>
where
    H::Message: Clone,
{
    for at in 0..leads.len() {
        if leads[at].is_fresh() && guard.run(run, leads, at).await? == Step::Again {
            return Ok(Step::Again);
        }
    }
    guard.close(leads).await
}

//! A slice handler's batch: the fresh messages handled in one call; when it fails, the
//! messages that fail are found by halving the slice, each half under a savepoint of its own.

use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;
use sea_orm::{ConnectionTrait, DbErr};

use super::attempt::{Batch, Finishing, Tried};
use super::fates::{Handled, Lead};
use super::guard::{Run, Staging};
use super::item::{BatchChecks, BatchItem, MAX_BATCH, in_chunk};
use super::lost::{self, Lost};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::handler::{Mode, Outcome};
use crate::inbox::handling::{outage_or_handler_error, panic_message};
use crate::inbox::inner::Inner;
use crate::key::InboxKey;
use crate::outbox::RunClaim;
use crate::slice::{SliceContext, SliceHandler};
use crate::store::dialect::{Failure, classify, database_error_in};

impl Inner {
    /// See the `Inbox` method of this name.
    pub(crate) async fn process_slices<S: SliceHandler>(
        &self,
        handler: &S,
        items: Vec<BatchItem<S::Message>>,
    ) -> Vec<Result<Outcome<S::Output>>>
    where
        S::Message: Clone,
    {
        let mut results = Vec::with_capacity(items.len());
        if handler.mode() != Mode::Transactional {
            for item in items {
                let result = self
                    .process_with_key(handler, item.key, item.message, &item.metadata)
                    .await;
                results.push(result);
            }
            return results;
        }
        let mut items = items.into_iter().peekable();
        while items.peek().is_some() {
            let chunk: Vec<_> = items.by_ref().take(MAX_BATCH).collect();
            let size = chunk.len();
            let one = self.one_slice_batch(handler, chunk);
            results.extend(in_chunk(handler.consumer(), size, one).await);
        }
        results
    }

    /// One transaction's worth of a slice handler's batch.
    async fn one_slice_batch<S: SliceHandler>(
        &self,
        handler: &S,
        items: Vec<BatchItem<S::Message>>,
    ) -> Vec<Result<Outcome<S::Output>>>
    where
        S::Message: Clone,
    {
        let (mut sorted, consumer, retention) = match self.sort(handler, items) {
            Ok(sorted) => sorted,
            Err(failed) => return failed,
        };
        let mut leads = std::mem::take(&mut sorted.leads);
        let batch = Batch {
            handler,
            consumer: &consumer,
            metadata: &sorted.metadata,
            retention,
            checks: BatchChecks::default(),
        };
        let transacted = self.transact_slices(&batch, &mut leads).await;
        self.conclude(handler, sorted, leads, &consumer, transacted)
            .await
    }

    /// The batch's transaction, tried until it commits or is lost: claims, the slices, the
    /// completion. The first try calls the handler on every fresh message with no savepoint,
    /// as a hand-written batch runs its multi-row statement, and the completion finds a
    /// transaction the call broke. When the call fails, or the completion finds the
    /// transaction broken or an output refused, the try is rolled back and the next ones run
    /// under savepoints, halving the slice to find the messages that fail.
    async fn transact_slices<S: SliceHandler>(
        &self,
        batch: &Batch<'_, S>,
        leads: &mut [Lead<S::Message, S::Output>],
    ) -> Result<(), Lost>
    where
        S::Message: Clone,
    {
        // One process owns the database: its batches take turns here.
        let _turn = match self.store.dialect().one_process() {
            true => Some(self.sqlite_batches.lock().await),
            false => None,
        };
        let store = &self.store;
        let mut slicing = Slicing::Whole;
        for _ in 0..=leads.len() + 1 {
            let Some(claimed) = self.claim_batch(batch, leads).await? else {
                return Ok(());
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
            let ran = match slicing {
                Slicing::Whole => run_whole(&run, leads).await,
                Slicing::Guarded { halved } => {
                    run_slices(&run, leads, halved).await.map(|()| Step::Next)
                }
            };
            let step = match ran {
                Ok(step) => step,
                Err(lost) => return Err(lost::abandon(claimed.tx, lost).await),
            };
            if let Step::Again { halve } = step {
                lost::roll_back(claimed.tx).await?;
                slicing = Slicing::Guarded { halved: halve };
                continue;
            }
            let whole = slicing == Slicing::Whole;
            let finishing = Finishing {
                trusted: whole,
                under_savepoints: !whole,
            };
            match self.finish(claimed, batch, leads, finishing).await? {
                Tried::Ended => return Ok(()),
                // An output refused: the call succeeded, and runs again under a savepoint.
                Tried::Again => slicing = Slicing::Guarded { halved: false },
                // The one call of the try broke the transaction: its halves run next.
                Tried::Broken => slicing = Slicing::Guarded { halved: true },
            }
        }
        Err(Lost::RolledBack)
    }
}

/// How a try calls the slice handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slicing {
    /// Once on every fresh message, with no savepoint.
    Whole,
    /// Under savepoints, halving a slice that fails; `halved` starts from the two halves (the
    /// whole slice failed in the try before).
    Guarded { halved: bool },
}

/// What a try without savepoints says once its call returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Complete and commit.
    Next,
    /// Roll back and run again under savepoints, from the halves of the slice when `halve`.
    Again { halve: bool },
}

/// Calls the handler once on every fresh lead, with no savepoint. A failure nothing can be
/// kept apart from (the transaction may be aborted) rolls the try back: a message alone, or
/// a failure the whole slice shares, fails and is left out of the next try; otherwise the
/// next try halves the slice. A deadlock that rolled the whole transaction back loses the
/// batch to that contention, every message to be delivered again.
async fn run_whole<S: SliceHandler>(
    run: &Run<'_, S>,
    leads: &mut [Lead<S::Message, S::Output>],
) -> Result<Step, Lost>
where
    S::Message: Clone,
{
    let fresh = fresh_leads(leads);
    if fresh.is_empty() {
        return Ok(Step::Next);
    }
    let failure = match call_on(run, leads, &fresh).await? {
        Ok(handled) => {
            for (at, handled) in fresh.iter().zip(handled) {
                leads[*at].processed(handled);
            }
            return Ok(Step::Next);
        }
        Err(failure) => failure,
    };
    if let Some(deadlock) = contention_in(&failure).filter(|error| {
        classify(error) == Failure::Deadlock && !run.store.dialect().aborts_on_error()
    }) {
        // MySQL/MariaDB rolled the whole transaction back under the call: no message of the
        // slice is at fault, and each is delivered again.
        return Err(Lost::Database(deadlock));
    }
    match (fresh.as_slice(), shared_failure(&failure)) {
        ([at], None) => leads[*at].fail_alone(failure),
        (_, Some((kind, error))) => {
            for at in &fresh {
                leads[*at].fail_alone(kind(error.clone()));
            }
        }
        (_, None) => return Ok(Step::Again { halve: true }),
    }
    Ok(Step::Again { halve: false })
}

/// Where the fresh leads are, in order.
fn fresh_leads<M, T>(leads: &[Lead<M, T>]) -> Vec<usize> {
    (0..leads.len())
        .filter(|at| leads[*at].is_fresh())
        .collect()
}

/// Calls the handler on the leads at `slice`: what each gave, or why the call failed.
async fn call_on<S: SliceHandler>(
    run: &Run<'_, S>,
    leads: &mut [Lead<S::Message, S::Output>],
    slice: &[usize],
) -> Result<Result<Vec<Handled<S::Output>>>, Lost>
where
    S::Message: Clone,
{
    let messages = slice.iter().map(|at| leads[*at].message_copy()).collect();
    let keys: Vec<(&InboxKey, usize)> = slice
        .iter()
        .map(|at| (&leads[*at].key, leads[*at].index))
        .collect();
    call(run, &keys, messages).await
}

/// Runs the fresh leads' handler in slices, each under a savepoint: all of them at first (or
/// their two halves, when `halved`); a slice that fails is rolled back to its savepoint and its
/// halves run in turn, down to single messages, which fail alone.
async fn run_slices<S: SliceHandler>(
    run: &Run<'_, S>,
    leads: &mut [Lead<S::Message, S::Output>],
    halved: bool,
) -> Result<(), Lost>
where
    S::Message: Clone,
{
    let fresh = fresh_leads(leads);
    // Slices still to run, the next one last.
    let mut slices: Vec<&[usize]> = Vec::new();
    if halved && fresh.len() > 1 {
        let (first, second) = fresh.split_at(fresh.len() / 2);
        slices.push(second);
        slices.push(first);
    } else if !fresh.is_empty() {
        slices.push(&fresh);
    }
    while let Some(slice) = slices.pop() {
        lost::execute(run.tx, "SAVEPOINT idem_slice").await?;
        let called = call_on(run, leads, slice).await?;
        let failure = match called {
            Ok(handled) => match run
                .tx
                .execute_unprepared("RELEASE SAVEPOINT idem_slice")
                .await
            {
                Ok(_) => {
                    for (at, handled) in slice.iter().zip(handled) {
                        leads[*at].processed(handled);
                    }
                    continue;
                }
                // A failed statement the handler swallowed (PostgreSQL), or a transaction it
                // ended or let the database roll back.
                Err(error) => {
                    Lost::unless_unreachable(error)?;
                    None
                }
            },
            Err(failure) => Some(failure),
        };
        let undo = "ROLLBACK TO SAVEPOINT idem_slice; RELEASE SAVEPOINT idem_slice";
        if let Err(lost) = lost::execute(run.tx, undo).await {
            return Err(broken_under(slice, failure, lost, leads));
        }
        match slice {
            [at] => {
                let key = leads[*at].key.clone();
                let error = failure.unwrap_or(Error::TransactionAborted { key });
                leads[*at].failed(error);
            }
            _ if let Some((kind, error)) = failure.as_ref().and_then(shared_failure) => {
                // Halving would only call the handler again into the same outage or contention.
                for at in slice {
                    leads[*at].failed(kind(error.clone()));
                }
            }
            _ => {
                let (first, second) = slice.split_at(slice.len() / 2);
                slices.push(second);
                slices.push(first);
            }
        }
    }
    Ok(())
}

/// The transaction went with the slice that failed (`lost`): the batch is lost. An unreachable
/// database is no message's fault; otherwise the slice's handler broke the transaction. A
/// message alone keeps its failure; a larger slice's messages are each failed with
/// [`Error::TransactionAborted`], unless the failure was contention (a MySQL/MariaDB deadlock
/// rolls the whole transaction back), which loses the batch to that contention instead, every
/// message to be delivered again.
fn broken_under<M, T>(
    slice: &[usize],
    failure: Option<Error>,
    lost: Lost,
    leads: &mut [Lead<M, T>],
) -> Lost {
    if !matches!(lost, Lost::RolledBack) {
        return lost;
    }
    if let [at] = slice {
        let key = leads[*at].key.clone();
        leads[*at].failed(failure.unwrap_or(Error::TransactionAborted { key }));
        return lost;
    }
    if let Some(contention) = failure.as_ref().and_then(contention_in) {
        return Lost::Database(contention);
    }
    for at in slice {
        let key = leads[*at].key.clone();
        leads[*at].failed(Error::TransactionAborted { key });
    }
    lost
}

/// A failure no one message of the slice is at fault for, which halving would only meet again:
/// a database of the handler's own that is unreachable, or a lock not granted in time (each
/// half would wait as long again). Each message of the slice gets it: the error's kind and the
/// database's error. (A deadlock's victim may well pass again: the slice is halved.)
fn shared_failure(failure: &Error) -> Option<(ErrorKind, DbErr)> {
    match failure {
        Error::StoreUnavailable(error) => Some((Error::StoreUnavailable, error.clone())),
        _ => contention_in(failure)
            .filter(|error| classify(error) == Failure::LockTimeout)
            .map(|error| (Error::Contention as ErrorKind, error)),
    }
}

/// An [`Error`] variant that holds the database's error.
type ErrorKind = fn(DbErr) -> Error;

/// The database's deadlock or lock wait timeout a handler's failure carries, if any.
fn contention_in(failure: &Error) -> Option<DbErr> {
    let error = match failure {
        Error::Handler { source, .. } => database_error_in(source.as_ref())?,
        Error::Contention(error) => error.clone(),
        _ => return None,
    };
    matches!(classify(&error), Failure::Deadlock | Failure::LockTimeout).then_some(error)
}

/// Calls the slice handler on `messages`, whose keys and places in the batch are `keys`: what
/// each gave, or why the call failed (`Err` from the outer result when the batch's transaction
/// is lost).
async fn call<S: SliceHandler>(
    run: &Run<'_, S>,
    keys: &[(&InboxKey, usize)],
    messages: Vec<S::Message>,
) -> Result<Result<Vec<Handled<S::Output>>>, Lost> {
    let contexts: Vec<Context<'_>> = keys
        .iter()
        .map(|(key, index)| {
            Context::new(&key.message_key, &run.metadata[*index], Some(run.tx))
                .with_origin(key, run.staging.outbox)
                .with_run_claim(run.staging.claim)
                .staging_in_message_trace()
        })
        .collect();
    let cx = SliceContext::new(run.tx, &contexts);
    let called = AssertUnwindSafe(run.handler.handle_slice(&cx, messages))
        .catch_unwind()
        .await;
    let failure = match called {
        Ok(Ok(outputs)) if outputs.len() == keys.len() => {
            return Ok(stored(run, keys, &contexts, outputs));
        }
        Ok(Ok(outputs)) => Error::Handler {
            source: format!(
                "the slice handler returned {} outputs for {} messages",
                outputs.len(),
                keys.len()
            )
            .into(),
            permanent: false,
        },
        Ok(Err(error)) => Error::Handler {
            permanent: run.handler.is_permanent(&error),
            source: Box::new(error),
        },
        Err(panic) => Error::HandlerPanicked(panic_message(panic.as_ref())),
    };
    let failure = outage_or_handler_error(failure, run.tx).await;
    if failure.is_store_unavailable() {
        lost::still_reached(run.tx).await?;
    }
    Ok(Err(failure))
}

/// The slice's outputs as they are stored, or the first that cannot be.
fn stored<S: SliceHandler>(
    run: &Run<'_, S>,
    keys: &[(&InboxKey, usize)],
    contexts: &[Context<'_>],
    outputs: Vec<S::Output>,
) -> Result<Vec<Handled<S::Output>>> {
    let mut handled = Vec::with_capacity(outputs.len());
    for (((key, _), cx), output) in keys.iter().zip(contexts).zip(outputs) {
        let json = serde_json::to_string(&output)
            .map_err(|error| Error::OutputNotStorable(Box::new(error)))?;
        let stored = (json != "null").then_some(json);
        if let Some(json) = &stored {
            run.store
                .check_output(&key.message_key, json)
                .map_err(|error| Error::OutputNotStorable(Box::new(error)))?;
        }
        handled.push(Handled {
            output,
            stored,
            staged: cx.outbound().staged(),
        });
    }
    Ok(handled)
}

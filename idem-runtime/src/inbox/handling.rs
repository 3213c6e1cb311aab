//! Running a handler and reading what a run left: a panic turned into an error, a failure told
//! from an outage of the batch's own database, a stored output decoded.

use std::any::Any;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;
use sea_orm::{ConnectionTrait, DatabaseTransaction};
use serde::de::DeserializeOwned;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::handler::Handler;
use crate::key::InboxKey;
use crate::metadata::Metadata;
use crate::store::dialect::{Failure, classify, database_error_in};

/// Runs `work` to its end, polling the `renewal` beside it while there is one: once it ends
/// (the claim lost), it is dropped and `work` goes on alone.
pub(crate) async fn run_beside_renewal<T, R: Future<Output = ()>>(
    work: impl Future<Output = T>,
    renewal: &mut Option<std::pin::Pin<Box<R>>>,
) -> T {
    tokio::pin!(work);
    let Some(renewing) = renewal.as_mut() else {
        return work.await;
    };
    tokio::select! {
        biased;
        done = &mut work => done,
        () = renewing => {
            *renewal = None;
            work.await
        }
    }
}

/// A transactional handler's failure, or the database outage or contention behind it: when the
/// handler's statements failed because the database went away, or met a deadlock or a lock not
/// granted in time, the message is not at fault. Told by a database error in the handler
/// error's source chain, or by the transaction itself no longer reaching the database.
pub(crate) async fn outage_or_handler_error(error: Error, tx: &DatabaseTransaction) -> Error {
    let Error::Handler { source, .. } = &error else {
        return error;
    };
    if let Some(db_error) = database_error_in(source.as_ref()) {
        match classify(&db_error) {
            // The database's own error, whose kind (no connection free, a server that takes no
            // writes) decides how the delivery is retried.
            Failure::Unreachable => return Error::StoreUnavailable(db_error),
            // Retried without counting an attempt, as a claim's contention is.
            Failure::Deadlock | Failure::LockTimeout => return Error::Contention(db_error),
            Failure::Aborted | Failure::Refused => {}
        }
    }
    match tx.execute_unprepared("SELECT 1").await {
        Err(probe) if classify(&probe) == Failure::Unreachable => Error::StoreUnavailable(probe),
        _ => error,
    }
}

/// Ends the transaction of a run that failed with `error`, and gives the error back: the run's
/// locks, its claim's among them, are released before its caller hears of the failure, not
/// whenever the pool next sends the rollback a dropped transaction leaves it (a retry that does
/// not wait for locks, as an HTTP retry, would be told the key is still in progress). A database
/// that is unreachable has ended the transaction already.
pub(crate) async fn abandon(tx: DatabaseTransaction, error: Error) -> Error {
    if !matches!(error, Error::StoreUnavailable(_)) {
        roll_back_quietly(tx).await;
    }
    error
}

/// Rolls `tx` back now, for a caller that has failed already: a rollback that fails too (the
/// transaction ended under it) changes nothing it reports.
pub(crate) async fn roll_back_quietly(tx: DatabaseTransaction) {
    if let Err(error) = tx.rollback().await {
        tracing::debug!(%error, "a failed run's transaction could not be rolled back");
    }
}

/// Runs the handler, turning its error and its panic into [`Error`]s.
pub(crate) async fn run_handler<H: Handler>(
    handler: &H,
    cx: &Context<'_>,
    message: H::Message,
) -> Result<H::Output> {
    match AssertUnwindSafe(handler.handle(cx, message))
        .catch_unwind()
        .await
    {
        Ok(Ok(output)) => Ok(output),
        Ok(Err(error)) => Err(Error::Handler {
            permanent: handler.is_permanent(&error),
            source: Box::new(error),
        }),
        Err(panic) => Err(Error::HandlerPanicked(panic_message(panic.as_ref()))),
    }
}

/// The handler's fingerprint of `message`; a panic in it (user code) is the message's own
/// failure, [`Error::HandlerPanicked`], not its batch's.
pub(crate) fn fingerprint_of<H: Handler>(
    handler: &H,
    message: &H::Message,
    metadata: &Metadata,
) -> Result<Option<crate::fingerprint::Fingerprint>> {
    std::panic::catch_unwind(AssertUnwindSafe(|| handler.fingerprint(message, metadata)))
        .map_err(|panic| Error::HandlerPanicked(panic_message(panic.as_ref())))?
        .map_err(Error::from)
}

/// The message a panic carries, for errors and logs.
pub fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

pub(crate) fn decode_stored<T: DeserializeOwned>(
    key: &InboxKey,
    output: Option<String>,
) -> Result<T> {
    serde_json::from_str(output.as_deref().unwrap_or("null")).map_err(|source| {
        Error::StoredOutputUnreadable {
            key: key.clone(),
            source,
        }
    })
}

//! Why a try at a batch's transaction ended without committing, and what each message whose
//! work it held gets then.

use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr};

use crate::error::Error;
use crate::inbox::handling::roll_back_quietly;
use crate::key::InboxKey;
use crate::store::dialect::{Failure, classify};

/// Why a batch's transaction ended without committing.
#[derive(Debug)]
pub(super) enum Lost {
    /// A statement of the batch failed, or the commit did: the error as the driver gave it,
    /// whose kind decides whether the messages' deliveries count.
    Database(DbErr),
    /// A handler broke the transaction: the database rolled back or aborted more than that
    /// handler's own work.
    RolledBack,
}

impl Lost {
    /// The batch's own statement (a savepoint, a check) failed: the database is lost when it is
    /// unreachable; otherwise a handler broke the transaction under it.
    pub(super) fn statement(error: DbErr) -> Self {
        match classify(&error) {
            Failure::Unreachable => Lost::Database(error),
            _ => Lost::RolledBack,
        }
    }

    /// `Err` with the lost database when `error` is unreachable; the refused statement's error
    /// otherwise, for the caller to tell what it means.
    pub(super) fn unless_unreachable(error: DbErr) -> Result<DbErr, Lost> {
        match classify(&error) {
            Failure::Unreachable => Err(Lost::Database(error)),
            _ => Ok(error),
        }
    }

    /// Whether a statement of the batch was refused (not lost to an outage or contention).
    pub(super) fn refused(&self) -> bool {
        matches!(self, Lost::Database(error) if classify(error) == Failure::Refused)
    }

    /// The error a message whose work the lost transaction held gets: the database's error
    /// itself, so that an outage, a server that takes no writes or a pool with no free
    /// connection is told apart and counted as it would be alone, and
    /// [`Error::BatchRolledBack`] when a handler broke the transaction (not counted: this
    /// message is not at fault).
    pub(super) fn error_for(&self, key: &InboxKey) -> Error {
        match self {
            Lost::Database(error) if classify(error) != Failure::Aborted => {
                Error::from(error.clone())
            }
            _ => Error::BatchRolledBack { key: key.clone() },
        }
    }
}

/// Runs one of the batch's own statements (savepoints); its failure loses the try.
pub(super) async fn execute(tx: &DatabaseTransaction, sql: &str) -> Result<(), Lost> {
    tx.execute_unprepared(sql)
        .await
        .map(drop)
        .map_err(Lost::statement)
}

/// Rolls back a batch's transaction to run it again, which a handler may have ended or broken:
/// only an unreachable database loses it (SQLite refuses to roll back what already ended).
pub(super) async fn roll_back(tx: DatabaseTransaction) -> Result<(), Lost> {
    match tx.rollback().await {
        Err(error) => Lost::unless_unreachable(error).map(drop),
        Ok(()) => Ok(()),
    }
}

/// Ends the transaction of a try that was `lost`, and gives `lost` back: its claims' locks are
/// released before the batch's messages are settled and redelivered, not whenever the pool next
/// sends the rollback a dropped transaction leaves it. A database that is unreachable has ended
/// the transaction already.
pub(super) async fn abandon(tx: DatabaseTransaction, lost: Lost) -> Lost {
    let unreachable =
        matches!(&lost, Lost::Database(error) if classify(error) == Failure::Unreachable);
    if !unreachable {
        roll_back_quietly(tx).await;
    }
    lost
}

/// After a handler failed saying the database is unreachable: whether the batch's own
/// transaction still reaches it. When it does, the outage is the handler's own (another
/// database it uses, a pool of its own): that message fails alone, as it would on its own.
pub(super) async fn still_reached(tx: &DatabaseTransaction) -> Result<(), Lost> {
    match tx.execute_unprepared("SELECT 1").await {
        Err(error) => Lost::unless_unreachable(error).map(drop),
        Ok(_) => Ok(()),
    }
}

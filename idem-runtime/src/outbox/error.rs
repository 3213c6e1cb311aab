//! Why a message was not staged.

use sea_orm::DbErr;

/// Why a message was not staged: nothing of it is in the outbox.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StagingError {
    /// The handler has no transaction to stage in: a two-phase handler runs outside any.
    #[error(
        "a two-phase handler cannot stage messages: it has no transaction; pass \
         Context::downstream_key to the service it calls instead"
    )]
    NoTransaction,
    /// The inbox has no outbox to stage in.
    #[error("this inbox has no outbox to stage messages in: give it one with InboxBuilder::outbox")]
    NoOutbox,
    /// The message cannot be published as it is (a name longer than AMQP allows, an empty id,
    /// key or run, headers larger than a frame).
    #[error("cannot stage this message: {0}")]
    Invalid(String),
    /// The handler run's transaction no longer holds its inbox claim: the database rolled it
    /// back (a MySQL/MariaDB deadlock, a SQLite error the handler ignored), or the handler ended
    /// it itself. A message staged now would commit on its own, of an effect that never was.
    #[error(
        "nothing staged: the handler's transaction is no longer open (the database rolled it \
         back, or the handler ended it)"
    )]
    ClaimLost,
    /// The database failed; nothing was staged (outside a transaction, the staging's one
    /// statement either committed or not: a message with a key of the caller's,
    /// [`OutboxMessage::keyed`](crate::OutboxMessage::keyed), can be staged again without a
    /// second copy).
    #[error("the outbox database failed: {0}")]
    Database(#[source] DbErr),
}

impl From<DbErr> for StagingError {
    fn from(error: DbErr) -> Self {
        StagingError::Database(error)
    }
}

/// For handlers whose error holds a [`DbErr`]: `?` on a staging keeps the database's error
/// itself (its kind decides how the message is retried), and says the rest in words.
impl From<StagingError> for DbErr {
    fn from(error: StagingError) -> Self {
        match error {
            StagingError::Database(error) => error,
            other => DbErr::Custom(other.to_string()),
        }
    }
}

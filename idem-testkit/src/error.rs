//! Why a run could not be made: what goes wrong around the handler, never what the handler
//! does (that is the report's).

use idem_runtime::sea_orm::DbErr;

/// Why a run could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The kit's inbox or outbox could not be built on the database.
    #[error("the kit's inbox or outbox cannot be built: {0}")]
    Setup(#[source] idem_runtime::Error),
    /// The database failed outside the handler: emptying the kit's tables, relaying, counting
    /// effects.
    #[error("the database failed outside the handler: {0}")]
    Database(#[from] DbErr),
    /// A message had effects before the run began: counted after it, they would be taken for
    /// the run's.
    #[error(
        "message #{message} has {effects} effect(s) before the run: start each run on a \
         database without them (fresh tables, or messages with fresh ids)"
    )]
    EffectsBeforeRun {
        /// The message's index.
        message: usize,
        /// The effects counted.
        effects: u64,
    },
    /// The kit was given no messages to deliver.
    #[error("a run needs at least one message")]
    NoMessages,
}

/// The kit's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

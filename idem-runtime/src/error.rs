//! The runtime's error type and the settle decision each error carries.

use std::fmt;
use std::time::Duration;

use sea_orm::DbErr;

use crate::fingerprint::{Fingerprint, FingerprintError};
use crate::key::{InboxKey, KeyError};
use crate::store::dialect::Failure;

/// A boxed error from a handler.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The runtime's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How a transport should settle a delivery after the inbox has seen it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settle {
    /// Its effect is committed (or was, for a duplicate): acknowledge it.
    Ack,
    /// It could succeed later: put it back on the queue, within the transport's delivery limit.
    Requeue,
    /// It can never succeed as it is: move it to the dead-letter queue, with this reason.
    DeadLetter(DeadLetterReason),
}

/// Why a message was dead-lettered: a stable machine-readable code and a human-readable text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterReason {
    /// A stable code such as `fingerprint-mismatch`, for alerts and dashboards.
    pub code: &'static str,
    /// What happened, for the operator.
    pub detail: String,
}

impl DeadLetterReason {
    /// A reason with a code and a detail.
    pub fn new(code: &'static str, detail: impl Into<String>) -> Self {
        Self {
            code,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.detail)
    }
}

/// A configuration that cannot work, reported at start-up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The inbox table name is not a plain SQL identifier.
    #[error(
        "invalid inbox table name {0:?}: use 1 to 48 ASCII letters, digits or underscores, not starting with a digit"
    )]
    InvalidTableName(String),
    /// A retention is shorter than the time the broker may still redeliver a message.
    #[error(
        "retention of {retention:?} for {consumer} is shorter than the redelivery window of {window:?}: a late redelivery would be processed twice"
    )]
    RetentionTooShort {
        /// The consumer concerned, or `"the default"`.
        consumer: String,
        /// The retention configured.
        retention: Duration,
        /// The redelivery window it must cover.
        window: Duration,
    },
    /// A duration or count that must be positive is zero.
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    /// The inbox table exists but does not have the schema this version uses (it was created by
    /// another version, or changed by hand).
    #[error(
        "the inbox table {table} does not have the expected schema ({detail}); see idem_runtime::schema::create_table_statements"
    )]
    SchemaMismatch {
        /// The table.
        table: String,
        /// What the check found.
        detail: String,
    },
    /// The database connection's backend is not compiled in or not supported.
    #[error("unsupported database backend: {0}")]
    UnsupportedBackend(String),
}

impl From<DbErr> for Error {
    /// Classifies a database error by what the driver says of it: unreachable, contention, or a
    /// refused statement.
    fn from(error: DbErr) -> Self {
        match crate::store::dialect::classify(&error) {
            Failure::Unreachable => Error::StoreUnavailable(error),
            Failure::Deadlock | Failure::LockTimeout => Error::Contention(error),
            Failure::Aborted | Failure::Refused => Error::Database(error),
        }
    }
}

/// Everything that can go wrong while processing a message; [`Error::settle`] tells a transport
/// what to do with the delivery.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The message's key is missing or invalid. Dead-lettered: it cannot be deduplicated.
    #[error("invalid message key: {0}")]
    InvalidKey(#[source] KeyError),
    /// The handler's consumer name is invalid. Dead-lettered.
    #[error("invalid consumer name: {0}")]
    InvalidConsumer(#[source] KeyError),
    /// The message could not be fingerprinted. Dead-lettered.
    #[error(transparent)]
    Fingerprint(#[from] FingerprintError),
    /// The key was processed before with different content: a reused key or a changed message.
    /// Dead-lettered with an alert, never dropped and never processed.
    #[error(
        "key {key} was processed before with different content (stored fingerprint {stored}, this message {received})"
    )]
    FingerprintMismatch {
        /// The inbox key.
        key: InboxKey,
        /// The fingerprint stored with the record (entity mode: the stored entity's).
        stored: Fingerprint,
        /// This delivery's fingerprint.
        received: Fingerprint,
    },
    /// An entity-mode handler returned without creating its marker entity
    /// ([`Context::create`](crate::Context::create)): nothing tells a later copy that this one
    /// was processed, so nothing was committed. Dead-lettered.
    #[error(
        "the entity-mode handler of {key} returned without creating its marker entity (Context::create): nothing was committed"
    )]
    MarkerMissing {
        /// The inbox key.
        key: InboxKey,
    },
    /// An entity-mode handler's marker was refused ([`Context::create`](crate::Context::create)
    /// called twice in a run, an entity without its primary key set, a key the column's
    /// collation merges with another's): the handler or the schema must change. Dead-lettered.
    #[error("the marker entity of {key} was refused: {reason}")]
    MarkerRefused {
        /// The inbox key.
        key: InboxKey,
        /// Why.
        reason: String,
    },
    /// Another worker holds a live claim on the key (two-phase mode). Requeued, to be retried
    /// after the claim completes or its lease runs out.
    #[error("key {key} is being processed elsewhere (claim held for another {remaining:?})")]
    InProgressElsewhere {
        /// The inbox key.
        key: InboxKey,
        /// How long the other claim's lease still runs.
        remaining: Duration,
    },
    /// Expired claims on the key were taken over too many times: earlier attempts crashed or hung,
    /// and the downstream state needs a person to look at it. Dead-lettered.
    #[error("key {key} needs intervention: {attempts} attempts did not complete")]
    NeedsIntervention {
        /// The inbox key.
        key: InboxKey,
        /// How many attempts claimed it.
        attempts: u32,
    },
    /// This worker's claim was taken over while its handler ran (its lease ran out), so it may not
    /// complete the record. Requeued: the redelivery finds the other worker's result.
    #[error("the claim on {key} was taken over by another worker before it completed")]
    ClaimLost {
        /// The inbox key.
        key: InboxKey,
    },
    /// The handler failed. Requeued when transient, dead-lettered when the handler says the error
    /// is permanent ([`Handler::is_permanent`](crate::Handler::is_permanent)).
    #[error("handler failed: {source}")]
    Handler {
        /// The handler's error.
        #[source]
        source: BoxError,
        /// Whether retrying cannot help.
        permanent: bool,
    },
    /// The handler panicked. Nothing was recorded; requeued (a panic on every delivery ends in the
    /// dead-letter queue at the transport's delivery limit).
    #[error("handler panicked: {0}")]
    HandlerPanicked(String),
    /// The handler's output could not be stored: it does not serialize as JSON, or the database
    /// refused it (too large, say). Dead-lettered. In transactional mode nothing was committed;
    /// in two-phase mode the side effect has happened, so the record is completed without the
    /// output, and a later copy is acknowledged as a duplicate: with
    /// [`Error::StoredOutputUnreadable`], or, for an output type that reads JSON `null` (an
    /// `Option`, `()`), with that value.
    #[error("cannot store the handler's output: {0}")]
    OutputNotStorable(#[source] BoxError),
    /// A duplicate's stored output no longer reads as the handler's output type (the type changed
    /// since it was stored). Acknowledged: the message's effect is committed.
    #[error("the stored output of {key} cannot be read: {source}")]
    StoredOutputUnreadable {
        /// The inbox key.
        key: InboxKey,
        /// Why it cannot be read.
        #[source]
        source: serde_json::Error,
    },
    /// The inbox database could not be reached or cannot take writes: no connection, a
    /// connection lost, no pooled connection free in time, the server shutting down, a server
    /// in read-only mode (a standby, a failover's demoted primary), out of disk.
    /// Requeued without counting against the message's delivery limit: the message is not at
    /// fault.
    #[error("inbox database unreachable: {0}")]
    StoreUnavailable(#[source] DbErr),
    /// The database gave up on a statement because of other transactions: a deadlock, a lock
    /// wait timeout, a serialization failure, a busy SQLite file. Requeued without counting:
    /// trying again later can succeed.
    #[error("inbox database contention: {0}")]
    Contention(#[source] DbErr),
    /// The database refused a statement (a constraint, a trigger, a privilege, a statement it
    /// cannot run). Requeued, counting against the delivery limit.
    #[error("inbox database error: {0}")]
    Database(#[source] DbErr),
    /// The handler's transaction was aborted before it could commit: a statement failed and the
    /// handler carried on (PostgreSQL then rolls everything back at `COMMIT`), or the database
    /// rolled it back (a MySQL/MariaDB deadlock the handler swallowed). Nothing was recorded.
    /// Requeued, counting against the delivery limit.
    #[error(
        "the transaction of {key} was aborted by a failed statement, so nothing was committed: \
         run statements that are expected to fail inside a savepoint (`tx.begin()`), and \
         return the error of any other failed statement"
    )]
    TransactionAborted {
        /// The inbox key.
        key: InboxKey,
    },
    /// Another message of the same batch broke the batch's transaction (the database rolled it
    /// back under that message's handler), so this message's work was rolled back with it.
    /// Requeued without counting against the delivery limit: this message is not at fault.
    #[error(
        "the batch holding {key} was rolled back by another of its messages; nothing of it was committed"
    )]
    BatchRolledBack {
        /// The inbox key.
        key: InboxKey,
    },
    /// The stored record of a key cannot be read: an unknown status, a fingerprint of the wrong
    /// length. Dead-lettered with an alert; someone changed the table by hand or another program
    /// writes to it. Retrying would fail the same way.
    #[error("the inbox record of {key} is corrupt: {detail}")]
    CorruptRecord {
        /// The inbox key.
        key: InboxKey,
        /// What is wrong with it.
        detail: String,
    },
    /// The inbox is misconfigured.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

impl Error {
    /// How a transport should settle the delivery that produced this error.
    pub fn settle(&self) -> Settle {
        match self {
            Error::InProgressElsewhere { .. }
            | Error::ClaimLost { .. }
            | Error::HandlerPanicked(_)
            | Error::StoreUnavailable(_)
            | Error::Contention(_)
            | Error::Database(_)
            | Error::TransactionAborted { .. }
            | Error::BatchRolledBack { .. } => Settle::Requeue,
            Error::Handler {
                permanent: false, ..
            } => Settle::Requeue,
            Error::StoredOutputUnreadable { .. } => Settle::Ack,
            _ => Settle::DeadLetter(DeadLetterReason::new(self.code(), self.to_string())),
        }
    }

    /// Whether retrying the same delivery later could succeed.
    pub fn is_transient(&self) -> bool {
        self.settle() == Settle::Requeue
    }

    /// Whether the inbox database could not be reached: no connection, a connection lost, no
    /// pooled connection free in time, or the server shutting down. The message is not at fault,
    /// so a transport should not count the delivery against the message's delivery limit; a
    /// statement the database refused is not counted here.
    pub fn is_store_unavailable(&self) -> bool {
        matches!(self, Error::StoreUnavailable(_))
    }

    /// Whether a requeue of the delivery counts against the message's delivery limit. It does
    /// not when the message is not at fault: the database unreachable or contended, or another
    /// worker holding the key. Meaningless for errors that do not settle as a requeue.
    pub fn counts_as_attempt(&self) -> bool {
        !matches!(
            self,
            Error::StoreUnavailable(_)
                | Error::Contention(_)
                | Error::InProgressElsewhere { .. }
                | Error::BatchRolledBack { .. }
        )
    }

    /// A stable, machine-readable name for the error, used as the dead-letter reason code and
    /// as a metrics label.
    pub fn code(&self) -> &'static str {
        match self {
            Error::InvalidKey(_) => "invalid-key",
            Error::InvalidConsumer(_) => "invalid-consumer",
            Error::Fingerprint(_) => "unfingerprintable",
            Error::FingerprintMismatch { .. } => "fingerprint-mismatch",
            Error::MarkerMissing { .. } => "marker-missing",
            Error::MarkerRefused { .. } => "marker-refused",
            Error::InProgressElsewhere { .. } => "in-progress-elsewhere",
            Error::NeedsIntervention { .. } => "needs-intervention",
            Error::ClaimLost { .. } => "claim-lost",
            Error::Handler {
                permanent: true, ..
            } => "handler-permanent-error",
            Error::Handler { .. } => "handler-error",
            Error::HandlerPanicked(_) => "handler-panicked",
            Error::OutputNotStorable(_) => "output-not-storable",
            Error::StoredOutputUnreadable { .. } => "stored-output-unreadable",
            Error::StoreUnavailable(_) => "database-unavailable",
            Error::Contention(_) => "database-contention",
            Error::Database(_) => "database-error",
            Error::TransactionAborted { .. } => "transaction-aborted",
            Error::BatchRolledBack { .. } => "batch-rolled-back",
            Error::CorruptRecord { .. } => "corrupt-record",
            Error::Config(_) => "configuration",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_the_settle_the_design_gives() {
        let key = InboxKey {
            consumer: crate::key::ConsumerName::new("c").unwrap(),
            message_key: crate::MessageKey::new("k").unwrap(),
        };
        let fp = Fingerprint::of_bytes(b"a");
        let dead = |e: &Error| matches!(e.settle(), Settle::DeadLetter(_));
        assert!(dead(&Error::InvalidKey(KeyError::Missing("key"))));
        assert!(dead(&Error::FingerprintMismatch {
            key: key.clone(),
            stored: fp,
            received: fp
        }));
        assert!(dead(&Error::NeedsIntervention {
            key: key.clone(),
            attempts: 3
        }));
        assert!(dead(&Error::Handler {
            source: "no".into(),
            permanent: true
        }));
        assert_eq!(
            Error::Handler {
                source: "later".into(),
                permanent: false
            }
            .settle(),
            Settle::Requeue
        );
        assert_eq!(
            Error::InProgressElsewhere {
                key: key.clone(),
                remaining: Duration::from_secs(1)
            }
            .settle(),
            Settle::Requeue
        );
        let rolled_back = Error::BatchRolledBack { key: key.clone() };
        assert_eq!(rolled_back.settle(), Settle::Requeue);
        assert!(!rolled_back.counts_as_attempt());
        let refused = Error::from(DbErr::Custom("syntax".into()));
        assert_eq!(refused.settle(), Settle::Requeue);
        assert!(!refused.is_store_unavailable() && refused.counts_as_attempt());
        let down = Error::from(DbErr::Conn(sea_orm::RuntimeErr::Internal("refused".into())));
        assert!(down.is_store_unavailable() && !down.counts_as_attempt());
        assert_eq!(down.code(), "database-unavailable");
        assert!(dead(&Error::CorruptRecord {
            key: key.clone(),
            detail: "status".into()
        }));
        let aborted = Error::TransactionAborted { key: key.clone() };
        assert!(aborted.settle() == Settle::Requeue && aborted.counts_as_attempt());
        match (Error::FingerprintMismatch {
            key,
            stored: fp,
            received: fp,
        })
        .settle()
        {
            Settle::DeadLetter(reason) => assert_eq!(reason.code, "fingerprint-mismatch"),
            other => panic!("unexpected {other:?}"),
        }
    }
}

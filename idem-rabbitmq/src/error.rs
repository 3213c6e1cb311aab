//! The adapter's error type.

use std::time::Duration;

use crate::queue_kind::QueueKind;

/// The adapter's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong connecting, declaring, consuming or publishing. Messages never contain a
/// password: URLs are shown redacted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The broker could not be reached or refused the connection.
    #[error("cannot connect to RabbitMQ at {url}: {source}")]
    Connect {
        /// The URL, password hidden.
        url: String,
        /// lapin's error.
        #[source]
        source: lapin::Error,
    },
    /// An AMQP operation failed.
    #[error("RabbitMQ {operation} failed: {source}")]
    Amqp {
        /// What was being done (`queue.declare billing`, `basic.consume`, ...).
        operation: String,
        /// lapin's error.
        #[source]
        source: lapin::Error,
    },
    /// The broker did not answer in time (a connection accepted but silent, a channel call
    /// never replied to).
    #[error("RabbitMQ {operation} did not complete within {after:?}")]
    TimedOut {
        /// What was being done.
        operation: String,
        /// How long it was waited for.
        after: Duration,
    },
    /// A mandatory message matched no queue: the exchange has no binding for its routing key.
    #[error(
        "message {message_id} to exchange {exchange:?} with routing key {routing_key:?} is unroutable: {reply_text}"
    )]
    Unroutable {
        /// The message's id.
        message_id: String,
        /// The exchange it was published to.
        exchange: String,
        /// Its routing key.
        routing_key: String,
        /// The broker's explanation.
        reply_text: String,
    },
    /// The broker did not confirm a message, despite retries with the same message id.
    #[error("message {message_id} was not confirmed after {attempts} attempts: {last}")]
    NotConfirmed {
        /// The message's id.
        message_id: String,
        /// How many times it was published.
        attempts: u32,
        /// What happened to the last attempt.
        last: String,
    },
    /// A database operation of the adapter's own failed (the outbox relay's `LISTEN`).
    #[error("{operation} failed: {source}")]
    Database {
        /// What was being done.
        operation: String,
        /// The database's error.
        #[source]
        source: idem_runtime::sea_orm::DbErr,
    },
    /// A message's properties cannot be sent (a message id, correlation id, content type or
    /// header name longer than 255 bytes).
    #[error("cannot publish the message: {0}")]
    InvalidMessage(String),
    /// A message could not be encoded.
    #[error("cannot encode the message: {0}")]
    Encode(#[source] serde_json::Error),
    /// The inbox refused a handler or its configuration.
    #[error(transparent)]
    Inbox(#[from] idem_runtime::Error),
    /// Settings that cannot work: every one found, not only the first.
    #[error("invalid configuration: {}", join(.0))]
    Settings(Vec<SettingError>),
    /// In-flight handlers did not finish within the shutdown deadline.
    #[error("{0} handlers were still running at the shutdown deadline of {1:?}")]
    ShutdownTimeout(usize, Duration),
}

/// A consumer, relay or topology setting that cannot work, refused at start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SettingError {
    /// The consumer has nothing to consume.
    #[error("no handler is bound to a queue")]
    NoBinding,
    /// A count or a duration that must be positive is zero.
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    /// Two different handlers use one consumer name: they would share inbox records, and one
    /// would skip the other's messages as duplicates.
    #[error(
        "handlers {first} and {second} both use the consumer name {consumer:?}; give one of them \
         its own (`consumer = \"...\"`), or they skip each other's messages as duplicates"
    )]
    SharedConsumerName {
        /// The consumer name.
        consumer: String,
        /// One handler's type.
        first: &'static str,
        /// The other's.
        second: &'static str,
    },
    /// A queue without a dead-letter exchange: the default exchange would route dead-letter
    /// copies back to the queue.
    #[error("queue {queue:?} has no dead-letter exchange; dead-lettered messages need one")]
    NoDeadLetterExchange {
        /// The queue.
        queue: String,
    },
    /// A binding batches more deliveries than one transaction may carry.
    #[error("queue {queue:?} batches {size} deliveries; at most {max} share a transaction")]
    BatchTooLarge {
        /// The queue.
        queue: String,
        /// The batch size asked for.
        size: usize,
        /// The most a batch may have.
        max: usize,
    },
    /// A relay batch larger than its statements can bind.
    #[error("the relay batch size {size} is more than {max}")]
    RelayBatchTooLarge {
        /// The batch size asked for.
        size: u32,
        /// The most a batch may take.
        max: u32,
    },
    /// A handler that is not transactional (two-phase, entity or natural) bound in batch mode:
    /// batches claim their messages in the inbox table, in one transaction.
    #[error(
        "queue {queue:?} batches deliveries for {consumer:?}, which is not a transactional \
         handler (two-phase, entity or natural mode); batches are for transactional handlers, \
         whose claims and effects share the batch's transaction: bind it without `batch`"
    )]
    TwoPhaseBatch {
        /// The queue.
        queue: String,
        /// The handler's consumer name.
        consumer: String,
    },
    /// The queue's type on the broker is not the one its topology states.
    #[error("queue {queue:?} is a {broker} queue on the broker, but its topology says {stated}")]
    QueueKindMismatch {
        /// The queue.
        queue: String,
        /// Its type on the broker.
        broker: QueueKind,
        /// The type the topology states.
        stated: QueueKind,
    },
}

impl From<SettingError> for Error {
    fn from(problem: SettingError) -> Self {
        Error::Settings(vec![problem])
    }
}

/// The problems of [`Error::Settings`], one after the other.
fn join(problems: &[SettingError]) -> String {
    let texts: Vec<String> = problems.iter().map(ToString::to_string).collect();
    texts.join("; ")
}

impl Error {
    /// Whether an AMQP operation failed because of the broker's state at that moment, which a
    /// later try may find changed, not because the broker refused what was asked: its
    /// connection was lost (its node went away or is stopping), or the broker failed it on its
    /// side (`INTERNAL_ERROR`, as a quorum queue's declaration while its cluster has no majority),
    /// or it did not answer in time (a node killed under a session being opened leaves the
    /// session waiting on a recovery that cannot reach it).
    pub(crate) fn is_transient(&self) -> bool {
        use lapin::protocol::{AMQPErrorKind, AMQPHardError};
        let source = match self {
            Error::Amqp { source, .. } => source,
            Error::TimedOut { .. } => return true,
            _ => return false,
        };
        match source.kind() {
            lapin::ErrorKind::IOError(_)
            | lapin::ErrorKind::InvalidConnectionState(_)
            | lapin::ErrorKind::InvalidChannelState(..) => true,
            lapin::ErrorKind::ProtocolError(amqp) => matches!(
                amqp.kind(),
                AMQPErrorKind::Hard(AMQPHardError::CONNECTIONFORCED | AMQPHardError::INTERNALERROR)
            ),
            _ => false,
        }
    }

    /// The settings refused at start ([`Error::Settings`]); empty for every other error.
    pub fn settings(&self) -> &[SettingError] {
        match self {
            Error::Settings(problems) => problems,
            _ => &[],
        }
    }

    pub(crate) fn amqp(operation: impl Into<String>) -> impl FnOnce(lapin::Error) -> Error {
        let operation = operation.into();
        move |source| Error::Amqp { operation, source }
    }
}

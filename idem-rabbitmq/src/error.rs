//! The adapter's error type.

use std::time::Duration;

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
    /// A message could not be encoded.
    #[error("cannot encode the message: {0}")]
    Encode(#[source] serde_json::Error),
    /// The inbox refused a handler or its configuration.
    #[error(transparent)]
    Inbox(#[from] idem_runtime::Error),
    /// A setting cannot work.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// In-flight handlers did not finish within the shutdown deadline.
    #[error("{0} handlers were still running at the shutdown deadline of {1:?}")]
    ShutdownTimeout(usize, Duration),
}

impl Error {
    pub(crate) fn amqp(operation: impl Into<String>) -> impl FnOnce(lapin::Error) -> Error {
        let operation = operation.into();
        move |source| Error::Amqp { operation, source }
    }
}

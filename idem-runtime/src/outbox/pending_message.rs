//! A staged message as a relay takes it.

use std::collections::BTreeMap;
use std::time::Duration;

/// A staged message waiting to be published.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingMessage {
    /// Its place in the order of staging.
    pub seq: i64,
    /// The message id to publish it with.
    pub message_id: String,
    /// The destination exchange.
    pub exchange: String,
    /// The routing key.
    pub routing_key: String,
    /// The payload's content type.
    pub content_type: Option<String>,
    /// Its headers.
    pub headers: BTreeMap<String, String>,
    /// The payload.
    pub payload: Vec<u8>,
    /// How long ago it was staged, by the database's clock.
    pub age: Duration,
    /// The run whose messages go out in the order staged (a handler run, or a run named outside
    /// handlers, [`OutboxMessage::in_run`](crate::OutboxMessage::in_run)); `None` for a message
    /// of no run, ordered with no other.
    pub run: Option<String>,
}

impl PendingMessage {
    /// A message as a relay's own tests stage one: `seq` in the order of staging (its id too),
    /// to `exchange`, in `run` or none, with no routing key, headers or payload, staged just
    /// now. The fields are public, to set the others.
    pub fn new(seq: i64, exchange: impl Into<String>, run: Option<String>) -> Self {
        Self {
            seq,
            message_id: seq.to_string(),
            exchange: exchange.into(),
            routing_key: String::new(),
            content_type: None,
            headers: BTreeMap::new(),
            payload: Vec::new(),
            age: Duration::ZERO,
            run,
        }
    }
}

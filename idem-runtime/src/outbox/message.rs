//! A message to publish, staged in the outbox, and the ids that replay identically.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::fingerprint::Fingerprint;
use crate::key::InboxKey;

/// A message a handler (or any transaction) stages for the relay to publish: its destination,
/// its payload as bytes with their content type, and its headers.
///
/// ```
/// use idem_runtime::OutboxMessage;
/// # #[derive(serde::Serialize)] struct InvoiceIssued { order_id: String }
/// let event = OutboxMessage::json("billing.events", "invoice.issued", &InvoiceIssued {
///     order_id: "o-1".into(),
/// })?
/// .header("tenant", "acme");
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMessage {
    pub(crate) exchange: String,
    pub(crate) routing_key: String,
    pub(crate) payload: Vec<u8>,
    pub(crate) content_type: Option<String>,
    pub(crate) headers: BTreeMap<String, String>,
    pub(crate) message_id: Option<String>,
    /// The caller's key its id derives from ([`OutboxMessage::keyed`]).
    key: Option<String>,
    /// The run it goes out in order with, outside handlers ([`OutboxMessage::in_run`]).
    pub(crate) run: Option<String>,
}

impl OutboxMessage {
    /// A message of `payload` bytes to `exchange` (`""` for the default exchange) with
    /// `routing_key`.
    pub fn new(
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Self {
        Self {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            payload: payload.into(),
            content_type: None,
            headers: BTreeMap::new(),
            message_id: None,
            key: None,
            run: None,
        }
    }

    /// `payload` as JSON (`application/json`).
    ///
    /// # Errors
    ///
    /// The payload does not serialize as JSON.
    pub fn json<T: Serialize + ?Sized>(
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        payload: &T,
    ) -> Result<Self, serde_json::Error> {
        let bytes = serde_json::to_vec(payload)?;
        Ok(Self::new(exchange, routing_key, bytes).content_type("application/json"))
    }

    /// The payload's content type.
    pub fn content_type(mut self, content_type: impl Into<String>) -> Self {
        self.content_type = Some(content_type.into());
        self
    }

    /// With feature `otel`, the message carrying the current span's trace context
    /// (`traceparent`, `tracestate`) unless it carries one of its own; as it is without.
    pub(crate) fn with_current_trace(self) -> Self {
        #[cfg(feature = "otel")]
        {
            let mut message = self;
            if !message
                .headers
                .contains_key(crate::trace_context::TRACEPARENT)
            {
                for (name, value) in crate::trace_context::current_headers() {
                    message.headers.insert(name.to_owned(), value);
                }
            }
            message
        }
        #[cfg(not(feature = "otel"))]
        self
    }

    /// With feature `otel`, the message carrying the trace of the message whose `metadata` is
    /// given, through a span `idem.stage` that continues it (linked to the current span, a
    /// batch's), unless it carries a trace context of its own; as it is without.
    pub(crate) fn with_trace_of(self, metadata: &crate::metadata::Metadata) -> Self {
        #[cfg(feature = "otel")]
        {
            let span = tracing::info_span!("idem.stage");
            crate::trace_context::continue_message_trace(&span, metadata);
            span.in_scope(|| self.with_current_trace())
        }
        #[cfg(not(feature = "otel"))]
        {
            let _ = metadata;
            self
        }
    }

    /// A header (a string value).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// The message id, for a message staged outside a handler ([`Outbox::stage`]); a random one
    /// otherwise. A handler's staged messages get ids derived from its message (see
    /// [`Context::stage`]), whatever this says.
    ///
    /// [`Outbox::stage`]: crate::outbox::Outbox::stage
    /// [`Context::stage`]: crate::Context::stage
    pub fn message_id(mut self, id: impl Into<String>) -> Self {
        self.message_id = Some(id.into());
        self
    }

    /// The message id derived from `key`, a key of the caller's (an order's id, a request's
    /// `Idempotency-Key`), for a message staged outside a handler ([`Outbox::stage`]): staged
    /// again with the same key (a retry after an answer that never came), it is the same
    /// message, staged once and published with the same id. See [`OutboxMessage::keyed_id`].
    ///
    /// [`Outbox::stage`]: crate::outbox::Outbox::stage
    pub fn keyed(mut self, key: impl AsRef<str>) -> Self {
        let key = key.as_ref();
        self.message_id = Some(Self::keyed_id(key));
        self.key = Some(key.to_owned());
        self
    }

    /// The message id [`OutboxMessage::keyed`] derives from `key`: a UUID (version 8) of the
    /// first 16 bytes of SHA-256 over the key, the same in every process and every version.
    pub fn keyed_id(key: &str) -> String {
        let mut input = Vec::with_capacity(16 + key.len());
        input.extend_from_slice(b"idem-keyed\0");
        input.extend_from_slice(key.as_bytes());
        uuid_of(&input)
    }

    /// The run the message goes out in, outside handlers: the messages of one run are
    /// published in the order they were staged, and one the broker does not take holds back
    /// the rest of its run. Stage a run's messages one after the other, each transaction
    /// committed before the next stages; messages of different runs, and messages without a
    /// run, are not ordered with each other. (A handler's stagings are a run of their own.)
    pub fn in_run(mut self, run: impl Into<String>) -> Self {
        self.run = Some(run.into());
        self
    }

    /// The destination exchange.
    pub fn exchange_name(&self) -> &str {
        &self.exchange
    }

    /// The routing key.
    pub fn routing_key_name(&self) -> &str {
        &self.routing_key
    }

    /// Why this message cannot be staged: AMQP short strings hold 255 bytes, and a message's
    /// properties must fit in one frame (RabbitMQ's is 128 KiB by default; 4 KiB at least).
    pub(crate) fn problem(&self) -> Option<String> {
        let long = |what: &str, value: &str| {
            (value.len() > 255).then(|| format!("the {what} is longer than 255 bytes"))
        };
        long("exchange", &self.exchange)
            .or_else(|| long("routing key", &self.routing_key))
            .or_else(|| {
                self.content_type
                    .as_deref()
                    .and_then(|ct| long("content type", ct))
            })
            .or_else(|| {
                self.message_id
                    .as_deref()
                    .and_then(|id| long("message id", id))
            })
            .or_else(|| {
                self.message_id
                    .as_deref()
                    .is_some_and(str::is_empty)
                    .then(|| "the message id is empty".to_owned())
            })
            .or_else(|| {
                self.key
                    .as_deref()
                    .is_some_and(str::is_empty)
                    .then(|| "the key is empty".to_owned())
            })
            .or_else(|| self.run.as_deref().and_then(|run| long("run", run)))
            .or_else(|| {
                self.run
                    .as_deref()
                    .is_some_and(str::is_empty)
                    .then(|| "the run is empty".to_owned())
            })
            .or_else(|| {
                self.headers
                    .keys()
                    .find_map(|name| long("header name", name))
            })
            .or_else(|| {
                let size: usize = self.headers.iter().map(|(n, v)| n.len() + v.len()).sum();
                (size > MAX_HEADERS_SIZE)
                    .then(|| format!("the headers take {size} bytes, more than {MAX_HEADERS_SIZE}"))
            })
    }
}

/// The most bytes of header names and values a staged message may carry: within RabbitMQ's
/// default frame of 128 KiB, which the properties must fit in.
const MAX_HEADERS_SIZE: usize = 64 * 1024;

/// The id of the `position`-th message (counting from 0) that a run of `origin`'s handler
/// stages, or the `position`-th key it passes downstream: a UUID (version 8) made of the first
/// 16 bytes of SHA-256 over the consumer, the message key and the position. Every run of the
/// handler for that message, whichever worker, process or day, derives the same ids, so the next
/// hop's inbox recognises a re-sent message whatever became of this inbox's record.
pub fn derived_id(origin: &InboxKey, position: u32) -> String {
    let mut input = Vec::with_capacity(64);
    input.extend_from_slice(b"idem-derived\0");
    input.extend_from_slice(origin.consumer.as_str().as_bytes());
    input.push(0);
    input.extend_from_slice(origin.message_key.as_str().as_bytes());
    input.push(0);
    input.extend_from_slice(&position.to_be_bytes());
    uuid_of(&input)
}

/// A UUID (version 8) of the first 16 bytes of SHA-256 over `input`.
fn uuid_of(input: &[u8]) -> String {
    let hash = Fingerprint::of_bytes(input);
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&hash.as_bytes()[..16]);
    bytes[6] = (bytes[6] & 0x0f) | 0x80; // version 8: custom
    bytes[8] = (bytes[8] & 0x3f) | 0x80; // RFC 4122 variant
    uuid::Uuid::from_bytes(bytes).hyphenated().to_string()
}

/// What the outbox's `origin` column holds for a run: a handler's run, its consumer's length
/// and then its consumer and key (`14:billing.charge/o-1`: no two handler runs alike, whatever
/// their names hold), or a run named outside handlers, `run:<name>`; none for a message of no
/// run.
pub(crate) fn handler_run(origin: &InboxKey) -> String {
    let consumer = origin.consumer.as_str();
    format!("{}:{consumer}/{}", consumer.len(), origin.message_key)
}

/// See [`handler_run`].
pub(crate) fn named_run(name: &str) -> String {
    format!("run:{name}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{ConsumerName, MessageKey};

    fn key(consumer: &str, key: &str) -> InboxKey {
        InboxKey {
            consumer: ConsumerName::new(consumer).unwrap(),
            message_key: MessageKey::new(key).unwrap(),
        }
    }

    #[test]
    fn derived_ids_replay_identically_and_differ_by_each_part() {
        let a = derived_id(&key("billing", "o-1"), 0);
        assert_eq!(a, derived_id(&key("billing", "o-1"), 0));
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "8");
        for other in [
            derived_id(&key("billing", "o-1"), 1),
            derived_id(&key("billing", "o-2"), 0),
            derived_id(&key("billing2", "o-1"), 0),
            // The separators keep `(ab, c)` apart from `(a, bc)`.
            derived_id(&key("billin", "go-1"), 0),
        ] {
            assert_ne!(a, other);
        }
    }

    #[test]
    fn keyed_ids_and_runs_are_their_own() {
        let a = OutboxMessage::keyed_id("order-42");
        assert_eq!(a, OutboxMessage::keyed_id("order-42"));
        assert_ne!(a, OutboxMessage::keyed_id("order-43"));
        let message = OutboxMessage::new("x", "y", Vec::new()).keyed("order-42");
        assert_eq!(message.message_id.as_deref(), Some(a.as_str()));
        assert!(
            OutboxMessage::new("x", "y", Vec::new())
                .keyed("")
                .problem()
                .is_some()
        );
        assert!(
            OutboxMessage::new("x", "y", Vec::new())
                .in_run("")
                .problem()
                .is_some()
        );
        // A consumer holding the separator does not make two runs one.
        assert_ne!(handler_run(&key("a/b", "c")), handler_run(&key("a", "b/c")));
        assert_ne!(handler_run(&key("run", "x")), named_run("x"));
    }

    #[test]
    fn overlong_names_are_refused() {
        assert!(
            OutboxMessage::new("x", "y", b"z".to_vec())
                .problem()
                .is_none()
        );
        let long = "x".repeat(256);
        assert!(
            OutboxMessage::new(long.as_str(), "y", Vec::new())
                .problem()
                .is_some()
        );
        assert!(
            OutboxMessage::new("x", "y", Vec::new())
                .message_id("")
                .problem()
                .is_some()
        );
        // A header name is a short string too; all the headers must fit in a frame.
        let named = OutboxMessage::new("x", "y", Vec::new()).header(long.as_str(), "v");
        assert!(named.problem().is_some());
        let large = (0..3).fold(OutboxMessage::new("x", "y", Vec::new()), |message, n| {
            message.header(format!("h{n}"), "v".repeat(30 * 1024))
        });
        assert!(large.problem().is_some());
        let fine = OutboxMessage::new("x", "y", Vec::new()).header("h", "v".repeat(30 * 1024));
        assert!(fine.problem().is_none());
    }
}

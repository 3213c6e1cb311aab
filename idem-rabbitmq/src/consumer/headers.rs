//! The headers a dead-lettered message carries, besides its own.

/// The reason's stable code (`fingerprint-mismatch`, `undecodable`, `delivery-limit`, ...).
pub const REASON: &str = "x-idem-reason";
/// The reason in words.
pub const DETAIL: &str = "x-idem-detail";
/// The consumer that gave up.
pub const CONSUMER: &str = "x-idem-consumer";
/// The message key, when one could be read.
pub const KEY: &str = "x-idem-key";
/// The queue the message was consumed from.
pub const QUEUE: &str = "x-idem-queue";
/// When the consumer dead-lettered it, in milliseconds since the Unix epoch.
pub const DEAD_LETTERED_AT: &str = "x-idem-dead-lettered-at";
/// How many deliveries the message had.
pub const DELIVERIES: &str = "x-idem-deliveries";
/// The exchange the message was first published to; also on the fresh copies a quorum queue's
/// uncounted requeues put back through the default exchange.
pub const EXCHANGE: &str = "x-idem-exchange";
/// The routing key it was first published with, which its dead-letter copy is routed by (unless
/// the queue names a dead-letter routing key).
pub const ROUTING_KEY: &str = "x-idem-routing-key";

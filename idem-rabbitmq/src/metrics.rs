//! The names of the metrics idem-rabbitmq records, in one place.
//!
//! They go through the [`metrics`](https://docs.rs/metrics) facade, like idem-runtime's
//! (`idem_runtime::metrics`), to whatever recorder the application installs:
//!
//! | metric | kind | labels | what it counts |
//! |---|---|---|---|
//! | `idem_rabbitmq_deliveries_total` ([`DELIVERIES_TOTAL`]) | counter | `queue`, `settle` (`acked`, `duplicate`, `requeued`, `dead-lettered`, `dead-letter-failed`, `settle-lost`) | deliveries settled by a consumer |
//! | `idem_rabbitmq_connections_total` ([`CONNECTIONS_TOTAL`]) | counter | `connection` (its name), `node` (`host:port`) | connections opened to a broker node, reconnections included: which node each connection is on |
//! | `idem_outbox_published_total` ([`OUTBOX_PUBLISHED_TOTAL`]) | counter | `table` | outbox messages a relay published, confirmed by the broker |
//! | `idem_outbox_publish_failures_total` ([`OUTBOX_PUBLISH_FAILURES_TOTAL`]) | counter | `table`, `reason` (`unroutable`, `refused`, `no-confirm`, `channel`) | publishes the broker did not take |
//! | `idem_outbox_pending_age_seconds` ([`OUTBOX_PENDING_AGE_SECONDS`]) | gauge | `table` | the age of the oldest message in a relay's last batch (0 when none) |
//!
//! A steady `dead-letter-failed` deserves an alert: dead-letter copies the broker does not take,
//! so the messages go back to their queue instead; `settle-lost` counts settlements a dying
//! channel took with it (the broker redelivers those messages).

/// The counter of connections opened to a broker node, by connection name and node.
pub const CONNECTIONS_TOTAL: &str = "idem_rabbitmq_connections_total";

/// The counter of settled deliveries.
pub const DELIVERIES_TOTAL: &str = "idem_rabbitmq_deliveries_total";

/// The counter of outbox messages a [`Relay`](crate::Relay) published (confirmed by the
/// broker), by table.
pub const OUTBOX_PUBLISHED_TOTAL: &str = "idem_outbox_published_total";

/// The counter of outbox publishes the broker did not take, by table and reason
/// (`unroutable`, `refused`, `no-confirm`, `channel`).
pub const OUTBOX_PUBLISH_FAILURES_TOTAL: &str = "idem_outbox_publish_failures_total";

/// The gauge of the age, in seconds, of the oldest message in the last batch a
/// [`Relay`](crate::Relay) took (0 when it found none), by table.
pub const OUTBOX_PENDING_AGE_SECONDS: &str = "idem_outbox_pending_age_seconds";

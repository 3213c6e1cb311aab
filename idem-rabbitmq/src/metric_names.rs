//! The names of the metrics this crate records.

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

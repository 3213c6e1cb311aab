//! The names of the metrics idem-rabbitmq records, in one place.
//!
//! They go through the [`metrics`](https://docs.rs/metrics) facade, like idem-runtime's
//! (`idem_runtime::metrics`), to whatever recorder the application installs:
//!
//! | metric | kind | labels | what it counts |
//! |---|---|---|---|
//! | `idem_rabbitmq_deliveries_total` ([`DELIVERIES_TOTAL`]) | counter | `queue`, `settle` (`acked`, `duplicate`, `requeued`, `dead-lettered`, `dead-letter-failed`, `settle-lost`) | deliveries settled by a consumer |
//! | `idem_rabbitmq_dead_letters_total` ([`DEAD_LETTERS_TOTAL`]) | counter | `queue`, `reason` (the `x-idem-reason` code) | copies a consumer put in its dead-letter queue |
//! | `idem_rabbitmq_in_flight` ([`IN_FLIGHT`]) | gauge | `queue` | deliveries a consumer is processing or settling |
//! | `idem_rabbitmq_connected` ([`CONNECTED`]) | gauge | `queue` | 1 while a consumer's session of the queue is connected, 0 while it is lost |
//! | `idem_rabbitmq_connections_total` ([`CONNECTIONS_TOTAL`]) | counter | `connection` (its name), `node` (`host:port`) | connections opened to a broker node, reconnections included: which node each connection is on |
//! | `idem_outbox_published_total` ([`OUTBOX_PUBLISHED_TOTAL`]) | counter | `table` | outbox messages a relay published, confirmed by the broker |
//! | `idem_outbox_publish_failures_total` ([`OUTBOX_PUBLISH_FAILURES_TOTAL`]) | counter | `table`, `reason` (`unroutable`, `refused`, `no-confirm`, `channel`) | publishes the broker did not take |
//! | `idem_outbox_pending_age_seconds` ([`OUTBOX_PENDING_AGE_SECONDS`]) | gauge | `table` | the age of the oldest message not published yet (0 when none): from each batch a relay takes, and from the table every [`OUTBOX_PENDING_EVERY`] at most, also while the broker cannot be reached |
//! | `idem_outbox_pending` ([`OUTBOX_PENDING`]) | gauge | `table` | messages not published yet, held ones included, counted by a relay every [`OUTBOX_PENDING_EVERY`] at most |
//! | `idem_outbox_relay_connected` ([`OUTBOX_RELAY_CONNECTED`]) | gauge | `table` | 1 while a relay has a usable broker connection, 0 while it has none |
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

/// The gauge of the age, in seconds, of the oldest message not published yet (0 when none), by
/// table: set from each batch a [`Relay`](crate::Relay) takes, and from the table every
/// [`OUTBOX_PENDING_EVERY`] at most, also while the broker cannot be reached.
pub const OUTBOX_PENDING_AGE_SECONDS: &str = "idem_outbox_pending_age_seconds";

/// The counter of dead-letter copies a consumer published, by queue and reason (the
/// `x-idem-reason` code).
pub const DEAD_LETTERS_TOTAL: &str = "idem_rabbitmq_dead_letters_total";

/// The gauge of deliveries a consumer is processing or settling, by queue.
pub const IN_FLIGHT: &str = "idem_rabbitmq_in_flight";

/// The gauge of a consumer's session state, by queue: 1 connected, 0 lost.
pub const CONNECTED: &str = "idem_rabbitmq_connected";

/// The gauge of the messages of an outbox table not published yet (held ones included), by
/// table, as a [`Relay`](crate::Relay) last counted them.
pub const OUTBOX_PENDING: &str = "idem_outbox_pending";

/// How often, at most, a relay counts its table's pending messages.
pub const OUTBOX_PENDING_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// The gauge of a relay's broker connection, by table: 1 usable, 0 none.
pub const OUTBOX_RELAY_CONNECTED: &str = "idem_outbox_relay_connected";

/// Describes each metric above, and idem-runtime's, to the recorder installed now, so that an
/// exporter prints what it counts (Prometheus' `# HELP`). Starting a consumer or a relay calls
/// it; an application that installs its recorder later calls it again.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge};
    idem_runtime::metrics::describe();
    describe_counter!(
        CONNECTIONS_TOTAL,
        "Connections opened to a broker node, reconnections included, by connection and node."
    );
    describe_counter!(
        DELIVERIES_TOTAL,
        "Deliveries a consumer settled, by queue and settlement."
    );
    describe_counter!(
        OUTBOX_PUBLISHED_TOTAL,
        "Outbox messages a relay published and the broker confirmed, by table."
    );
    describe_counter!(
        OUTBOX_PUBLISH_FAILURES_TOTAL,
        "Outbox publishes the broker did not take, by table and reason."
    );
    describe_gauge!(
        OUTBOX_PENDING_AGE_SECONDS,
        metrics::Unit::Seconds,
        "The age of the oldest outbox message not published yet (0 when none), by table."
    );
    describe_counter!(
        DEAD_LETTERS_TOTAL,
        "Dead-letter copies a consumer published, by queue and reason."
    );
    describe_gauge!(
        IN_FLIGHT,
        "Deliveries a consumer is processing or settling, by queue."
    );
    describe_gauge!(
        CONNECTED,
        "1 while a consumer's session of the queue is connected, 0 while it is lost."
    );
    describe_gauge!(
        OUTBOX_PENDING,
        "Outbox messages not published yet, held ones included, by table."
    );
    describe_gauge!(
        OUTBOX_RELAY_CONNECTED,
        "1 while a relay has a usable broker connection, 0 while it has none, by table."
    );
}

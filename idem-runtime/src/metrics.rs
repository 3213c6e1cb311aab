//! The names of the metrics idem-runtime records, in one place.
//!
//! Metrics go through the [`metrics`](https://docs.rs/metrics) facade, so any recorder
//! (Prometheus, StatsD, ...) the application installs receives them:
//!
//! | metric | kind | labels | what it counts |
//! |---|---|---|---|
//! | `idem_messages_total` ([`MESSAGES_TOTAL`]) | counter | `consumer`, `outcome` (`processed`, `duplicate`, or the error's [`code`](crate::Error::code)) | messages processed |
//! | `idem_cleanup_deleted_total` ([`CLEANUP_DELETED_TOTAL`]) | counter | `table` | inbox records and sent outbox rows the cleaner deleted |
//! | `idem_outbox_staged_total` ([`OUTBOX_STAGED_TOTAL`]) | counter | `table` | outbox messages staged by handlers in committed transactions |
//! | `idem_duplicate_age_seconds` ([`DUPLICATE_AGE_SECONDS`]) | histogram | `consumer` | for each duplicate answered from its stored record, how long before its key's record was completed |
//! | `idem_late_duplicates_total` ([`LATE_DUPLICATES_TOTAL`]) | counter | `consumer` | copies processed again because their key's record had expired or been deleted (a deleted one recognised by the cleaner's digest, which errs on about 1.6 in a million fresh keys when full); registered at 0 when the consumer is first checked or seen |
//! | `idem_processing_duration_seconds` ([`PROCESSING_DURATION_SECONDS`]) | histogram | `consumer`, `outcome` | a message processed on its own, from its claim to its commit (the handler included) |
//! | `idem_batch_size` ([`BATCH_SIZE`]) | histogram | `consumer` | messages per batch transaction |
//! | `idem_batch_duration_seconds` ([`BATCH_DURATION_SECONDS`]) | histogram | `consumer` | a batch transaction, from its claims to its commit (the handlers included) |
//!
//! A rising `duplicate` rate points at producer retries, an acknowledgment window that is too
//! short or unhealthy consumers; any `fingerprint-mismatch` deserves an alert. Duplicate ages
//! that come close to a consumer's retention say it is too short: a copy that arrives after its
//! record was deleted is processed again. The transport's
//! and the relay's metrics are named in `idem_rabbitmq::metrics`.

/// The counter of processed messages, by consumer and outcome.
pub const MESSAGES_TOTAL: &str = "idem_messages_total";

/// The counter of records deleted by the cleaner, by table.
pub const CLEANUP_DELETED_TOTAL: &str = "idem_cleanup_deleted_total";

/// The counter of messages staged in committed transactions, by table.
pub const OUTBOX_STAGED_TOTAL: &str = "idem_outbox_staged_total";

/// The histogram of duplicates' ages (seconds since their key's record was completed), by
/// consumer.
pub const DUPLICATE_AGE_SECONDS: &str = "idem_duplicate_age_seconds";

/// The histogram of the time a message processed on its own took, from its claim to its commit
/// (its handler included), in seconds, by consumer and outcome.
pub const PROCESSING_DURATION_SECONDS: &str = "idem_processing_duration_seconds";

/// The histogram of the number of messages in each batch transaction, by consumer.
pub const BATCH_SIZE: &str = "idem_batch_size";

/// The histogram of the time a batch transaction took, from its claims to its commit (its
/// handlers included), in seconds, by consumer.
pub const BATCH_DURATION_SECONDS: &str = "idem_batch_duration_seconds";

/// The counter of late duplicates (copies processed again because their key's record had
/// expired or been deleted), by consumer; registered at 0 as soon as the consumer is known
/// ([`Processing::check_handler`](crate::transport::Processing::check_handler), or its first message), so that a
/// rate or `increase()` sees the first one.
pub const LATE_DUPLICATES_TOTAL: &str = "idem_late_duplicates_total";

/// Describes each metric above to the recorder installed now, so that an exporter prints what
/// it counts (Prometheus' `# HELP`). Building an inbox or an outbox calls it; an application
/// that installs its recorder later calls it again.
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_histogram};
    describe_counter!(
        MESSAGES_TOTAL,
        "Messages processed, by consumer and outcome (processed, duplicate, or the error's code)."
    );
    describe_counter!(
        CLEANUP_DELETED_TOTAL,
        "Inbox records and sent outbox rows the cleaner deleted, by table."
    );
    describe_counter!(
        OUTBOX_STAGED_TOTAL,
        "Outbox messages staged by handlers in committed transactions, by table."
    );
    describe_histogram!(
        DUPLICATE_AGE_SECONDS,
        Unit::Seconds,
        "For each duplicate answered from its record, how long before it the record was completed."
    );
    describe_histogram!(
        PROCESSING_DURATION_SECONDS,
        Unit::Seconds,
        "A message processed on its own, from its claim to its commit, handler included."
    );
    describe_histogram!(BATCH_SIZE, "Messages per batch transaction.");
    describe_histogram!(
        BATCH_DURATION_SECONDS,
        Unit::Seconds,
        "A batch transaction, from its claims to its commit, handlers included."
    );
    describe_counter!(
        LATE_DUPLICATES_TOTAL,
        "Copies processed again because their key's record had expired or been deleted."
    );
}

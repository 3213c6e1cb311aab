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

//! A consumer's settings, shared by its workers, and their defaults.

use std::time::Duration;

use idem_runtime::transport::Backoff;

use super::settle::RetryPolicy;
use crate::url::AmqpUrl;

/// Settings shared by a consumer's workers; each is set by the
/// [`ConsumerBuilder`](crate::ConsumerBuilder) method of its name.
#[derive(Debug)]
pub(crate) struct ConsumerSettings {
    pub(super) url: AmqpUrl,
    pub(super) connection_name: String,
    pub(super) prefetch: u16,
    pub(super) max_in_flight: usize,
    pub(super) shutdown_timeout: Duration,
    pub(super) recovery_timeout: Duration,
    pub(super) open_timeout: Duration,
    pub(super) retire_timeout: Duration,
    pub(super) reconnect_delay: Duration,
    /// `max_deliveries`, `retry_backoff` and `dead_letter_retry`.
    pub(super) retry: RetryPolicy,
    /// Whether the consumer runs the inbox's cleaner.
    pub(super) cleaner: bool,
}

impl ConsumerSettings {
    /// The defaults, for the broker at `url`.
    pub(super) fn new(url: AmqpUrl) -> Self {
        Self {
            url,
            connection_name: "idem".to_owned(),
            prefetch: 32,
            max_in_flight: 16,
            shutdown_timeout: Duration::from_secs(30),
            recovery_timeout: Duration::from_secs(30),
            open_timeout: Duration::from_secs(30),
            // A replaced connection can only come back through a reconnection already under
            // way when it was replaced: a handshake, seconds at most.
            retire_timeout: Duration::from_secs(60),
            reconnect_delay: Duration::from_secs(1),
            retry: RetryPolicy {
                max_deliveries: 10,
                backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(10)),
                // A dead-letter exchange that takes no copies is a configuration error an
                // operator must fix: a few quick retries ride out a passing refusal (a full
                // dead-letter queue), then one delivery a minute keeps the log loud without a
                // loop.
                dead_letter_attempts: 3,
                dead_letter_pause: Duration::from_secs(60),
            },
            // Expired records are deleted unless someone remembers to: the cleaner takes one
            // lock per table, so one process at a time works whatever runs it.
            cleaner: true,
        }
    }
}

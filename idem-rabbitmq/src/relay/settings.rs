//! A relay's settings, and their defaults.

use std::time::Duration;

use idem_runtime::transport::Backoff;

use crate::url::AmqpUrl;

/// Settings of a relay; each is set by the [`RelayBuilder`](crate::RelayBuilder) method of its
/// name.
#[derive(Debug)]
pub(crate) struct RelaySettings {
    pub(super) url: AmqpUrl,
    pub(super) connection_name: String,
    pub(super) batch_size: u32,
    pub(super) poll_interval: Duration,
    pub(super) confirm_timeout: Duration,
    pub(super) open_timeout: Duration,
    /// `retry_backoff`.
    pub(super) backoff: Backoff,
}

impl RelaySettings {
    /// The defaults, for the broker at `url`.
    pub(super) fn new(url: AmqpUrl) -> Self {
        Self {
            url,
            connection_name: "idem relay".to_owned(),
            // Enough to amortise a batch's transaction, few enough that a batch's locks are
            // short-lived and that other relays find work.
            batch_size: 100,
            // A fallback only: commits wake the relay, in this process and, on PostgreSQL, in
            // others; polling catches what a wake-up missed (another process on MySQL/MariaDB,
            // a notification lost with its connection).
            poll_interval: Duration::from_secs(1),
            // The publisher's: a broker that takes longer is in trouble.
            confirm_timeout: Duration::from_secs(10),
            // The consumer's.
            open_timeout: Duration::from_secs(30),
            // The consumer's retry back-off: quick for a passing failure, at most 10 s between
            // tries during an outage.
            backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(10)),
        }
    }
}

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
    /// `hold_backoff`.
    pub(super) holds: HoldTimes,
}

/// How long the relay holds back a message the broker refused, with the rest of its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HoldTimes {
    /// The first hold of a message the broker did not take (unroutable, negatively confirmed).
    pub(crate) not_taken: Duration,
    /// The first hold of a message whose publish closed the channel (its exchange missing or
    /// forbidden): longer, since an operator must act.
    pub(crate) channel_closed: Duration,
    /// The longest hold; each doubles the one before.
    pub(crate) max: Duration,
}

impl HoldTimes {
    /// Holds starting at `first` (a closed channel's at six times as long), at most `max`.
    pub(crate) fn new(first: Duration, max: Duration) -> Self {
        Self {
            not_taken: first.min(max),
            channel_closed: first.saturating_mul(6).min(max),
            max,
        }
    }
}

impl Default for HoldTimes {
    /// 5 s at first (30 s for a closed channel), doubling, at most 5 minutes.
    fn default() -> Self {
        Self::new(Duration::from_secs(5), Duration::from_secs(300))
    }
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
            holds: HoldTimes::default(),
        }
    }
}

//! How long completed records are kept, and the check that it is long enough.

use std::collections::HashMap;
use std::time::Duration;

use crate::error::ConfigError;

/// How long inbox records are kept and how the cleaner deletes them.
///
/// A record must outlive every redelivery of its message: delete it too early and a late
/// redelivery is processed again. Check a policy against the broker's [`RedeliveryWindow`] with
/// [`RetentionPolicy::validate`] (the [`InboxBuilder`](crate::InboxBuilder) does it at start-up
/// when given a window).
///
/// ```
/// use std::time::Duration;
/// use idem_runtime::RetentionPolicy;
/// use idem_runtime::retention::RedeliveryWindow;
///
/// let day = Duration::from_secs(24 * 3600);
/// let policy = RetentionPolicy::default()          // 7 days
///     .with_consumer("billing", 30 * day)          // invoices can be resubmitted late
///     .with_batch_size(5_000);
/// let window = RedeliveryWindow::new(10, Duration::from_secs(30))
///     .with_dead_letter_resubmission(3 * day);
/// policy.validate(&window).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionPolicy {
    default: Duration,
    per_consumer: HashMap<String, Duration>,
    cleanup_interval: Duration,
    batch_size: u32,
    pause_between_batches: Duration,
    max_busy_percent: u8,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        Self {
            default: Self::DEFAULT_RETENTION,
            per_consumer: HashMap::new(),
            cleanup_interval: Duration::from_secs(60),
            batch_size: 1_000,
            pause_between_batches: Duration::from_millis(10),
            max_busy_percent: 20,
        }
    }
}

impl RetentionPolicy {
    /// How long records are kept when nothing else is said: 7 days.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

    /// A policy keeping records for `retention` unless a consumer says otherwise.
    pub fn new(retention: Duration) -> Self {
        Self {
            default: retention,
            ..Self::default()
        }
    }

    /// Keeps `consumer`'s records for `retention`, whatever its handler or the default say.
    pub fn with_consumer(mut self, consumer: impl Into<String>, retention: Duration) -> Self {
        self.per_consumer.insert(consumer.into(), retention);
        self
    }

    /// How often the cleaner looks for expired records (default one minute).
    pub fn with_cleanup_interval(mut self, interval: Duration) -> Self {
        self.cleanup_interval = interval;
        self
    }

    /// How many records one cleanup transaction deletes at most (default 1 000).
    pub fn with_batch_size(mut self, batch_size: u32) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// How long the cleaner waits between two batches, leaving room to consumers (default 10 ms).
    pub fn with_pause_between_batches(mut self, pause: Duration) -> Self {
        self.pause_between_batches = pause;
        self
    }

    /// The most of its time the cleaner spends deleting, in percent (default 20): after a batch
    /// that took `t`, it rests `t × (100 − percent) / percent`, and at least the pause between
    /// batches, so that on a busy database it slows down with the database instead of taking
    /// it from the consumers and the relay. 100 rests the pause only; values above 100 are 100.
    pub fn with_max_busy_percent(mut self, percent: u8) -> Self {
        self.max_busy_percent = percent.min(100);
        self
    }

    /// The default retention.
    pub fn default_retention(&self) -> Duration {
        self.default
    }

    /// The retention of `consumer`'s records: its override in this policy, else what its handler
    /// asks for, else the default.
    pub fn retention_for(&self, consumer: &str, handler_retention: Option<Duration>) -> Duration {
        self.per_consumer
            .get(consumer)
            .copied()
            .or(handler_retention)
            .unwrap_or(self.default)
    }

    /// How often the cleaner runs.
    pub fn cleanup_interval(&self) -> Duration {
        self.cleanup_interval
    }

    /// The cleaner's batch size.
    pub fn batch_size(&self) -> u32 {
        self.batch_size
    }

    /// The cleaner's pause between batches.
    pub fn pause_between_batches(&self) -> Duration {
        self.pause_between_batches
    }

    /// The most of its time the cleaner spends deleting, in percent.
    pub fn max_busy_percent(&self) -> u8 {
        self.max_busy_percent
    }

    /// How long the cleaner rests after a batch that took `busy`.
    pub(crate) fn rest_after(&self, busy: Duration) -> Duration {
        let percent = u32::from(self.max_busy_percent.max(1));
        let rest = busy * (100 - percent) / percent;
        rest.max(self.pause_between_batches)
    }

    /// Checks that every retention covers `window` and that the cleaner's settings are usable.
    pub fn validate(&self, window: &RedeliveryWindow) -> Result<(), ConfigError> {
        self.validate_settings()?;
        let required = window.duration();
        check_covers("the default", self.default, required)?;
        for (consumer, retention) in &self.per_consumer {
            check_covers(consumer, *retention, required)?;
        }
        Ok(())
    }

    /// Checks the settings that must be positive.
    pub(crate) fn validate_settings(&self) -> Result<(), ConfigError> {
        if self.default.is_zero() || self.per_consumer.values().any(Duration::is_zero) {
            return Err(ConfigError::Zero("retention"));
        }
        if self.cleanup_interval.is_zero() {
            return Err(ConfigError::Zero("cleanup interval"));
        }
        if self.batch_size == 0 {
            return Err(ConfigError::Zero("cleanup batch size"));
        }
        if self.max_busy_percent == 0 {
            return Err(ConfigError::Zero("the cleaner's busy percentage"));
        }
        Ok(())
    }
}

pub(crate) fn check_covers(
    consumer: &str,
    retention: Duration,
    window: Duration,
) -> Result<(), ConfigError> {
    if retention < window {
        return Err(ConfigError::RetentionTooShort {
            consumer: consumer.to_owned(),
            retention,
            window,
        });
    }
    Ok(())
}

/// How long after its first delivery a broker may still deliver a message again.
///
/// The window is the longest of (max delivery attempts × lock or visibility timeout) and the
/// message TTL, plus the time within which an operator may resubmit it from the dead-letter
/// queue. Inbox records must be kept at least that long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedeliveryWindow {
    /// How many times the broker delivers a message before dead-lettering it.
    pub max_delivery_attempts: u32,
    /// How long a delivery may stay unsettled before the broker redelivers it (RabbitMQ's
    /// consumer timeout, Service Bus's lock duration, SQS's visibility timeout).
    pub lock_timeout: Duration,
    /// The message time-to-live, if the queue has one.
    pub message_ttl: Option<Duration>,
    /// How long after dead-lettering an operator may resubmit a message.
    pub dead_letter_resubmission: Duration,
}

impl RedeliveryWindow {
    /// A window of `max_delivery_attempts` × `lock_timeout`, without TTL or resubmission.
    pub fn new(max_delivery_attempts: u32, lock_timeout: Duration) -> Self {
        Self {
            max_delivery_attempts,
            lock_timeout,
            message_ttl: None,
            dead_letter_resubmission: Duration::ZERO,
        }
    }

    /// Sets the message TTL.
    pub fn with_message_ttl(mut self, ttl: Duration) -> Self {
        self.message_ttl = Some(ttl);
        self
    }

    /// Sets the dead-letter resubmission horizon.
    pub fn with_dead_letter_resubmission(mut self, horizon: Duration) -> Self {
        self.dead_letter_resubmission = horizon;
        self
    }

    /// The whole window a retention must cover.
    pub fn duration(&self) -> Duration {
        let attempts = self.lock_timeout.saturating_mul(self.max_delivery_attempts);
        let on_queue = attempts.max(self.message_ttl.unwrap_or_default());
        on_queue.saturating_add(self.dead_letter_resubmission)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);
    const DAY: Duration = Duration::from_secs(24 * 3600);

    #[test]
    fn window_is_the_longest_stay_plus_resubmission() {
        let w = RedeliveryWindow::new(5, HOUR);
        assert_eq!(w.duration(), 5 * HOUR);
        assert_eq!(w.with_message_ttl(DAY).duration(), DAY);
        assert_eq!(
            w.with_message_ttl(DAY)
                .with_dead_letter_resubmission(2 * DAY)
                .duration(),
            3 * DAY
        );
    }

    #[test]
    fn too_short_a_retention_is_refused_by_name() {
        let window = RedeliveryWindow::new(5, HOUR).with_dead_letter_resubmission(6 * DAY);
        assert!(RetentionPolicy::default().validate(&window).is_ok());
        let err = RetentionPolicy::default()
            .with_consumer("audit", DAY)
            .validate(&window)
            .unwrap_err();
        assert!(
            matches!(&err, ConfigError::RetentionTooShort { consumer, .. } if consumer == "audit")
        );
        assert!(
            RetentionPolicy::new(HOUR)
                .validate(&RedeliveryWindow::new(3, HOUR))
                .is_err()
        );
    }

    #[test]
    fn per_consumer_override_beats_handler_and_default() {
        let policy = RetentionPolicy::new(DAY).with_consumer("a", HOUR);
        assert_eq!(policy.retention_for("a", Some(2 * DAY)), HOUR);
        assert_eq!(policy.retention_for("b", Some(2 * DAY)), 2 * DAY);
        assert_eq!(policy.retention_for("b", None), DAY);
        assert_eq!(
            RetentionPolicy::default()
                .with_batch_size(0)
                .validate_settings(),
            Err(ConfigError::Zero("cleanup batch size"))
        );
    }

    #[test]
    fn the_cleaner_rests_in_proportion_to_its_work() {
        let ms = Duration::from_millis;
        let policy = RetentionPolicy::default();
        // 20 % busy: four times as long resting as deleting, at least the 10 ms pause.
        assert_eq!(policy.rest_after(ms(50)), ms(200));
        assert_eq!(policy.rest_after(ms(1)), ms(10));
        let eager = RetentionPolicy::default().with_max_busy_percent(200);
        assert_eq!(eager.max_busy_percent(), 100);
        assert_eq!(eager.rest_after(ms(50)), ms(10));
        assert_eq!(
            RetentionPolicy::default()
                .with_max_busy_percent(0)
                .validate_settings(),
            Err(ConfigError::Zero("the cleaner's busy percentage"))
        );
    }
}

//! How deliveries ended: one label per ending, and the consumer's counts of them.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::metrics::{CONNECTED, IN_FLIGHT};

/// How a delivery ended, for metrics and stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Processed and acknowledged.
    Acked,
    /// A duplicate, acknowledged.
    Duplicate,
    /// Back on the queue for a later attempt.
    Requeued,
    /// Published to the dead-letter exchange and acknowledged.
    DeadLettered,
    /// Its dead-letter copy was not taken: it went back to the queue.
    DeadLetterFailed,
    /// The channel died before the settlement reached the broker, which redelivers the message.
    Lost,
}

impl Ending {
    /// Whether the message left the queue.
    pub(crate) fn is_final(self) -> bool {
        matches!(
            self,
            Ending::Acked | Ending::Duplicate | Ending::DeadLettered
        )
    }

    /// The ending's name, in metrics and traces.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Ending::Acked => "acked",
            Ending::Duplicate => "duplicate",
            Ending::Requeued => "requeued",
            Ending::DeadLettered => "dead-lettered",
            Ending::DeadLetterFailed => "dead-letter-failed",
            Ending::Lost => "settle-lost",
        }
    }
}

/// Counts of settled deliveries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliveryStats {
    /// Processed and acknowledged.
    pub acked: u64,
    /// Duplicates acknowledged without running the handler.
    pub duplicates: u64,
    /// Requeued for a later attempt.
    pub requeued: u64,
    /// Moved to the dead-letter queue.
    pub dead_lettered: u64,
    /// Dead-letter copies the broker did not take (no queue bound for their routing key, a full
    /// dead-letter queue...); their messages went back to the queue.
    pub dead_letter_failed: u64,
    /// Settlements that did not reach the broker because the channel died; the broker
    /// redelivers those messages.
    pub settle_lost: u64,
    /// Connection losses that lapin's automatic recovery repaired.
    pub recoveries: u64,
    /// Connections replaced by new ones, after a loss that was not recovered in time.
    pub reconnections: u64,
    /// Attempts to replace them that failed (the broker unreachable or silent, a queue or
    /// exchange it now refuses to declare); each is logged at `warn` with its error, and the
    /// next one is made after a back-off. A count that grows while `reconnections` does not
    /// means a binding is not consuming.
    pub failed_reconnections: u64,
}

/// The consumer's counts as they grow, shared by its workers and jobs.
#[derive(Debug, Default)]
pub(crate) struct ConsumerCounters {
    acked: AtomicU64,
    duplicates: AtomicU64,
    requeued: AtomicU64,
    dead_lettered: AtomicU64,
    dead_letter_failed: AtomicU64,
    settle_lost: AtomicU64,
    pub(crate) recoveries: AtomicU64,
    pub(crate) reconnections: AtomicU64,
    pub(crate) failed_reconnections: AtomicU64,
}

impl ConsumerCounters {
    /// Counts a delivery that ended as `ending` says.
    pub(crate) fn count(&self, ending: Ending) {
        let counter = match ending {
            Ending::Acked => &self.acked,
            Ending::Duplicate => &self.duplicates,
            Ending::Requeued => &self.requeued,
            Ending::DeadLettered => &self.dead_lettered,
            Ending::DeadLetterFailed => &self.dead_letter_failed,
            Ending::Lost => &self.settle_lost,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far.
    pub(crate) fn snapshot(&self) -> DeliveryStats {
        DeliveryStats {
            acked: self.acked.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            requeued: self.requeued.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            dead_letter_failed: self.dead_letter_failed.load(Ordering::Relaxed),
            settle_lost: self.settle_lost.load(Ordering::Relaxed),
            recoveries: self.recoveries.load(Ordering::Relaxed),
            reconnections: self.reconnections.load(Ordering::Relaxed),
            failed_reconnections: self.failed_reconnections.load(Ordering::Relaxed),
        }
    }
}

/// Deliveries of a queue in flight, on the [`IN_FLIGHT`] gauge for as long as it lives.
pub(crate) struct InFlight {
    queue: String,
    count: f64,
}

impl InFlight {
    /// Counts `count` deliveries of `queue` in flight.
    pub(crate) fn new(queue: &str, count: usize) -> Self {
        let count = count as f64;
        metrics::gauge!(IN_FLIGHT, "queue" => queue.to_owned()).increment(count);
        Self {
            queue: queue.to_owned(),
            count,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        metrics::gauge!(IN_FLIGHT, "queue" => std::mem::take(&mut self.queue))
            .decrement(self.count);
    }
}

/// Sets the [`CONNECTED`] gauge of `queue`'s session.
pub(crate) fn gauge_connected(queue: &str, connected: bool) {
    metrics::gauge!(CONNECTED, "queue" => queue.to_owned()).set(f64::from(u8::from(connected)));
}

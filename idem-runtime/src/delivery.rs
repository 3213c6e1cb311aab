//! The delivery policy, shared by every transport: what counts as a failed attempt, when an
//! error is an outage, how back-off grows, and when a message is given up on.
//!
//! A transport (the RabbitMQ consumer, an outbox relay, another broker) asks [`DeliveryPolicy`]
//! what to do with a delivery that could not be acknowledged and maps the [`Decision`] onto its
//! protocol: a requeue after a wait, counted or not against the message's delivery limit, or a
//! dead-letter with a reason. It keeps one [`RetryMemory`] per consumer, which remembers what the
//! policy needs between deliveries.
//!
//! ```
//! use std::time::Duration;
//! use idem_runtime::transport::{Backoff, Decision, DeliveryPolicy, Retry, RetryMemory};
//!
//! let policy = DeliveryPolicy::new(3, Backoff::new(Duration::from_millis(100), Duration::from_secs(5)));
//! let memory = RetryMemory::default();
//! // The handler failed on the first and second deliveries: requeued, counted, waiting longer.
//! assert_eq!(
//!     policy.decide(&memory, "m-1", Retry::Failed, 1, "handler-error", "boom"),
//!     Decision::Requeue { counted: true, after: Duration::from_millis(100) },
//! );
//! assert_eq!(
//!     policy.decide(&memory, "m-1", Retry::Failed, 2, "handler-error", "boom"),
//!     Decision::Requeue { counted: true, after: Duration::from_millis(200) },
//! );
//! // The third was its last.
//! assert!(matches!(
//!     policy.decide(&memory, "m-1", Retry::Failed, 3, "handler-error", "boom"),
//!     Decision::GiveUp(reason) if reason.code == "delivery-limit"
//! ));
//! ```

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use sea_orm::DbErr;

use crate::error::{DeadLetterReason, Error};
use crate::store::dialect::takes_no_writes;

/// A delay that doubles from `base` with each try, capped at `max`: the one back-off every retry
/// loop of idem uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    max: Duration,
}

impl Backoff {
    /// Doubling from `base`, never more than `max`.
    pub const fn new(base: Duration, max: Duration) -> Self {
        Self { base, max }
    }

    /// The first delay.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The longest delay.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The wait after the `n`-th try (counting from 1): `base`, `2 × base`, `4 × base`, ... up
    /// to `max`.
    pub fn after(&self, n: u32) -> Duration {
        // Past 32 doublings every delay is the cap.
        let index = n.saturating_sub(1).min(32) as usize;
        self.delays().nth(index).unwrap_or(self.max)
    }

    /// The waits after each try, without end.
    pub fn delays(&self) -> impl Iterator<Item = Duration> + use<> {
        ExponentialBuilder::new()
            .with_min_delay(self.base)
            .with_max_delay(self.max)
            .with_factor(2.0)
            .without_max_times()
            .build()
            // backon multiplies in `f32`: round its nanoseconds off to whole microseconds.
            .map({
                let max = self.max;
                move |delay| {
                    let micros = (delay.as_nanos() + 500) / 1000;
                    Duration::from_micros(u64::try_from(micros).unwrap_or(u64::MAX)).min(max)
                }
            })
    }
}

/// Why a delivery goes back to its queue, which decides its wait and whether it counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Processing failed: the delivery counts toward the delivery limit, and the back-off grows
    /// with the message's deliveries.
    Failed,
    /// Another worker holds the message's key for about this much longer, or other
    /// transactions held the database up. Not counted: the lease and its takeovers bound this
    /// wait.
    Claimed(Duration),
    /// The inbox database is unreachable. Not counted, since the message is not at fault; the
    /// back-off grows with the outage, for every message of the consumer.
    StoreUnavailable,
    /// No pooled connection came in time: the database is down, or every connection is busy.
    /// Not counted, since the message never reached the database, even while others do (a
    /// saturated pool); paced like an outage.
    NoConnection,
    /// The database took no writes: a read-only server (a standby, a failover's demoted primary
    /// still in the pool), no connection slot left. Not counted, even while other deliveries
    /// reach the database (on connections to the new primary, say): no message causes it.
    /// Paced like an outage.
    NoWrites,
}

impl Retry {
    /// The retry an inbox error that settles as a requeue calls for.
    pub fn of(error: &Error) -> Self {
        match error {
            Error::InProgressElsewhere { remaining, .. } => Retry::Claimed(*remaining),
            Error::StoreUnavailable(DbErr::ConnectionAcquire(_)) => Retry::NoConnection,
            Error::StoreUnavailable(error) if takes_no_writes(error) => Retry::NoWrites,
            error if error.is_store_unavailable() => Retry::StoreUnavailable,
            error if !error.counts_as_attempt() => Retry::Claimed(Duration::ZERO),
            _ => Retry::Failed,
        }
    }

    /// Whether the delivery counts toward the message's delivery limit.
    pub fn counted(self) -> bool {
        self == Retry::Failed
    }
}

/// What to do with a delivery that was not acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Put it back on its queue after `after`.
    Requeue {
        /// Whether this delivery counts toward the message's delivery limit: a transport whose
        /// broker counts requeues itself must requeue an uncounted one in a way it does not count
        /// (a fresh copy on RabbitMQ quorum queues before 4.3).
        counted: bool,
        /// How long to wait first; the transport should give back the message's processing slot
        /// meanwhile.
        after: Duration,
    },
    /// It was the message's last attempt: dead-letter it with this reason.
    GiveUp(DeadLetterReason),
}

/// How many times a message may fail, and how long it waits between tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryPolicy {
    max_deliveries: u32,
    backoff: Backoff,
}

impl DeliveryPolicy {
    /// A message is given up on after its `max_deliveries`-th failed delivery; requeues wait by
    /// `backoff`.
    pub const fn new(max_deliveries: u32, backoff: Backoff) -> Self {
        Self {
            max_deliveries,
            backoff,
        }
    }

    /// The failed deliveries after which a message is given up on.
    pub fn max_deliveries(&self) -> u32 {
        self.max_deliveries
    }

    /// The back-off between requeues.
    pub fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// Decides for the `deliveries`-th delivery (counting from 1) of the message `identity`,
    /// which was not acknowledged for `retry`; `code` and `detail` are its error, for the reason
    /// given when it is given up on. Notes what it must remember in `memory`.
    pub fn decide(
        &self,
        memory: &RetryMemory,
        identity: &str,
        retry: Retry,
        deliveries: u32,
        code: &str,
        detail: &str,
    ) -> Decision {
        let retry = match retry {
            // Other deliveries reached the database since this message last found it
            // unreachable: the error is the message's own (a statement the server kills, say),
            // which must not be requeued unbounded.
            Retry::StoreUnavailable if memory.unreachable_only_for(identity) => Retry::Failed,
            Retry::Claimed(_) => {
                memory.store_reached();
                retry
            }
            _ => retry,
        };
        if retry.counted() && deliveries >= self.max_deliveries {
            return Decision::GiveUp(DeadLetterReason::new(
                "delivery-limit",
                format!("gave up after {deliveries} deliveries; last error ({code}): {detail}"),
            ));
        }
        if retry.counted() {
            memory.set_failed(identity, deliveries);
        }
        let after = match retry {
            Retry::Failed => self.backoff.after(deliveries),
            Retry::Claimed(remaining) => {
                remaining.clamp(self.backoff.after(deliveries), self.backoff.max())
            }
            Retry::StoreUnavailable | Retry::NoConnection | Retry::NoWrites => {
                self.backoff.after(memory.outage_continues())
            }
        };
        Decision::Requeue {
            counted: retry.counted(),
            after,
        }
    }
}

/// What a consumer remembers between deliveries to pace its retries: per requeued message, its
/// failed deliveries (for a broker that does not count them) and when it last found the database
/// unreachable; and how long the database has been unreachable.
#[derive(Debug, Default)]
pub struct RetryMemory {
    /// Per message. Bounded: a process that sees too many forgets them all.
    messages: Mutex<HashMap<String, MessageRetries>>,
    /// Deliveries requeued in a row because the database was unreachable; reset by any delivery
    /// that reached it.
    outage: AtomicU32,
    /// Deliveries that reached the database, ever: the clock that tells an outage from an error
    /// only one message meets.
    reached: AtomicU64,
}

/// What is remembered of one requeued message.
#[derive(Debug, Default, Clone, Copy)]
struct MessageRetries {
    failed: u32,
    unreachable_at: Option<u64>,
    copy_failures: u32,
}

impl RetryMemory {
    const MAX_TRACKED: usize = 100_000;

    fn update<T>(&self, identity: &str, change: impl FnOnce(&mut MessageRetries) -> T) -> T {
        let mut messages = self.messages.lock().unwrap_or_else(|e| e.into_inner());
        if messages.len() >= Self::MAX_TRACKED && !messages.contains_key(identity) {
            messages.clear();
        }
        change(messages.entry(identity.to_owned()).or_default())
    }

    /// The failed deliveries remembered for the message.
    pub fn failed(&self, identity: &str) -> u32 {
        let messages = self.messages.lock().unwrap_or_else(|e| e.into_inner());
        messages.get(identity).map_or(0, |message| message.failed)
    }

    fn set_failed(&self, identity: &str, deliveries: u32) {
        self.update(identity, |message| message.failed = deliveries);
    }

    /// Notes a copy of the message the transport could not hand over (a dead-letter copy the
    /// broker did not take); returns how many so far.
    pub fn copy_failed(&self, identity: &str) -> u32 {
        self.update(identity, |message| {
            message.copy_failures = message.copy_failures.saturating_add(1);
            message.copy_failures
        })
    }

    /// Forgets a message that left the queue. Cheap when nothing is remembered, as for almost
    /// every acknowledged delivery.
    pub fn forget(&self, identity: impl FnOnce() -> String) {
        let mut messages = self.messages.lock().unwrap_or_else(|e| e.into_inner());
        if !messages.is_empty() {
            messages.remove(&identity());
        }
    }

    /// Notes a delivery that reached the database (processed, a duplicate, held elsewhere).
    pub fn store_reached(&self) {
        self.reached.fetch_add(1, Ordering::Relaxed);
        if self.outage.load(Ordering::Relaxed) != 0 {
            self.outage.store(0, Ordering::Relaxed);
        }
    }

    /// Notes that the message found the database unreachable; returns whether other deliveries
    /// reached it since the message last did so, which makes the error the message's own.
    fn unreachable_only_for(&self, identity: &str) -> bool {
        let now = self.reached.load(Ordering::Relaxed);
        let before = self.update(identity, |message| message.unreachable_at.replace(now));
        before.is_some_and(|before| before != now)
    }

    /// Notes one more delivery requeued for an unreachable database; returns how many in a row.
    fn outage_continues(&self) -> u32 {
        self.outage
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn policy() -> DeliveryPolicy {
        DeliveryPolicy::new(5, Backoff::new(100 * MS, 1_000 * MS))
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let backoff = Backoff::new(100 * MS, 1_000 * MS);
        let waits: Vec<_> = (1..=6).map(|n| backoff.after(n)).collect();
        assert_eq!(
            waits,
            [
                100 * MS,
                200 * MS,
                400 * MS,
                800 * MS,
                1_000 * MS,
                1_000 * MS
            ]
        );
        assert_eq!(backoff.after(0), 100 * MS);
        assert_eq!(backoff.after(u32::MAX), 1_000 * MS);
    }

    #[test]
    fn a_claim_held_elsewhere_waits_about_its_lease_and_is_never_counted() {
        let memory = RetryMemory::default();
        for deliveries in [1, 10, 100] {
            match policy().decide(&memory, "m", Retry::Claimed(300 * MS), deliveries, "c", "d") {
                Decision::Requeue { counted, after } => {
                    assert!(!counted);
                    assert!(after >= 100 * MS && after <= 1_000 * MS, "{after:?}");
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn an_outage_is_not_counted_and_its_back_off_grows_for_every_message() {
        let memory = RetryMemory::default();
        let after = |identity| match policy().decide(
            &memory,
            identity,
            Retry::StoreUnavailable,
            100,
            "database-unavailable",
            "down",
        ) {
            Decision::Requeue {
                counted: false,
                after,
            } => after,
            other => panic!("{other:?}"),
        };
        assert_eq!(after("a"), 100 * MS);
        assert_eq!(after("b"), 200 * MS);
        // A delivery reaching the database ends the outage.
        memory.store_reached();
        assert_eq!(after("c"), 100 * MS);
    }

    #[test]
    fn an_unreachable_database_counts_once_other_deliveries_reach_it() {
        let memory = RetryMemory::default();
        let decide = || policy().decide(&memory, "m", Retry::StoreUnavailable, 5, "c", "d");
        assert!(matches!(decide(), Decision::Requeue { counted: false, .. }));
        // Others got through meanwhile: this message's error is its own, and at its limit.
        memory.store_reached();
        assert!(matches!(decide(), Decision::GiveUp(_)));
    }

    #[test]
    fn no_pooled_connection_is_never_counted_even_while_others_reach_the_database() {
        let memory = RetryMemory::default();
        let decide = || policy().decide(&memory, "m", Retry::NoConnection, 5, "c", "d");
        assert!(matches!(decide(), Decision::Requeue { counted: false, .. }));
        // A saturated pool: others got a connection meanwhile; this message never reached it.
        memory.store_reached();
        assert!(matches!(decide(), Decision::Requeue { counted: false, .. }));
        let timed_out = Error::from(sea_orm::DbErr::ConnectionAcquire(
            sea_orm::ConnAcquireErr::Timeout,
        ));
        assert_eq!(Retry::of(&timed_out), Retry::NoConnection);
    }

    #[test]
    fn errors_map_to_their_retry() {
        let key = crate::key::InboxKey {
            consumer: crate::key::ConsumerName::new("c").unwrap(),
            message_key: crate::MessageKey::new("k").unwrap(),
        };
        let held = Error::InProgressElsewhere {
            key,
            remaining: 7 * MS,
        };
        assert_eq!(Retry::of(&held), Retry::Claimed(7 * MS));
        let down = Error::from(sea_orm::DbErr::Conn(sea_orm::RuntimeErr::Internal(
            "refused".into(),
        )));
        assert_eq!(Retry::of(&down), Retry::StoreUnavailable);
        let failed = Error::Handler {
            source: "no".into(),
            permanent: false,
        };
        assert_eq!(Retry::of(&failed), Retry::Failed);
    }
}

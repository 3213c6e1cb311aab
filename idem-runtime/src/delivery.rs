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
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

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
            // Since this message last found the database unreachable, other deliveries reached
            // it, and one did just before this failure began: the error is the message's own (a
            // statement the server kills, say), which must not be requeued unbounded.
            Retry::StoreUnavailable if memory.unreachable_only_for(identity) => Retry::Failed,
            Retry::Claimed(_) => {
                memory.store_reached();
                retry
            }
            Retry::NoConnection | Retry::NoWrites => {
                memory.note_unreachable();
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
/// unreachable; how long the database has been unreachable; how many deliveries reached it,
/// ever, and since when the deliveries find it unreachable.
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
    /// When deliveries began to find the database unreachable, if the last delivery that told
    /// found it so; `None` while the last one reached it.
    unreachable_since: Mutex<Option<Instant>>,
    /// Whether `unreachable_since` is set: spares the deliveries that reach the database its
    /// lock.
    unreachable: AtomicBool,
}

/// Deliveries that find the database unreachable within this of the first one after a delivery
/// that reached it met one failure: a batch's deliveries, lost with its connection, all do.
pub(crate) const SAME_FAILURE: Duration = Duration::from_millis(100);

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
        // Read first: almost every delivery reaches the database, and needs no write here.
        if self.unreachable.load(Ordering::Relaxed)
            && self.unreachable.swap(false, Ordering::Relaxed)
        {
            *(self.unreachable_since.lock()).unwrap_or_else(|e| e.into_inner()) = None;
        }
        if self.outage.load(Ordering::Relaxed) != 0 {
            self.outage.store(0, Ordering::Relaxed);
        }
    }

    /// Notes that the message found the database unreachable; returns whether other deliveries
    /// reached it since the message last did so, and reached it just before this failure (the
    /// last delivery before it, or before the first of its batch, [`SAME_FAILURE`]), which makes
    /// the error the message's own. A database that comes and goes is found unreachable by the
    /// deliveries before this one too, and does not count against it.
    fn unreachable_only_for(&self, identity: &str) -> bool {
        let now = self.reached.load(Ordering::Relaxed);
        let just_reached = self.note_unreachable();
        let before = self.update(identity, |message| message.unreachable_at.replace(now));
        just_reached && before.is_some_and(|before| before != now)
    }

    /// Notes a delivery that found the database unreachable; returns whether it met the same
    /// failure as the first to find it so after a delivery that reached it.
    fn note_unreachable(&self) -> bool {
        let now = Instant::now();
        let mut since = (self.unreachable_since.lock()).unwrap_or_else(|e| e.into_inner());
        self.unreachable.store(true, Ordering::Relaxed);
        match *since {
            None => {
                *since = Some(now);
                true
            }
            Some(began) => now.saturating_duration_since(began) < SAME_FAILURE,
        }
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

    #[tokio::test(start_paused = true)]
    async fn a_database_that_comes_back_and_goes_again_is_not_counted_against_the_message() {
        let memory = RetryMemory::default();
        let decide =
            |identity| policy().decide(&memory, identity, Retry::StoreUnavailable, 5, "c", "d");
        assert!(matches!(
            decide("m"),
            Decision::Requeue { counted: false, .. }
        ));
        // The database came back, then went again: a delivery before this one found it
        // unreachable too, a while before. Found by the delivery simulation below: counted, and
        // at its limit.
        memory.store_reached();
        assert!(matches!(
            decide("other"),
            Decision::Requeue { counted: false, .. }
        ));
        tokio::time::sleep(SAME_FAILURE).await;
        assert!(matches!(
            decide("m"),
            Decision::Requeue { counted: false, .. }
        ));
    }

    #[test]
    fn every_delivery_of_a_batch_lost_with_its_connection_counts_as_its_own() {
        let memory = RetryMemory::default();
        let decide =
            |identity| policy().decide(&memory, identity, Retry::StoreUnavailable, 5, "c", "d");
        for identity in ["a", "b", "c"] {
            assert!(matches!(
                decide(identity),
                Decision::Requeue { counted: false, .. }
            ));
        }
        // Others got through; then a batch of the three lost its connection again, over a
        // statement of one of them: one failure, which counts for each (the culprit among them).
        memory.store_reached();
        for identity in ["a", "b", "c"] {
            assert!(
                matches!(decide(identity), Decision::GiveUp(_)),
                "{identity}"
            );
        }
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

/// The delivery policy as a consumer applies it, over a queue of simulated messages: healthy
/// ones arriving all along, some that fail a few times, some whose own statement the database
/// kills every time (it looks like an outage), and the database down in seeded windows (see
/// `idem_sim`).
#[cfg(test)]
mod simulation {
    use std::collections::BTreeMap;

    use super::*;
    use idem_sim::{self as sim, Rng, Trace};

    const MAX_DELIVERIES: u32 = 5;

    /// What a simulated message does when it is delivered.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Kind {
        /// Its handler fails this many more times, then succeeds.
        Fails(u32),
        /// The database kills its statement every time, as an unreachable database would look.
        Poison,
    }

    /// Where a message ended.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum End {
        Processed,
        DeadLettered,
    }

    struct Message {
        kind: Kind,
        /// Failures its handler had planned from the start.
        planned: u32,
        /// Outages it met among the first deliveries to meet them (within `SAME_FAILURE` of the
        /// first): the policy cannot tell those from its own error, and counts them.
        first_in_outage: u32,
        end: Option<End>,
    }

    /// The database's outages: down from each window's start to its end (in ms of the run).
    fn outages(rng: &mut Rng, flapping: bool) -> Vec<(u64, u64)> {
        if flapping {
            let mut at = 0;
            (0..1 + rng.below(8))
                .map(|_| {
                    at += 500 + rng.below(8_000);
                    let window = (at, at + 100 + rng.below(3_000));
                    at = window.1;
                    window
                })
                .collect()
        } else {
            let start = rng.below(20_000);
            vec![(start, start + rng.below(60_000))]
        }
    }

    /// One run: 20 s of arrivals, then the queue drained; fails if a message is dead-lettered
    /// without having failed on its own as often as the limit allows, or if one never ends.
    async fn run(mut rng: Rng, flapping: bool) -> Result<String, String> {
        let policy = DeliveryPolicy::new(
            MAX_DELIVERIES,
            Backoff::new(Duration::from_millis(50), Duration::from_secs(2)),
        );
        let memory = RetryMemory::default();
        let mut trace = Trace::new();
        let start = Instant::now();
        let down = outages(&mut rng, flapping);
        let outage_at = |at: Instant| {
            let ms = u64::try_from((at - start).as_millis()).unwrap_or(u64::MAX);
            down.iter()
                .position(|(from, to)| (*from..*to).contains(&ms))
        };
        // When each outage was first met.
        let mut outages_met: Vec<Option<Instant>> = vec![None; down.len()];
        // Ready messages by when they are ready, then by id.
        let mut queue: BTreeMap<(Instant, usize), ()> = BTreeMap::new();
        let mut messages = Vec::new();
        let mut arrival = start;
        while arrival < start + Duration::from_secs(20) {
            let kind = match rng.below(20) {
                0 => Kind::Poison,
                1..=3 => Kind::Fails(1 + u32::try_from(rng.below(6)).expect("small")),
                _ => Kind::Fails(0),
            };
            let planned = match kind {
                Kind::Fails(n) => n,
                Kind::Poison => u32::MAX,
            };
            queue.insert((arrival, messages.len()), ());
            messages.push(Message {
                kind,
                planned,
                first_in_outage: 0,
                end: None,
            });
            arrival += rng.up_to(Duration::from_millis(300));
        }
        let deadline = start + Duration::from_secs(600);
        while let Some(((ready, id), ())) = queue.pop_first() {
            if ready > deadline {
                break;
            }
            // Past the arrivals, a healthy message a second keeps reaching the database while
            // others are left, as traffic would: without any, a message whose own statement
            // fails cannot be told from an outage.
            while arrival < ready && messages.iter().any(|m| m.end.is_none()) {
                queue.insert((arrival, messages.len()), ());
                messages.push(Message {
                    kind: Kind::Fails(0),
                    planned: 0,
                    first_in_outage: 0,
                    end: None,
                });
                arrival += Duration::from_secs(1);
            }
            if queue
                .first_key_value()
                .is_some_and(|(next, ())| *next < (ready, id))
            {
                queue.insert((ready, id), ());
                continue;
            }
            tokio::time::sleep_until(ready).await;
            // The handler's time, then the outcome.
            tokio::time::sleep(rng.up_to(Duration::from_millis(20))).await;
            let identity = id.to_string();
            let message = &mut messages[id];
            let outage = outage_at(Instant::now());
            if let Some(outage) = outage {
                let now = Instant::now();
                let first = *outages_met[outage].get_or_insert(now);
                if now - first < SAME_FAILURE {
                    message.first_in_outage += 1;
                }
            }
            let retry = if outage.is_some() || message.kind == Kind::Poison {
                Retry::StoreUnavailable
            } else if let Kind::Fails(n @ 1..) = message.kind {
                message.kind = Kind::Fails(n - 1);
                memory.store_reached();
                Retry::Failed
            } else {
                memory.store_reached();
                memory.forget(|| identity.clone());
                message.end = Some(End::Processed);
                continue;
            };
            let deliveries = memory.failed(&identity) + 1;
            match policy.decide(&memory, &identity, retry, deliveries, "code", "detail") {
                Decision::GiveUp(_) => {
                    trace.note(format_args!(
                        "{id}: dead-lettered ({retry:?}, delivery {deliveries})"
                    ));
                    memory.forget(|| identity.clone());
                    message.end = Some(End::DeadLettered);
                }
                Decision::Requeue { after, .. } => {
                    queue.insert((Instant::now() + after, id), ());
                }
            }
        }
        let mut broken = Vec::new();
        for (id, message) in messages.iter().enumerate() {
            match message.end {
                None => broken.push(format!("message {id} ({:?}) never ended", message.kind)),
                Some(End::DeadLettered)
                    if message.planned.saturating_add(message.first_in_outage) < MAX_DELIVERIES =>
                {
                    broken.push(format!(
                        "message {id} was dead-lettered though its handler was to fail {} times \
                         and it was the first to meet {} outages",
                        message.planned, message.first_in_outage
                    ))
                }
                Some(End::Processed) if message.planned >= MAX_DELIVERIES => broken.push(format!(
                    "message {id} was processed though it was to fail {} times",
                    message.planned
                )),
                _ => {}
            }
        }
        if broken.is_empty() {
            let dead = messages
                .iter()
                .filter(|m| m.end == Some(End::DeadLettered))
                .count();
            Ok(format!("{} messages, {dead} dead-lettered", messages.len()))
        } else {
            Err(format!(
                "outages (ms): {down:?}\n{}\n{}",
                broken.join("\n"),
                trace.events()
            ))
        }
    }

    #[test]
    fn one_outage_of_any_length_dead_letters_only_messages_at_fault() {
        sim::check("delivery policy, one outage", 120, |rng| run(rng, false));
    }

    #[test]
    fn a_flapping_database_dead_letters_only_messages_at_fault() {
        sim::check("delivery policy, flapping", 200, |rng| run(rng, true));
    }
}

//! Settling deliveries: ack, bounded requeue with back-off, dead-letter with a reason.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_runtime::DeadLetterReason;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicPublishOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Confirmation};

use crate::metadata::broker_delivery_count;

/// The headers a dead-lettered message carries, besides its own.
pub mod headers {
    /// The reason's stable code (`fingerprint-mismatch`, `undecodable`, `delivery-limit`, ...).
    pub const REASON: &str = "x-idem-reason";
    /// The reason in words.
    pub const DETAIL: &str = "x-idem-detail";
    /// The consumer that gave up.
    pub const CONSUMER: &str = "x-idem-consumer";
    /// The message key, when one could be read.
    pub const KEY: &str = "x-idem-key";
    /// The queue the message was consumed from.
    pub const QUEUE: &str = "x-idem-queue";
    /// How many deliveries the message had.
    pub const DELIVERIES: &str = "x-idem-deliveries";
}

/// What processing decided for a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Its effect is committed: acknowledge.
    Ack {
        /// Whether it was a duplicate.
        duplicate: bool,
    },
    /// It could succeed later: requeue, after a back-off.
    Requeue {
        /// The error's code.
        code: &'static str,
        /// The error in words.
        detail: String,
        /// The least time worth waiting (another worker's claim runs this much longer).
        wait: Option<Duration>,
        /// Whether the delivery counts toward the delivery limit. Waiting for another worker's
        /// claim does not: the lease and its takeovers bound that wait.
        counted: bool,
    },
    /// It cannot succeed: dead-letter with this reason.
    DeadLetter(DeadLetterReason),
}

/// How a delivery ended, for metrics and stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    Acked,
    Duplicate,
    Requeued,
    DeadLettered,
    /// The channel died before the settlement reached the broker, which redelivers the message.
    Lost,
}

impl Settled {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Settled::Acked => "acked",
            Settled::Duplicate => "duplicate",
            Settled::Requeued => "requeued",
            Settled::DeadLettered => "dead-lettered",
            Settled::Lost => "settle-lost",
        }
    }
}

/// Counts of settled deliveries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Processed and acknowledged.
    pub acked: u64,
    /// Duplicates acknowledged without running the handler.
    pub duplicates: u64,
    /// Requeued for a later attempt.
    pub requeued: u64,
    /// Moved to the dead-letter queue.
    pub dead_lettered: u64,
    /// Settlements that did not reach the broker because the channel died; the broker
    /// redelivers those messages.
    pub settle_lost: u64,
    /// Connection losses that lapin's automatic recovery repaired.
    pub recoveries: u64,
    /// Connections replaced by new ones, after a loss that was not recovered in time.
    pub reconnections: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Stats {
    acked: AtomicU64,
    duplicates: AtomicU64,
    requeued: AtomicU64,
    dead_lettered: AtomicU64,
    settle_lost: AtomicU64,
    pub(crate) recoveries: AtomicU64,
    pub(crate) reconnections: AtomicU64,
}

impl Stats {
    pub(crate) fn count(&self, settled: Settled) {
        let counter = match settled {
            Settled::Acked => &self.acked,
            Settled::Duplicate => &self.duplicates,
            Settled::Requeued => &self.requeued,
            Settled::DeadLettered => &self.dead_lettered,
            Settled::Lost => &self.settle_lost,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> ConsumerStats {
        ConsumerStats {
            acked: self.acked.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            requeued: self.requeued.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            settle_lost: self.settle_lost.load(Ordering::Relaxed),
            recoveries: self.recoveries.load(Ordering::Relaxed),
            reconnections: self.reconnections.load(Ordering::Relaxed),
        }
    }
}

/// How often and how patiently a message is requeued.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RetryPolicy {
    pub(crate) max_deliveries: u32,
    pub(crate) backoff_base: Duration,
    pub(crate) backoff_max: Duration,
}

impl RetryPolicy {
    /// The wait before requeueing after the `delivery`-th delivery failed: doubling from the
    /// base, capped.
    fn backoff(&self, delivery: u32) -> Duration {
        let doublings = delivery.saturating_sub(1).min(16);
        self.backoff_base
            .saturating_mul(1 << doublings)
            .min(self.backoff_max)
    }
}

/// Deliveries of requeued messages seen by this process, for queues whose broker does not count
/// them (classic queues). Bounded: a process that sees too many forgets them all.
#[derive(Debug, Default)]
pub(crate) struct DeliveryCounts(Mutex<HashMap<String, u32>>);

impl DeliveryCounts {
    const MAX_TRACKED: usize = 100_000;

    fn get(&self, identity: &str) -> u32 {
        let counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        counts.get(identity).copied().unwrap_or(0)
    }

    fn set(&self, identity: &str, deliveries: u32) {
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if counts.len() >= Self::MAX_TRACKED {
            counts.clear();
        }
        counts.insert(identity.to_owned(), deliveries);
    }

    fn forget(&self, identity: &str) {
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        counts.remove(identity);
    }
}

/// Settles the deliveries of one binding's session.
#[derive(Debug)]
pub(crate) struct Settler<'a> {
    pub(crate) queue: &'a str,
    pub(crate) consumer: &'a str,
    pub(crate) dead_letter_exchange: &'a str,
    /// A channel in confirm mode for dead-lettered copies.
    pub(crate) publisher: &'a Channel,
    pub(crate) retry: RetryPolicy,
    pub(crate) counts: &'a DeliveryCounts,
}

impl Settler<'_> {
    /// Carries out `verdict` for `delivery`.
    pub(crate) async fn settle(
        &self,
        delivery: &Delivery,
        verdict: Verdict,
        key: Option<&str>,
    ) -> Settled {
        let identity = identity(self.queue, delivery);
        let deliveries = self.deliveries(delivery, &identity);
        let settled = match verdict {
            Verdict::Ack { duplicate } => {
                let settled = if duplicate {
                    Settled::Duplicate
                } else {
                    Settled::Acked
                };
                self.ack(delivery, settled).await
            }
            Verdict::Requeue {
                code,
                detail,
                counted: true,
                ..
            } if deliveries >= self.retry.max_deliveries => {
                let reason = DeadLetterReason::new(
                    "delivery-limit",
                    format!("gave up after {deliveries} deliveries; last error ({code}): {detail}"),
                );
                self.dead_letter(delivery, &reason, key, deliveries).await
            }
            Verdict::Requeue { wait, counted, .. } => {
                if counted {
                    self.counts.set(&identity, deliveries);
                }
                let backoff = self.retry.backoff(deliveries);
                let wait = wait.map_or(backoff, |wait| wait.clamp(backoff, self.retry.backoff_max));
                tokio::time::sleep(wait).await;
                return self.requeue(delivery).await;
            }
            Verdict::DeadLetter(reason) => {
                self.dead_letter(delivery, &reason, key, deliveries).await
            }
        };
        if settled != Settled::Lost {
            self.counts.forget(&identity);
        }
        settled
    }

    /// Which delivery of the message this is, counting from 1: the broker's count on quorum
    /// queues, this process's own on classic ones.
    fn deliveries(&self, delivery: &Delivery, identity: &str) -> u32 {
        let broker = broker_delivery_count(delivery.properties.headers().as_ref());
        broker.max(self.counts.get(identity)) + 1
    }

    async fn ack(&self, delivery: &Delivery, settled: Settled) -> Settled {
        match delivery.acker.ack(BasicAckOptions::default()).await {
            Ok(true) => settled,
            Ok(false) | Err(_) => lost(delivery, "ack"),
        }
    }

    async fn requeue(&self, delivery: &Delivery) -> Settled {
        let options = BasicNackOptions {
            requeue: true,
            ..BasicNackOptions::default()
        };
        match delivery.acker.nack(options).await {
            Ok(true) => Settled::Requeued,
            Ok(false) | Err(_) => lost(delivery, "nack"),
        }
    }

    /// Publishes a copy with the reason to the dead-letter exchange, waits for the broker's
    /// confirm, then acknowledges the original. If the copy cannot be stored, the original is
    /// requeued instead: nothing is lost.
    async fn dead_letter(
        &self,
        delivery: &Delivery,
        reason: &DeadLetterReason,
        key: Option<&str>,
        deliveries: u32,
    ) -> Settled {
        tracing::error!(
            queue = self.queue,
            reason = reason.code,
            detail = %reason.detail,
            key,
            "dead-lettering message"
        );
        let copy = self.publish_copy(delivery, reason, key, deliveries);
        let published = tokio::time::timeout(DEAD_LETTER_CONFIRM_TIMEOUT, copy)
            .await
            .unwrap_or_else(|_| Err("no confirm from the broker in time".to_owned()));
        match published {
            Ok(()) => match self.ack(delivery, Settled::DeadLettered).await {
                Settled::Lost => Settled::Lost,
                _ => Settled::DeadLettered,
            },
            Err(problem) => {
                tracing::error!(
                    queue = self.queue,
                    exchange = self.dead_letter_exchange,
                    %problem,
                    "cannot dead-letter; requeueing the message instead"
                );
                tokio::time::sleep(self.retry.backoff_max).await;
                self.requeue(delivery).await
            }
        }
    }

    async fn publish_copy(
        &self,
        delivery: &Delivery,
        reason: &DeadLetterReason,
        key: Option<&str>,
        deliveries: u32,
    ) -> Result<(), String> {
        let mut table = delivery.properties.headers().clone().unwrap_or_default();
        // The broker's count belongs to the original; a copy resubmitted from the dead-letter
        // queue starts afresh (the count is kept in `x-idem-deliveries`).
        let mut inner = table.inner().clone();
        inner.remove("x-delivery-count");
        table = FieldTable::from(inner);
        let mut text = |name: &str, value: &str| {
            table.insert(ShortString::from(name), AMQPValue::LongString(value.into()));
        };
        text(headers::REASON, reason.code);
        text(headers::DETAIL, &truncate(&reason.detail, 2000));
        text(headers::CONSUMER, self.consumer);
        text(headers::QUEUE, self.queue);
        if let Some(key) = key {
            text(headers::KEY, key);
        }
        table.insert(
            ShortString::from(headers::DELIVERIES),
            AMQPValue::LongLongInt(i64::from(deliveries)),
        );
        let properties = dead_letter_properties(&delivery.properties, table);
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let confirm = self
            .publisher
            .basic_publish(
                self.dead_letter_exchange.into(),
                delivery.routing_key.clone(),
                options,
                &delivery.data,
                properties,
            )
            .await
            .map_err(|e| e.to_string())?;
        match confirm.await.map_err(|e| e.to_string())? {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) => Err(format!(
                "the dead-letter exchange routes the message nowhere ({})",
                returned.reply_text
            )),
            Confirmation::Nack(_) => Err("the broker refused the copy".to_owned()),
            Confirmation::NotRequested => {
                Err("the publisher channel is not in confirm mode".to_owned())
            }
        }
    }
}

/// How long a dead-letter copy may wait for the broker's confirm before the original is requeued
/// instead.
const DEAD_LETTER_CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

/// The properties of a dead-letter copy: the original's, persistent, without its `expiration`
/// (a copy that expired out of the dead-letter queue would be lost, the original being acked)
/// and without its `user_id` (which the broker checks against this connection's user).
fn dead_letter_properties(original: &BasicProperties, headers: FieldTable) -> BasicProperties {
    let mut properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(headers);
    if let Some(value) = original.content_type().clone() {
        properties = properties.with_content_type(value);
    }
    if let Some(value) = original.content_encoding().clone() {
        properties = properties.with_content_encoding(value);
    }
    if let Some(value) = original.correlation_id().clone() {
        properties = properties.with_correlation_id(value);
    }
    if let Some(value) = original.reply_to().clone() {
        properties = properties.with_reply_to(value);
    }
    if let Some(value) = original.message_id().clone() {
        properties = properties.with_message_id(value);
    }
    if let Some(value) = original.kind().clone() {
        properties = properties.with_type(value);
    }
    if let Some(value) = original.app_id().clone() {
        properties = properties.with_app_id(value);
    }
    if let Some(value) = *original.priority() {
        properties = properties.with_priority(value);
    }
    if let Some(value) = *original.timestamp() {
        properties = properties.with_timestamp(value);
    }
    properties
}

fn lost(delivery: &Delivery, what: &str) -> Settled {
    tracing::warn!(
        delivery_tag = delivery.delivery_tag,
        "{what} did not reach the broker (channel closed); the message will be redelivered and the inbox recognises it"
    );
    Settled::Lost
}

/// What identifies a message on a queue across its deliveries when counting them: the queue and
/// the message id, else a hash of the payload.
fn identity(queue: &str, delivery: &Delivery) -> String {
    match delivery.properties.message_id() {
        Some(id) => format!("{queue}\0id:{id}"),
        None => format!(
            "{queue}\0sha256:{}",
            idem_runtime::Fingerprint::of_bytes(&delivery.data)
        ),
    }
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let policy = RetryPolicy {
            max_deliveries: 10,
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(1),
        };
        assert_eq!(policy.backoff(1), Duration::from_millis(100));
        assert_eq!(policy.backoff(2), Duration::from_millis(200));
        assert_eq!(policy.backoff(4), Duration::from_millis(800));
        assert_eq!(policy.backoff(5), Duration::from_secs(1));
        assert_eq!(policy.backoff(60), Duration::from_secs(1));
    }

    #[test]
    fn truncation_keeps_char_boundaries() {
        assert_eq!(truncate("abc", 5), "abc");
        assert_eq!(truncate("ééé", 3), "é…");
    }
}

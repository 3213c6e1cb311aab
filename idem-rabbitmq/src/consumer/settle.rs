//! Settling deliveries: ack, bounded requeue with back-off, dead-letter with a reason.

use std::time::Duration;

use idem_runtime::transport::DeadLetterReason;
use idem_runtime::transport::{Backoff, Decision, DeliveryPolicy, RetryMemory};
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use tokio::sync::OwnedSemaphorePermit;

use super::copy::{self, Route};
use super::headers;
use super::stats::Ending;
use super::unsettled::Unsettled;
use crate::confirm::ConfirmChannel;
use crate::metadata::broker_delivery_count;
use crate::stop::StopSignal;

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
        /// Why, which decides the wait and whether the delivery counts as a failed attempt.
        retry: Retry,
    },
    /// It cannot succeed: dead-letter with this reason.
    DeadLetter(DeadLetterReason),
}

pub(crate) use idem_runtime::transport::Retry;

/// How often and how patiently a message is requeued: the runtime's delivery policy, and how a
/// dead-letter copy the broker does not take is retried.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RetryPolicy {
    pub(crate) max_deliveries: u32,
    pub(crate) backoff: Backoff,
    /// Quick tries at dead-lettering a message, the usual back-off between them...
    pub(crate) dead_letter_attempts: u32,
    /// ...and the wait before each try after those.
    pub(crate) dead_letter_pause: Duration,
}

impl RetryPolicy {
    fn delivery(&self) -> DeliveryPolicy {
        DeliveryPolicy::new(self.max_deliveries, self.backoff)
    }
}

/// Settles the deliveries of one binding's session.
#[derive(Debug)]
pub(crate) struct Settler<'a> {
    pub(crate) queue: &'a str,
    pub(crate) consumer: &'a str,
    pub(crate) dead_letter_exchange: &'a str,
    /// The queue's `x-dead-letter-routing-key`, if it has one.
    pub(crate) dead_letter_routing_key: Option<&'a str>,
    /// A channel in confirm mode, on a connection of its own, for copies: dead-lettered ones,
    /// and requeued ones on quorum queues.
    pub(crate) publisher: &'a ConfirmChannel,
    pub(crate) retry: RetryPolicy,
    pub(crate) retries: &'a RetryMemory,
    /// Whether the queue is a quorum queue, whose broker counts deliveries.
    pub(crate) quorum: bool,
    /// Set when the consumer shuts down.
    pub(crate) stop: &'a StopSignal,
}

impl Settler<'_> {
    /// Carries out `verdict` for `delivery`. The in-flight `permit`, if the delivery holds one
    /// of its own, is given back before any back-off, so that waiting messages do not keep
    /// others from being processed.
    pub(crate) async fn settle(
        &self,
        delivery: &Delivery,
        verdict: Verdict,
        key: Option<&str>,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Ending {
        let ending = match verdict {
            Verdict::Ack { duplicate } => {
                self.retries.store_reached();
                let ending = if duplicate {
                    Ending::Duplicate
                } else {
                    Ending::Acked
                };
                self.ack(delivery, ending).await
            }
            Verdict::Requeue {
                code,
                detail,
                retry,
            } => self.retry(delivery, code, detail, retry, key, permit).await,
            Verdict::DeadLetter(reason) => {
                let deliveries = self.deliveries(delivery, &identity(self.queue, delivery));
                self.dead_letter(delivery, &reason, key, deliveries, permit)
                    .await
            }
        };
        if ending.is_final() {
            self.retries.forget(|| identity(self.queue, delivery));
        }
        ending
    }

    /// Requeues the delivery after its back-off, or dead-letters it (`delivery-limit`) if it was
    /// the message's last failed attempt.
    async fn retry(
        &self,
        delivery: &Delivery,
        code: &'static str,
        detail: String,
        retry: Retry,
        key: Option<&str>,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Ending {
        let identity = identity(self.queue, delivery);
        let deliveries = self.deliveries(delivery, &identity);
        let decision =
            self.retry
                .delivery()
                .decide(self.retries, &identity, retry, deliveries, code, &detail);
        match decision {
            Decision::GiveUp(reason) => {
                self.dead_letter(delivery, &reason, key, deliveries, permit)
                    .await
            }
            Decision::Requeue { counted, after } => {
                drop(permit);
                self.wait(after).await;
                self.requeue(delivery, counted).await
            }
        }
    }

    /// Waits out a back-off, or less if the consumer is shutting down: a message that waits to
    /// be requeued goes back at once rather than hold up the shutdown.
    async fn wait(&self, backoff: Duration) {
        self.stop.sleep(backoff).await;
    }

    /// Which delivery of the message this is, counting from 1: the broker's count on quorum
    /// queues, this process's own on classic ones. A classic queue sets no `x-delivery-count`:
    /// one there was copied from elsewhere (a message resubmitted from a quorum queue's
    /// dead-letter queue) and says nothing of this queue's deliveries.
    fn deliveries(&self, delivery: &Delivery, identity: &str) -> u32 {
        let broker = if self.quorum {
            broker_delivery_count(delivery.properties.headers().as_ref())
        } else {
            0
        };
        broker.max(self.retries.failed(identity)) + 1
    }

    /// Acknowledges the committed deliveries of a batch, `(delivery, duplicate)` each: with one
    /// `basic.ack` `multiple` when every delivery of the channel up to the last of them is among
    /// them (`unsettled` tells, for the channel's `epoch` they were received in), one each
    /// otherwise.
    pub(crate) async fn ack_batch(
        &self,
        acks: &[(&Delivery, bool)],
        unsettled: &Unsettled,
        epoch: u64,
    ) -> Vec<Ending> {
        if acks.is_empty() {
            return Vec::new();
        }
        self.retries.store_reached();
        let kind = |duplicate: bool| {
            if duplicate {
                Ending::Duplicate
            } else {
                Ending::Acked
            }
        };
        let tags: Vec<u64> = acks
            .iter()
            .map(|(delivery, _)| delivery.delivery_tag)
            .collect();
        let turn = unsettled.multiple_ack_turn().await;
        let endings = match unsettled.take_through(epoch, &tags) {
            Some(last) => {
                let (delivery, _) = acks
                    .iter()
                    .find(|(delivery, _)| delivery.delivery_tag == last)
                    .expect("the last tag is one of the batch's");
                let options = BasicAckOptions { multiple: true };
                let sent = delivery.acker.ack(options).await;
                drop(turn);
                match sent {
                    Ok(true) => acks.iter().map(|(_, duplicate)| kind(*duplicate)).collect(),
                    Ok(false) | Err(_) => acks
                        .iter()
                        .map(|(delivery, _)| lost(delivery, "ack"))
                        .collect(),
                }
            }
            None => {
                drop(turn);
                let mut endings = Vec::with_capacity(acks.len());
                for (delivery, duplicate) in acks {
                    endings.push(self.ack(delivery, kind(*duplicate)).await);
                    unsettled.settled(epoch, delivery.delivery_tag);
                }
                endings
            }
        };
        for (delivery, _) in acks {
            self.retries.forget(|| identity(self.queue, delivery));
        }
        endings
    }

    /// Acknowledges `delivery`, which then ends as `ending`, or as lost if the ack did not
    /// reach the broker.
    async fn ack(&self, delivery: &Delivery, ending: Ending) -> Ending {
        match delivery.acker.ack(BasicAckOptions::default()).await {
            Ok(true) => ending,
            Ok(false) | Err(_) => lost(delivery, "ack"),
        }
    }

    /// Puts the message back on the queue: a failed attempt with `basic.reject`, which counts
    /// toward a quorum queue's delivery limit, anything else uncounted: with `basic.nack` on a
    /// classic queue, and on a quorum queue as a fresh copy at the queue's tail, the original
    /// acked, since brokers before RabbitMQ 4.3 count `basic.nack` too. (Should the ack not
    /// reach the broker, both copies are delivered, and the inbox recognises the second.) The
    /// copy's routing key is the queue's name: should the broker dead-letter it itself (its
    /// delivery limit, a TTL), a dead-letter exchange that routes by key routes it by that name
    /// (see `QueueTopology::warn_of_copies_routed_by_queue_name`).
    async fn requeue(&self, delivery: &Delivery, failed: bool) -> Ending {
        if !failed && self.quorum {
            let mut headers = copy::headers_of(delivery, &[]);
            copy::note_route(&mut headers, &copy::first_route(delivery, self.queue));
            let properties = copy::properties_of(&delivery.properties, headers, true);
            match copy::publish(self.publisher, delivery, "", self.queue, properties).await {
                Ok(()) => {
                    return match self.ack(delivery, Ending::Requeued).await {
                        Ending::Lost => Ending::Lost,
                        _ => Ending::Requeued,
                    };
                }
                Err(problem) => tracing::warn!(
                    queue = self.queue,
                    %problem,
                    "cannot requeue a fresh copy; requeueing the message itself"
                ),
            }
        }
        let sent = if failed {
            delivery
                .acker
                .reject(BasicRejectOptions { requeue: true })
                .await
        } else {
            let options = BasicNackOptions {
                requeue: true,
                ..BasicNackOptions::default()
            };
            delivery.acker.nack(options).await
        };
        match sent {
            Ok(true) => Ending::Requeued,
            Ok(false) | Err(_) => lost(delivery, "requeue"),
        }
    }

    /// Publishes a copy with the reason to the dead-letter exchange, routed as the broker routes
    /// dead letters (by the queue's `x-dead-letter-routing-key`, else the message's own routing
    /// key), waits for the broker's confirm, then acknowledges the original.
    ///
    /// A copy the broker does not take (routed to no queue, refused, not confirmed) leaves the
    /// original requeued, uncounted, never lost (rejecting it for the broker to dead-letter would
    /// drop it where the exchange routes nowhere): a loud failure, logged as an error and
    /// settled as `dead-letter-failed`. It gets a few quick tries
    /// ([`dead_letter_retry`](crate::ConsumerBuilder::dead_letter_retry)), with the usual
    /// back-off between them, then one per pause: a dead-letter exchange that routes nowhere
    /// costs one delivery per pause, not a loop.
    async fn dead_letter(
        &self,
        delivery: &Delivery,
        reason: &DeadLetterReason,
        key: Option<&str>,
        deliveries: u32,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Ending {
        tracing::error!(
            queue = self.queue,
            reason = reason.code,
            detail = %reason.detail,
            key,
            "dead-lettering message"
        );
        let route = copy::first_route(delivery, self.queue);
        let table = self.dead_letter_headers(delivery, &route, reason, key, deliveries);
        let properties = copy::properties_of(&delivery.properties, table, false);
        let routing_key = self
            .dead_letter_routing_key
            .unwrap_or(route.routing_key.as_str());
        let published = copy::publish(
            self.publisher,
            delivery,
            self.dead_letter_exchange,
            routing_key,
            properties,
        )
        .await;
        let problem = match published {
            Ok(()) => {
                metrics::counter!(
                    crate::metrics::DEAD_LETTERS_TOTAL,
                    "queue" => self.queue.to_owned(),
                    "reason" => reason.code
                )
                .increment(1);
                return match self.ack(delivery, Ending::DeadLettered).await {
                    Ending::Lost => Ending::Lost,
                    _ => Ending::DeadLettered,
                };
            }
            Err(problem) => problem,
        };
        self.dead_letter_failed(delivery, routing_key, &problem, permit)
            .await
    }

    /// The headers of `delivery`'s dead-letter copy: its own, its first `route`, and why it is
    /// dead-lettered, by whom, after how many `deliveries`.
    fn dead_letter_headers(
        &self,
        delivery: &Delivery,
        route: &Route,
        reason: &DeadLetterReason,
        key: Option<&str>,
        deliveries: u32,
    ) -> FieldTable {
        // A message resubmitted from the dead-letter queue carries its earlier letter's key.
        let mut table = copy::headers_of(delivery, &[headers::KEY]);
        copy::note_route(&mut table, route);
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
        // The broker's count is not copied; a copy resubmitted from the dead-letter queue starts
        // afresh, and this one is kept here.
        table.insert(
            ShortString::from(headers::DELIVERIES),
            AMQPValue::LongLongInt(i64::from(deliveries)),
        );
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        let now_ms = now.map_or(0, |since| {
            i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
        });
        table.insert(
            ShortString::from(headers::DEAD_LETTERED_AT),
            AMQPValue::LongLongInt(now_ms),
        );
        table
    }

    /// Puts back a message whose dead-letter copy (routed by `routing_key`) the broker did not
    /// take, after a quick back-off for its first tries and the dead-letter pause after them.
    async fn dead_letter_failed(
        &self,
        delivery: &Delivery,
        routing_key: &str,
        problem: &str,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Ending {
        let failures = self.retries.copy_failed(&identity(self.queue, delivery));
        let wait = if failures < self.retry.dead_letter_attempts {
            self.retry.backoff.after(failures)
        } else {
            self.retry.dead_letter_pause
        };
        tracing::error!(
            queue = self.queue,
            exchange = self.dead_letter_exchange,
            routing_key,
            %problem,
            failures,
            retry_in = ?wait,
            "cannot dead-letter; the message goes back to the queue until the dead-letter exchange takes it"
        );
        drop(permit);
        self.wait(wait).await;
        match self.requeue(delivery, false).await {
            Ending::Lost => Ending::Lost,
            _ => Ending::DeadLetterFailed,
        }
    }
}

fn lost(delivery: &Delivery, what: &str) -> Ending {
    tracing::warn!(
        delivery_tag = delivery.delivery_tag,
        "{what} did not reach the broker (channel closed); the message will be redelivered and the inbox recognises it"
    );
    Ending::Lost
}

/// What identifies a message on a queue across its deliveries when counting them: the queue and
/// the message id, else a hash of the payload.
fn identity(queue: &str, delivery: &Delivery) -> String {
    match delivery.properties.message_id() {
        Some(id) => format!("{queue}\0id:{id}"),
        None => format!(
            "{queue}\0sha256:{}",
            idem_runtime::fingerprint::Fingerprint::of_bytes(&delivery.data)
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
    fn truncation_keeps_char_boundaries() {
        assert_eq!(truncate("abc", 5), "abc");
        assert_eq!(truncate("ééé", 3), "é…");
    }
}

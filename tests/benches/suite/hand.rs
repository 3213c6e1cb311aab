//! The consumers written by hand with lapin: `raw`, `hand-per-message`, `hand-batch`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use idem_rabbitmq::lapin::message::Delivery;
use idem_rabbitmq::lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
use idem_tests::bench::hand::{BusinessInserts, HandInbox, HandMessage, HandOutcome, fingerprint};
use sea_orm::{DatabaseConnection, DbErr};
use tokio::sync::Semaphore;

/// Counts of how the hand-written side settled a round's deliveries.
#[derive(Debug, Default)]
pub(crate) struct HandCounts {
    pub(crate) processed: AtomicU64,
    pub(crate) duplicates: AtomicU64,
    pub(crate) mismatches: AtomicU64,
    pub(crate) requeued: AtomicU64,
}

impl HandCounts {
    pub(crate) fn count(&self, outcome: Result<HandOutcome, &DbErr>) {
        let counter = match outcome {
            Ok(HandOutcome::Processed) => &self.processed,
            Ok(HandOutcome::Duplicate) => &self.duplicates,
            Ok(HandOutcome::Mismatch) => &self.mismatches,
            Ok(HandOutcome::Busy) => &self.requeued,
            Err(error) => {
                eprintln!("  hand-written: database error, requeued: {error}");
                &self.requeued
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// `raw`: ack each delivery as it comes.
pub(crate) async fn raw(mut consumer: idem_rabbitmq::lapin::Consumer) {
    while let Some(Ok(delivery)) = consumer.next().await {
        delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .expect("ack");
    }
}

/// A delivery decoded for the hand-written side.
pub(crate) fn decode(delivery: &Delivery) -> HandMessage {
    HandMessage {
        key: delivery
            .properties
            .message_id()
            .as_ref()
            .expect("a message id")
            .to_string(),
        fingerprint: fingerprint(&delivery.data),
        order: serde_json::from_slice(&delivery.data).expect("an order"),
    }
}

/// Settles one delivery as the hand-written side decided.
pub(crate) async fn settle(delivery: &Delivery, outcome: Result<HandOutcome, &DbErr>) {
    let acker = &delivery.acker;
    let sent = match outcome {
        Ok(HandOutcome::Processed | HandOutcome::Duplicate) => {
            acker.ack(BasicAckOptions::default()).await
        }
        Ok(HandOutcome::Mismatch) => acker.reject(BasicRejectOptions { requeue: false }).await,
        Ok(HandOutcome::Busy) | Err(_) => {
            acker
                .nack(BasicNackOptions {
                    multiple: false,
                    requeue: true,
                })
                .await
        }
    };
    sent.expect("settle");
}

/// `hand-per-message`: each delivery in its own transaction, `concurrency` at once.
pub(crate) async fn hand_per_message(
    mut consumer: idem_rabbitmq::lapin::Consumer,
    db: DatabaseConnection,
    hand: HandInbox,
    concurrency: usize,
    counts: Arc<HandCounts>,
) {
    let permits = Arc::new(Semaphore::new(concurrency));
    loop {
        let permit = Arc::clone(&permits).acquire_owned().await.expect("permit");
        let Some(Ok(delivery)) = consumer.next().await else {
            return;
        };
        let (db, hand, counts) = (db.clone(), hand.clone(), Arc::clone(&counts));
        tokio::spawn(async move {
            let outcome = hand.process(&db, decode(&delivery)).await;
            // Counted before the settlement leaves: the round ends when the probe sees it.
            counts.count(outcome.as_ref().copied());
            settle(&delivery, outcome.as_ref().copied()).await;
            drop(permit);
        });
    }
}

/// How `hand_batch` gathers deliveries and runs their business work.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HandBatching {
    pub(crate) size: usize,
    pub(crate) max_wait: Duration,
    pub(crate) business: BusinessInserts,
}

/// `hand-batch` and `hand-batch-multirow`: the deliveries ready within `max_wait` of the first,
/// up to `size`, in one transaction, then one `multiple` ack when all of them are acked (every
/// earlier delivery of the channel is settled by then: one batch at a time).
pub(crate) async fn hand_batch(
    mut consumer: idem_rabbitmq::lapin::Consumer,
    db: DatabaseConnection,
    hand: HandInbox,
    batching: HandBatching,
    counts: Arc<HandCounts>,
) {
    let HandBatching {
        size,
        max_wait,
        business,
    } = batching;
    let mut batch = Vec::with_capacity(size);
    loop {
        let Some(Ok(first)) = consumer.next().await else {
            return;
        };
        batch.push(first);
        let deadline = tokio::time::Instant::now() + max_wait;
        while batch.len() < size {
            match tokio::time::timeout_at(deadline, consumer.next()).await {
                Ok(Some(Ok(delivery))) => batch.push(delivery),
                Ok(_) => return,
                Err(_) => break,
            }
        }
        let messages: Vec<HandMessage> = batch.iter().map(decode).collect();
        match hand.process_batch(&db, &messages, business).await {
            Ok(outcomes) => {
                for outcome in &outcomes {
                    counts.count(Ok(*outcome));
                }
                let all_acked = outcomes
                    .iter()
                    .all(|o| matches!(o, HandOutcome::Processed | HandOutcome::Duplicate));
                if all_acked {
                    let last = batch.last().expect("a delivery");
                    last.acker
                        .ack(BasicAckOptions { multiple: true })
                        .await
                        .expect("ack");
                } else {
                    for (delivery, outcome) in batch.iter().zip(&outcomes) {
                        settle(delivery, Ok(*outcome)).await;
                    }
                }
            }
            Err(error) => {
                for delivery in &batch {
                    counts.count(Err(&error));
                    settle(delivery, Err(&error)).await;
                }
            }
        }
        batch.clear();
    }
}

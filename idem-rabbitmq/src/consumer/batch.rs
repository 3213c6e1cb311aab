//! One batch's processing and settlement, run in its own task: the inbox processes the
//! deliveries in one transaction, the committed ones are acknowledged together, and every other
//! one is settled on its own.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::join_all;
use idem_runtime::Inbox;
use idem_runtime::delivery::RetryMemory;
use lapin::Channel;
use lapin::message::Delivery;
use tokio::sync::{OwnedSemaphorePermit, watch};
use tracing::Instrument;

use super::Settings;
use super::binding::{Dispatch, Handled};
use super::settle::{Retry, Settler, Verdict};
use super::stats::{Settled, Stats};
use super::unsettled::Unsettled;
use crate::metadata::metadata_of;

/// A batch of deliveries of one binding, with what settling them needs.
pub(crate) struct BatchJob {
    pub(crate) binding: Arc<dyn Dispatch>,
    pub(crate) inbox: Inbox,
    pub(crate) settings: Arc<Settings>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) retries: Arc<RetryMemory>,
    pub(crate) publisher: Channel,
    pub(crate) quorum: bool,
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) unsettled: Arc<Unsettled>,
    pub(crate) deliveries: Vec<Delivery>,
    pub(crate) permit: OwnedSemaphorePermit,
}

impl BatchJob {
    pub(crate) async fn run(self) {
        let topology = self.binding.topology();
        let span = tracing::info_span!(
            "idem.batch_delivery",
            queue = topology.queue(),
            size = self.deliveries.len(),
            first_tag = self.deliveries.first().map(|d| d.delivery_tag),
        );
        self.settle_all().instrument(span).await;
    }

    async fn settle_all(self) {
        let deliveries = &self.deliveries;
        let metadata = deliveries
            .iter()
            .map(|delivery| metadata_of(&delivery.properties, delivery.redelivered))
            .collect();
        // A panic outside the handlers (a key expression, a codec) must still settle every
        // delivery, or they would hold their places until the channel closes.
        let handled =
            AssertUnwindSafe(self.binding.handle_batch(&self.inbox, deliveries, metadata))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| {
                    let detail = idem_runtime::panic_message(panic.as_ref());
                    deliveries
                        .iter()
                        .map(|_| Handled {
                            verdict: Verdict::Requeue {
                                code: "panicked",
                                detail: detail.clone(),
                                retry: Retry::Failed,
                            },
                            key: None,
                        })
                        .collect()
                });
        let topology = self.binding.topology();
        let settler = Settler {
            queue: topology.queue(),
            consumer: self.binding.consumer(),
            dead_letter_exchange: topology.dead_letter_exchange(),
            dead_letter_routing_key: topology.dead_letter_key(),
            publisher: &self.publisher,
            retry: self.settings.retry,
            retries: &self.retries,
            quorum: self.quorum,
            shutdown: &self.shutdown,
        };
        let mut acks = Vec::new();
        let mut others = Vec::new();
        for (delivery, handled) in deliveries.iter().zip(handled) {
            match handled.verdict {
                Verdict::Ack { duplicate } => acks.push((delivery, duplicate)),
                verdict => others.push((delivery, verdict, handled.key)),
            }
        }
        let acked = settler.ack_batch(&acks, &self.unsettled).await;
        // The batch's slot goes back before any back-off of the others.
        drop(self.permit);
        let settled = join_all(others.into_iter().map(|(delivery, verdict, key)| {
            let (settler, unsettled) = (&settler, &self.unsettled);
            async move {
                let settled = settler
                    .settle(delivery, verdict, key.as_deref(), None)
                    .await;
                unsettled.settled(delivery.delivery_tag);
                settled
            }
        }))
        .await;
        for settled in acked.into_iter().chain(settled) {
            count(&self.stats, topology.queue(), settled);
        }
    }
}

/// Counts a settled delivery in the consumer's stats and metrics.
pub(crate) fn count(stats: &Stats, queue: &str, settled: Settled) {
    stats.count(settled);
    metrics::counter!(
        crate::DELIVERIES_TOTAL,
        "queue" => queue.to_owned(),
        "settle" => settled.label()
    )
    .increment(1);
}

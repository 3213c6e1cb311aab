//! One batch's processing and settlement, run in its own task: the inbox processes the
//! deliveries in one transaction, the committed ones are acknowledged together, and every other
//! one is settled on its own.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::join_all;
use lapin::message::Delivery;
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;

use super::binding::Handled;
use super::settle::Verdict;
use super::unsettled::Unsettled;
use super::worker::Settling;
use crate::metadata::metadata_of;

/// A batch of deliveries of one binding, with what settling them needs.
pub(crate) struct BatchJob {
    pub(crate) settling: Settling,
    pub(crate) unsettled: Arc<Unsettled>,
    /// The channel's epoch the deliveries were received in.
    pub(crate) epoch: u64,
    pub(crate) deliveries: Vec<Delivery>,
    /// Its places among the consumer's handlers in flight and among its binding's batches.
    pub(crate) permit: [OwnedSemaphorePermit; 2],
}

impl BatchJob {
    pub(crate) async fn run(self) {
        let span = tracing::info_span!(
            "idem.batch_delivery",
            queue = self.settling.binding.topology().queue(),
            size = self.deliveries.len(),
            first_tag = self.deliveries.first().map(|d| d.delivery_tag),
        );
        self.settle_all().instrument(span).await;
    }

    async fn settle_all(self) {
        let BatchJob {
            settling,
            unsettled,
            epoch,
            deliveries,
            permit,
        } = self;
        let metadata = deliveries
            .iter()
            .map(|delivery| metadata_of(&delivery.properties, delivery.redelivered))
            .collect();
        // A panic outside the handlers (a key expression, a codec) must still settle every
        // delivery, or they would hold their places until the channel closes.
        let handled = AssertUnwindSafe(settling.binding.handle_batch(
            &settling.inbox,
            &deliveries,
            metadata,
        ))
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| {
            deliveries
                .iter()
                .map(|_| Handled::panicked(panic.as_ref()))
                .collect()
        });
        let settler = settling.settler();
        let mut acks = Vec::new();
        let mut others = Vec::new();
        for (delivery, handled) in deliveries.iter().zip(handled) {
            match handled.verdict {
                Verdict::Ack { duplicate } => acks.push((delivery, duplicate)),
                verdict => others.push((delivery, verdict, handled.key)),
            }
        }
        // Counted at once: the others' settling may wait out a back-off.
        for settled in settler.ack_batch(&acks, &unsettled, epoch).await {
            settling.count(settled);
        }
        // The batch's slots go back before any back-off of the others.
        drop(permit);
        let settled = join_all(others.into_iter().map(|(delivery, verdict, key)| {
            let (settler, unsettled) = (&settler, &unsettled);
            async move {
                let settled = settler
                    .settle(delivery, verdict, key.as_deref(), None)
                    .await;
                unsettled.settled(epoch, delivery.delivery_tag);
                settled
            }
        }))
        .await;
        for settled in settled {
            settling.count(settled);
        }
    }
}

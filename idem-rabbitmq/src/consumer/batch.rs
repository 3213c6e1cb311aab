//! One batch's processing and settlement, run in its own task: the inbox processes the
//! deliveries in one transaction, the committed ones are acknowledged together, and every other
//! one is settled on its own.

use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;
use futures_util::future::join_all;
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;

use super::binding::Handled;
use super::gather::Gathered;
use super::job::JobContext;
use super::settle::Verdict;
use super::stats::InFlight;
use crate::metadata::metadata_of;

/// A batch of deliveries of one binding, with what settling them needs.
pub(crate) struct BatchJob {
    pub(crate) context: JobContext,
    pub(crate) batch: Gathered,
    /// Its places among the consumer's handlers in flight and among its binding's batches.
    pub(crate) permit: [OwnedSemaphorePermit; 2],
}

impl BatchJob {
    /// Processes the batch and settles each of its deliveries, in a span of its own.
    pub(crate) async fn run(self) {
        let deliveries = &self.batch.deliveries;
        let queue = self.context.binding.topology().queue();
        let _in_flight = InFlight::new(queue, deliveries.len());
        let span = tracing::info_span!(
            "idem.batch_delivery",
            queue,
            size = deliveries.len(),
            first_tag = deliveries.first().map(|d| d.delivery_tag),
        );
        #[cfg(feature = "otel")]
        for delivery in deliveries {
            let metadata = metadata_of(&delivery.properties, delivery.redelivered);
            idem_runtime::trace_context::link_trace(&span, |name| {
                metadata.headers.get(name).cloned()
            });
        }
        self.settle_all().instrument(span).await;
    }

    /// Processes the batch through the inbox, acknowledges the committed deliveries together,
    /// then settles every other one on its own.
    async fn settle_all(self) {
        let BatchJob {
            context,
            batch:
                Gathered {
                    unsettled,
                    epoch,
                    deliveries,
                },
            permit,
        } = self;
        let metadata = deliveries
            .iter()
            .map(|delivery| metadata_of(&delivery.properties, delivery.redelivered))
            .collect();
        // A panic outside the handlers (a key expression, a codec) must still settle every
        // delivery, or they would hold their places until the channel closes.
        let handled = AssertUnwindSafe(context.binding.handle_batch(
            &context.inbox,
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
        let settler = context.settler();
        let mut acks = Vec::new();
        let mut others = Vec::new();
        for (delivery, handled) in deliveries.iter().zip(handled) {
            match handled.verdict {
                Verdict::Ack { duplicate } => acks.push((delivery, duplicate)),
                verdict => others.push((delivery, verdict, handled.key)),
            }
        }
        // Counted at once: the others' settling may wait out a back-off.
        for ending in settler.ack_batch(&acks, &unsettled, epoch).await {
            context.count(ending);
        }
        // The batch's slots go back before any back-off of the others.
        drop(permit);
        let endings = join_all(others.into_iter().map(|(delivery, verdict, key)| {
            let (settler, unsettled) = (&settler, &unsettled);
            async move {
                let ending = settler
                    .settle(delivery, verdict, key.as_deref(), None)
                    .await;
                unsettled.settled(epoch, delivery.delivery_tag);
                ending
            }
        }))
        .await;
        for ending in endings {
            context.count(ending);
        }
    }
}

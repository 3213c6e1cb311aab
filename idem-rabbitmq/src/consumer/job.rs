//! A delivery's job: its processing and settlement, run in a task of its own; and what the jobs
//! of one session share to settle their deliveries.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use idem_runtime::Inbox;
use idem_runtime::transport::RetryMemory;
use lapin::message::Delivery;
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;
use tracing::field::Empty;

use super::binding::{Dispatch, Handled};
use super::settings::ConsumerSettings;
use super::settle::Settler;
use super::stats::{ConsumerCounters, Ending, InFlight};
use crate::confirm::ConfirmChannel;
use crate::metadata::metadata_of;
use crate::stop::StopSignal;

/// What the jobs of one session need to process and settle their deliveries.
pub(crate) struct JobContext {
    pub(crate) binding: Arc<dyn Dispatch>,
    pub(crate) inbox: Inbox,
    pub(crate) settings: Arc<ConsumerSettings>,
    pub(crate) counters: Arc<ConsumerCounters>,
    pub(crate) retries: Arc<RetryMemory>,
    /// The session's channel for copies (dead-lettered ones, requeued ones on quorum queues).
    pub(crate) publisher: ConfirmChannel,
    /// Whether the queue is a quorum queue.
    pub(crate) quorum: bool,
    /// Set when the consumer shuts down.
    pub(crate) stop: StopSignal,
}

impl JobContext {
    /// The settler of this session's deliveries.
    pub(crate) fn settler(&self) -> Settler<'_> {
        let topology = self.binding.topology();
        let mut retry = self.settings.retry;
        // A quorum queue's broker dead-letters a message returned more often than its limit,
        // without a reason (and a fresh copy by the queue's name): the consumer does it first.
        if let (true, Some(limit)) = (self.quorum, topology.broker_delivery_limit()) {
            retry.max_deliveries = retry.max_deliveries.min(limit.saturating_add(1));
        }
        Settler {
            queue: topology.queue(),
            consumer: self.binding.consumer(),
            dead_letter_exchange: topology.dead_letter_exchange(),
            dead_letter_routing_key: topology.dead_letter_key(),
            publisher: &self.publisher,
            retry,
            retries: &self.retries,
            quorum: self.quorum,
            stop: &self.stop,
        }
    }

    /// Counts a delivery that ended as `ending` in the consumer's stats and metrics.
    pub(crate) fn count(&self, ending: Ending) {
        self.counters.count(ending);
        metrics::counter!(
            crate::metrics::DELIVERIES_TOTAL,
            "queue" => self.binding.topology().queue().to_owned(),
            "settle" => ending.label()
        )
        .increment(1);
    }
}

/// One delivery's processing and settlement, run in its own task.
pub(crate) struct DeliveryJob {
    pub(crate) context: JobContext,
    pub(crate) delivery: Delivery,
    /// Its place among the consumer's handlers in flight.
    pub(crate) permit: OwnedSemaphorePermit,
}

impl DeliveryJob {
    /// Processes the delivery through the inbox, settles it as the inbox decided and counts it,
    /// in a span of its own.
    pub(crate) async fn run(self) {
        let DeliveryJob {
            context,
            delivery,
            permit,
        } = self;
        let binding = &context.binding;
        let topology = binding.topology();
        let _in_flight = InFlight::new(topology.queue(), 1);
        let metadata = metadata_of(&delivery.properties, delivery.redelivered);
        let span = tracing::info_span!(
            "idem.delivery",
            queue = topology.queue(),
            delivery_tag = delivery.delivery_tag,
            redelivered = delivery.redelivered,
            message_id = metadata.message_id.as_deref(),
            correlation_id = metadata.correlation_id.as_deref(),
            key = Empty,
            settle = Empty,
        );
        #[cfg(feature = "otel")]
        idem_runtime::trace_context::continue_trace(&span, |name| {
            metadata.headers.get(name).cloned()
        });
        async {
            // A panic outside the handler (a key expression, a codec, an output's `Serialize`)
            // must still settle the delivery, or it would hold its place until the channel
            // closes.
            let handled = AssertUnwindSafe(binding.handle(&context.inbox, &delivery, metadata))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| Handled::panicked(panic.as_ref()));
            if let Some(key) = &handled.key {
                tracing::Span::current().record("key", key.as_str());
            }
            let ending = context
                .settler()
                .settle(
                    &delivery,
                    handled.verdict,
                    handled.key.as_deref(),
                    Some(permit),
                )
                .await;
            tracing::Span::current().record("settle", ending.label());
            context.count(ending);
        }
        .instrument(span)
        .await;
    }
}

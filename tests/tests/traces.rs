//! Traces across services (feature `otel` of idem-rabbitmq), against the real RabbitMQ and
//! PostgreSQL, exported in memory: an order a producer publishes twice (a retry) from its
//! checkout span is billed, the bill stages an event in the outbox, the relay publishes it,
//! and a notifier consumes it: one trace, the retried delivery in it as a duplicate, the
//! notifier's delivery under the billing handler that staged its event. Billed in batches and
//! in slices, orders of several traces keep each its own.
//!
//! Run: `cargo test -p idem-tests --test traces` with RabbitMQ and PostgreSQL up.

use std::time::{Duration, Instant};

use idem_rabbitmq::lapin::ExchangeKind;
use std::sync::OnceLock;

use idem_rabbitmq::{Binding, Consumer, PublishOptions, Relay};
use idem_runtime::fingerprint::{Fingerprint, FingerprintError};
use idem_runtime::outbox::StagingError;
use idem_runtime::{
    Context, Handler, KeyError, MessageKey, Metadata, OutboxMessage, SliceContext, SliceHandler,
};
use idem_tests::otel::{
    InMemorySpanExporter, SdkTracerProvider, assert_retried_message_is_one_trace, attribute,
    in_memory_traces,
};
use idem_tests::rabbit::{amqp_url, consumer_builder};
use idem_tests::{Fixture, Msg, unique};

/// Bills an order: stages one `invoice` event for it to `events`.
struct Bill {
    events: String,
}

impl Handler for Bill {
    type Message = Msg;
    type Output = ();
    type Error = StagingError;

    fn consumer(&self) -> &str {
        "traced-billing"
    }
    fn key(&self, msg: &Msg, _: &Metadata) -> Result<MessageKey, KeyError> {
        MessageKey::new(msg.id.as_str())
    }
    fn fingerprint(&self, _: &Msg, _: &Metadata) -> Result<Option<Fingerprint>, FingerprintError> {
        Ok(None)
    }
    async fn handle(&self, cx: &Context<'_>, msg: Msg) -> Result<(), StagingError> {
        let event = OutboxMessage::json(&self.events, "invoice", &Msg::new(msg.id, "invoice"))
            .expect("JSON");
        cx.stage(event).await.map(drop)
    }
}

impl SliceHandler for Bill {
    async fn handle_slice(
        &self,
        cx: &SliceContext<'_>,
        orders: Vec<Msg>,
    ) -> Result<Vec<()>, StagingError> {
        for (order, message) in orders.into_iter().zip(cx.messages()) {
            self.handle(message, order).await?;
        }
        Ok(vec![(); cx.len()])
    }
}

/// The spans of this binary's tests, exported in memory (one global subscriber a binary).
fn traces() -> &'static (InMemorySpanExporter, SdkTracerProvider) {
    static TRACES: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    TRACES.get_or_init(in_memory_traces)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retried_order_is_one_trace_across_three_hops() {
    let (exporter, provider) = traces();
    let f = Fixture::builder().outbox().build().await;
    let events = unique("idem_events");
    f.broker
        .declare_exchange(&events, ExchangeKind::Direct)
        .await;
    f.broker.track_exchange(&events);
    let notified = f.broker.classic_queue();
    f.broker.declare(&notified).await;
    f.broker.bind(notified.queue(), &events, "invoice").await;

    let billing = f.start(Bill { events }).await;
    let notifier_handler = f.recorder(&unique("traced-notify"));
    let notifier: Consumer = consumer_builder(&f.inbox, &unique("idem-notify"))
        .bind(notified.clone(), notifier_handler)
        .start()
        .await
        .expect("the notifier starts");
    let relay = Relay::builder(amqp_url(), f.outbox().clone())
        .connection_name(unique("idem-relay"))
        .start()
        .await
        .expect("the relay starts");

    // The checkout publishes its order, and again: its first confirm was lost.
    let checkout = tracing::info_span!("checkout");
    async {
        for _ in 0..2 {
            let options = PublishOptions::default().message_id("o-1");
            f.send(&Msg::new("o-1", "order"), options).await;
        }
    }
    .instrument_in(&checkout)
    .await;
    drop(checkout);

    let deadline = Instant::now() + Duration::from_secs(30);
    while f.effects("1 = 1").await < 1 || f.depth().await > 0 {
        assert!(
            Instant::now() < deadline,
            "the event never reached the notifier"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    billing.shutdown().await;
    notifier.shutdown().await;
    relay.shutdown().await;
    provider.force_flush().expect("flushed");
    let spans = exporter.get_finished_spans().expect("spans");
    assert_retried_message_is_one_trace(&spans, "checkout", &f.queue, notified.queue());
}

/// Orders of two producers' traces billed in one batch, per message and in one slice call: the
/// event each bill stages reaches the notifier in the trace its order's producer began, not in
/// the batch's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_message_of_a_batch_or_a_slice_keeps_its_trace() {
    let (exporter, provider) = traces();
    for slices in [false, true] {
        let f = Fixture::builder().outbox().build().await;
        let events = unique("idem_events");
        f.broker
            .declare_exchange(&events, ExchangeKind::Direct)
            .await;
        f.broker.track_exchange(&events);
        let notified = f.broker.classic_queue();
        f.broker.declare(&notified).await;
        f.broker.bind(notified.queue(), &events, "invoice").await;
        f.broker.declare(&f.topology).await;
        let orders = [unique("order-a"), unique("order-b")];
        // Both are waiting when billing starts: they are taken in one batch.
        for order in &orders {
            let producer = tracing::info_span!("producer", order = order.as_str());
            let options = PublishOptions::default().message_id(order.as_str());
            f.send(&Msg::new(order, "order"), options)
                .instrument_in(&producer)
                .await;
        }
        let binding = Binding::new(f.topology.clone(), Bill { events });
        let binding = if slices {
            binding.slices(10, Duration::from_millis(300))
        } else {
            binding.batch(10, Duration::from_millis(300))
        };
        let billing = f
            .consumer()
            .bind_with(binding)
            .start()
            .await
            .expect("billing starts");
        let notifier_handler = f.recorder(&unique("traced-notify"));
        let notifier: Consumer = consumer_builder(&f.inbox, &unique("idem-notify"))
            .bind(notified.clone(), notifier_handler)
            .start()
            .await
            .expect("the notifier starts");
        let relay = Relay::builder(amqp_url(), f.outbox().clone())
            .connection_name(unique("idem-relay"))
            .start()
            .await
            .expect("the relay starts");
        let deadline = Instant::now() + Duration::from_secs(30);
        while f.effects("1 = 1").await < 2 {
            assert!(
                Instant::now() < deadline,
                "the events never reached the notifier"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        billing.shutdown().await;
        notifier.shutdown().await;
        relay.shutdown().await;
        provider.force_flush().expect("flushed");
        let spans = exporter.get_finished_spans().expect("spans");
        let batch = spans
            .iter()
            .find(|s| {
                s.name == "idem.batch_delivery"
                    && attribute(s, "queue").as_deref() == Some(f.queue.as_str())
            })
            .expect("the batch's span");
        assert_eq!(batch.links.len(), 2, "the batch links both orders");
        for order in &orders {
            let producer = spans
                .iter()
                .find(|s| s.name == "producer" && attribute(s, "order").as_deref() == Some(order))
                .expect("the producer's span");
            let delivered = spans
                .iter()
                .find(|s| {
                    s.name == "idem.delivery"
                        && attribute(s, "queue").as_deref() == Some(notified.queue())
                        && attribute(s, "key").as_deref() == Some(order)
                })
                .unwrap_or_else(|| panic!("the notifier's delivery of {order}"));
            assert_eq!(
                delivered.span_context.trace_id(),
                producer.span_context.trace_id(),
                "slices: {slices}; {order}'s event is in its producer's trace, not the batch's"
            );
        }
    }
}

/// Runs a future inside a span.
trait InSpan: std::future::Future + Sized {
    fn instrument_in(self, span: &tracing::Span) -> tracing::instrument::Instrumented<Self> {
        tracing::Instrument::instrument(self, span.clone())
    }
}

impl<F: std::future::Future> InSpan for F {}

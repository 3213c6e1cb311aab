//! Traces across services (feature `otel` of idem-rabbitmq), against the real RabbitMQ and
//! PostgreSQL, exported in memory: an order a producer publishes twice (a retry) from its
//! checkout span is billed, the bill stages an event in the outbox, the relay publishes it,
//! and a notifier consumes it: one trace, the retried delivery in it as a duplicate, the
//! notifier's delivery under the billing handler that staged its event.
//!
//! Run: `cargo test -p idem-tests --test traces` with RabbitMQ and PostgreSQL up.

use std::time::{Duration, Instant};

use idem_rabbitmq::lapin::ExchangeKind;
use idem_rabbitmq::{Consumer, PublishOptions, Relay};
use idem_runtime::{
    Context, Fingerprint, FingerprintError, Handler, KeyError, MessageKey, Metadata, OutboxMessage,
    StagingError,
};
use idem_tests::otel::{assert_retried_message_is_one_trace, in_memory_traces};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retried_order_is_one_trace_across_three_hops() {
    let (exporter, provider) = in_memory_traces();
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

/// Runs a future inside a span.
trait InSpan: std::future::Future + Sized {
    fn instrument_in(self, span: &tracing::Span) -> tracing::instrument::Instrumented<Self> {
        tracing::Instrument::instrument(self, span.clone())
    }
}

impl<F: std::future::Future> InSpan for F {}

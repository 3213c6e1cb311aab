//! One trace through the example's three hops (feature `otel`, which the test build turns on),
//! exported in memory, against the real RabbitMQ: an order the orders side publishes twice
//! from its checkout span (a retry), billing charging it once (its `InvoiceIssued` staged in
//! the outbox and relayed), notifications calling the provider: every delivery in the
//! checkout's trace, the retried one a duplicate, the notification under the charge.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_examples::billing::{self, Billing};
use idem_examples::notifications;
use idem_examples::orders::{self, OrderPlaced};
use idem_examples::stub::Stub;
use idem_rabbitmq::lapin::ExchangeKind;
use idem_rabbitmq::{AmqpUrl, Consumer, Relay};
use idem_runtime::Inbox;
use idem_runtime::outbox::Outbox;
use idem_tests::otel::{assert_retried_message_is_one_trace, in_memory_traces};
use idem_tests::{Backend, TestBroker, TestDb, rabbit, unique};
use tracing::Instrument;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retried_order_is_one_trace_through_billing_and_notifications() {
    let (exporter, provider) = in_memory_traces();
    let broker = TestBroker::connect().await;
    let name = unique("traced");
    let exchange = format!("{name}.orders");
    let topology = broker.track(billing::topology_on(&format!("{name}.billing"), &exchange));
    broker.track_exchange(&exchange);
    broker.declare(&topology).await;
    let events = format!("{name}.events");
    broker.declare_exchange(&events, ExchangeKind::Topic).await;
    broker.track_exchange(&events);
    let notified = broker.track(notifications::topology_on(&format!("{name}.notifications")));
    let url = AmqpUrl::new(rabbit::amqp_url());
    let provider_stub = Stub::start("127.0.0.1:0").await.unwrap();

    let db = TestDb::connect(Backend::Sqlite).await;
    billing::create_tables(&db.db).await.unwrap();
    let outbox = Outbox::builder(db.db.clone()).build().await.unwrap();
    let inbox = Inbox::builder(db.db.clone())
        .outbox(outbox.clone())
        .build()
        .await
        .unwrap();
    let relay = Relay::builder(url.clone(), outbox).start().await.unwrap();
    let service = Arc::new(Billing {
        events_exchange: events.clone(),
    });
    let charging = Consumer::builder(url.clone(), inbox.clone())
        .connection_name(unique("traced billing"))
        .bind(topology.clone(), service.charge_handler())
        .start()
        .await
        .unwrap();
    let notifying = notifications::start(
        &url,
        inbox,
        notified.queue(),
        &events,
        provider_stub.notify_url(),
        &unique("traced notifications"),
    )
    .await
    .unwrap();

    let order = OrderPlaced {
        order_id: format!("{name}-1"),
        customer: "customer-1".to_owned(),
        amount_cents: 1_250,
    };
    let checkout = tracing::info_span!("checkout");
    async {
        // Published again: the first confirm was lost.
        for _ in 0..2 {
            orders::publish_to(&broker.publisher, &exchange, &order)
                .await
                .unwrap();
        }
    }
    .instrument(checkout.clone())
    .await;
    drop(checkout);

    let deadline = Instant::now() + Duration::from_secs(60);
    while provider_stub.stats().distinct_keys < 1 || broker.depth(topology.queue()).await > 0 {
        assert!(Instant::now() < deadline, "the order was never notified");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    charging.shutdown().await;
    notifying.shutdown().await;
    relay.shutdown().await;
    provider.force_flush().expect("flushed");
    let spans = exporter.get_finished_spans().expect("spans");
    assert_retried_message_is_one_trace(&spans, "checkout", topology.queue(), notified.queue());
    assert_eq!(provider_stub.stats().calls, 1);
}

//! The example's handlers under the fault-injection kit (idem-testkit), without a broker:
//! orders placed through the orders service's endpoint and charged by billing, and billing's
//! charges notified by the notifications service through its provider stub, while workers
//! crash at every boundary, copies race, leases run out and the outbox relay crashes. Each
//! order is placed, invoiced and notified exactly once, on each backend.
//!
//! Run: `cargo test -p idem-examples --test services faults::` with PostgreSQL and MariaDB up (see
//! README).

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::Request;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use idem_examples::billing::{self, Billing};
use idem_examples::notifications::{InvoiceIssued, Notifications, idempotency_key};
use idem_examples::orders::OrderPlaced;
use idem_examples::placing::{self, PlaceOrder};
use idem_examples::stub::Stub;
use idem_http::{Endpoint, EndpointError};
use idem_runtime::fingerprint::{Fingerprint, FingerprintError};
use idem_runtime::{Context, Handler, KeyError, MessageKey, Metadata};
use idem_testkit::{Downstream, Effects, FaultKit, Report};
use idem_tests::{Backend, TestDb, on_each_backend, unique};

on_each_backend!(
    billing_charges_and_notifications_notify_each_order_once_under_faults,
    orders_are_placed_and_charged_once_under_faults,
);

/// The seeds each test runs: fixed, so that a failure names a seed that replays it.
const SEEDS: [u64; 3] = [1, 2, 20_261_204];

/// Order `i` of a run whose order ids start with `run`.
fn order(run: &str, index: usize) -> OrderPlaced {
    OrderPlaced {
        order_id: format!("{run}-{index}"),
        customer: format!("customer-{}", index % 3),
        amount_cents: 1_000 + index as i64,
    }
}

/// The kit on `db`'s fresh tables, for the orders of `run`.
fn kit(db: &TestDb, run: &str, effects: Effects<OrderPlaced>, seed: u64) -> FaultKit<OrderPlaced> {
    let run = run.to_owned();
    FaultKit::new(db.db.clone(), move |index| order(&run, index), effects)
        .tables(db.table("kit_inbox"), db.table("kit_outbox"))
        .seed(seed)
}

/// Invoices written for an order: billing's effect.
fn invoices() -> Effects<OrderPlaced> {
    Effects::rows("invoices", "order_id", |order: &OrderPlaced| {
        order.order_id.clone()
    })
}

async fn billing_charges_and_notifications_notify_each_order_once_under_faults(backend: Backend) {
    let db = TestDb::connect(backend).await;
    billing::create_tables(&db.db).await.unwrap();
    let stub = Stub::start("127.0.0.1:0").await.unwrap();
    let events = unique("billing_events");
    let charging = Arc::new(Billing {
        events_exchange: events.clone(),
    });
    for seed in SEEDS {
        let run = unique("kit");
        let notifying = Arc::new(Notifications {
            provider_url: stub.notify_url(),
        });
        // A notification is sent once per `Idempotency-Key` the provider sees for the order;
        // the service's key for it is derived from the order.
        let notified = {
            let stub = stub.clone();
            Effects::counted(move |event: &InvoiceIssued| {
                let key = idempotency_key(&event.order_id).expect("a valid order id");
                stub.calls_with([&key]).distinct_keys
            })
        };
        let report = kit(&db, &run, invoices(), seed)
            .downstream(Downstream::new(
                events.as_str(),
                notifying.notify_handler(),
                notified,
            ))
            .run(&charging.charge_handler())
            .await
            .unwrap();
        report.assert_effectively_once();
        assert_every_order_counted(&db, &run, &report).await;
        // Every order's notification reached the provider under its key: the relay and the
        // downstream deliveries ran.
        let keys: Vec<String> = (0..report.schedule.messages)
            .map(|index| idempotency_key(&order(&run, index).order_id).expect("a valid id"))
            .collect();
        let notified = stub.calls_with(&keys).distinct_keys;
        assert_eq!(notified, report.schedule.messages as u64, "{report}");
    }
}

/// The orders service's endpoint as a handler, run through the inbox as idem-http's
/// transactional endpoint runs it: the client's `Idempotency-Key` is the message key, the
/// order its request's body.
struct PlaceOrderHandler(PlaceOrder);

impl Handler for PlaceOrderHandler {
    type Message = OrderPlaced;
    type Output = u16;
    type Error = EndpointError;

    fn consumer(&self) -> &str {
        placing::CONSUMER
    }

    fn key(&self, order: &OrderPlaced, _: &Metadata) -> Result<MessageKey, KeyError> {
        MessageKey::new(format!("place-{}", order.order_id))
    }

    fn fingerprint(
        &self,
        order: &OrderPlaced,
        metadata: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        metadata.content_fingerprint(order).map(Some)
    }

    async fn handle(&self, cx: &Context<'_>, order: OrderPlaced) -> Result<u16, EndpointError> {
        let body = serde_json::to_vec(&order).expect("an order serializes");
        let request = Request::post("/orders")
            .header(CONTENT_TYPE, "application/json")
            // The service places orders for a known client only (`placing::client`).
            .header(AUTHORIZATION, "Bearer kit")
            .body(Bytes::from(body))
            .expect("a valid request");
        let response = self.0.handle(cx, request).await?;
        Ok(response.status().as_u16())
    }
}

async fn orders_are_placed_and_charged_once_under_faults(backend: Backend) {
    let db = TestDb::connect(backend).await;
    placing::create_table(&db.db).await.unwrap();
    billing::create_tables(&db.db).await.unwrap();
    let exchange = unique("orders");
    let placing = PlaceOrderHandler(PlaceOrder {
        exchange: exchange.clone(),
    });
    let charging = Arc::new(Billing {
        events_exchange: unique("billing_events"),
    });
    for seed in SEEDS {
        let run = unique("kit");
        let placed = Effects::rows(placing::TABLE, "order_id", |order: &OrderPlaced| {
            order.order_id.clone()
        });
        let report = kit(&db, &run, placed, seed)
            .downstream(Downstream::new(
                exchange.as_str(),
                charging.charge_handler(),
                invoices(),
            ))
            .run(&placing)
            .await
            .unwrap();
        report.assert_effectively_once();
        assert_every_order_counted(&db, &run, &report).await;
    }
}

/// Every order of the run has its invoice: none went unseen, upstream or downstream.
async fn assert_every_order_counted(db: &TestDb, run: &str, report: &Report) {
    let invoiced = billing::count_invoices(&db.db, run).await.unwrap();
    assert_eq!(invoiced, report.schedule.messages as i64, "{report}");
}

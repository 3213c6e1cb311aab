//! The orders service's side: the event it publishes, and a demo publisher.

use std::sync::atomic::{AtomicUsize, Ordering};

use idem_rabbitmq::{PublishOptions, Publisher};
use serde::{Deserialize, Serialize};

/// The exchange orders are published to.
pub const EXCHANGE: &str = "orders";
/// The routing key of `OrderPlaced` events.
pub const ROUTING_KEY: &str = "order.placed";

/// An order was placed: billing charges it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderPlaced {
    /// The order's id, unique per logical order: the message key.
    pub order_id: String,
    /// Who pays.
    pub customer: String,
    /// How much, in cents.
    pub amount_cents: i64,
}

/// What a demo run published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoPlan {
    /// The prefix of this run's order ids.
    pub run: String,
    /// Distinct orders.
    pub orders: usize,
    /// Messages published, copies included.
    pub deliveries: usize,
    /// Orders published twice, as a producer that missed its confirm does.
    pub producer_retries: usize,
    /// Orders whose amount is invalid (billing refuses them for good).
    pub invalid: usize,
    /// Order ids reused for different content.
    pub reused_ids: usize,
    /// The ids of the valid orders, each to be charged once.
    pub valid: Vec<String>,
}

/// Publishes `count` orders to `exchange`: every tenth twice (a producer retry), one with an
/// invalid amount, and one more message that reuses the first order's id with another amount.
/// `published` counts the orders sent so far, for a progress line.
pub async fn publish_demo(
    publisher: &Publisher,
    exchange: &str,
    count: usize,
    published: &AtomicUsize,
) -> Result<DemoPlan, idem_rabbitmq::Error> {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let mut plan = DemoPlan {
        run: run.clone(),
        orders: count,
        deliveries: 0,
        producer_retries: 0,
        invalid: 0,
        reused_ids: 0,
        valid: Vec::with_capacity(count),
    };
    for i in 0..count {
        let order = OrderPlaced {
            order_id: format!("{run}-{i:05}"),
            customer: format!("customer-{}", i % 7),
            amount_cents: if i == 7 { 0 } else { 1_000 + i as i64 },
        };
        if order.amount_cents > 0 {
            plan.valid.push(order.order_id.clone());
        } else {
            plan.invalid += 1;
        }
        let copies = if i % 10 == 9 { 2 } else { 1 };
        for _ in 0..copies {
            publish_to(publisher, exchange, &order).await?;
            plan.deliveries += 1;
        }
        plan.producer_retries += copies - 1;
        published.fetch_add(1, Ordering::Relaxed);
    }
    if count > 0 {
        let reused = OrderPlaced {
            order_id: format!("{run}-00000"),
            customer: "someone-else".to_owned(),
            amount_cents: 99_999,
        };
        publish_to(publisher, exchange, &reused).await?;
        plan.deliveries += 1;
        plan.reused_ids += 1;
    }
    Ok(plan)
}

/// Publishes one order to [`EXCHANGE`], its id as the message id.
pub async fn publish(
    publisher: &Publisher,
    order: &OrderPlaced,
) -> Result<String, idem_rabbitmq::Error> {
    publish_to(publisher, EXCHANGE, order).await
}

/// Publishes one order to `exchange`, its id as the message id.
pub async fn publish_to(
    publisher: &Publisher,
    exchange: &str,
    order: &OrderPlaced,
) -> Result<String, idem_rabbitmq::Error> {
    let options = PublishOptions::default()
        .message_id(order.order_id.as_str())
        .correlation_id(format!("checkout-{}", order.order_id));
    publisher
        .publish(exchange, ROUTING_KEY, order, options)
        .await
}

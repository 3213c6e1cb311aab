//! Copies of a delivered message, published again with confirms: to the dead-letter exchange
//! with the reason, or back to a quorum queue for a retry the broker must not count.

use std::time::Duration;

use lapin::BasicProperties;
use lapin::message::Delivery;
use lapin::types::{AMQPValue, FieldTable, ShortString};

use super::headers;
use crate::confirm::{ConfirmChannel, NotTaken};

/// How long a copy may wait for the broker's confirm; past it, the copy counts as not taken.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

/// The original's headers without the broker's delivery count, which belongs to the original
/// (a copy starts afresh), without sender-selected destinations (`CC`, `BCC`), which would send
/// the copy to their queues too, and without `dropped`.
pub(crate) fn headers_of(delivery: &Delivery, dropped: &[&str]) -> FieldTable {
    let mut headers = delivery
        .properties
        .headers()
        .as_ref()
        .map(|table| table.inner().clone())
        .unwrap_or_default();
    for name in ["x-delivery-count", "CC", "BCC"].iter().chain(dropped) {
        headers.remove(*name);
    }
    FieldTable::from(headers)
}

/// Where a message was first published: an exchange and a routing key.
pub(crate) struct Route {
    pub(crate) exchange: String,
    pub(crate) routing_key: String,
}

/// The route `delivery` first came by: its own, unless it came through the default exchange to
/// `queue` with a route noted in its headers (a fresh copy of an uncounted requeue, or a letter
/// moved back to the queue).
pub(crate) fn first_route(delivery: &Delivery, queue: &str) -> Route {
    let noted = |name: &str| match delivery.properties.headers().as_ref()?.inner().get(name)? {
        AMQPValue::LongString(value) => {
            Some(String::from_utf8_lossy(value.as_bytes()).into_owned())
        }
        AMQPValue::ShortString(value) => Some(value.as_str().to_owned()),
        _ => None,
    };
    if delivery.exchange.as_str().is_empty()
        && delivery.routing_key.as_str() == queue
        && let (Some(exchange), Some(routing_key)) =
            (noted(headers::EXCHANGE), noted(headers::ROUTING_KEY))
    {
        return Route {
            exchange,
            routing_key,
        };
    }
    Route {
        exchange: delivery.exchange.to_string(),
        routing_key: delivery.routing_key.to_string(),
    }
}

/// Notes `route` in a copy's `headers`.
pub(crate) fn note_route(headers: &mut FieldTable, route: &Route) {
    for (name, value) in [
        (headers::EXCHANGE, &route.exchange),
        (headers::ROUTING_KEY, &route.routing_key),
    ] {
        headers.insert(
            ShortString::from(name),
            AMQPValue::LongString(value.as_str().into()),
        );
    }
}

/// The properties of a copy: the original's, persistent, with `headers`, without its `user_id`
/// (which the broker checks against this connection's user), and with its `expiration` only if
/// `keep_expiration` (a dead-letter copy that expired would be lost, the original being acked).
pub(crate) fn properties_of(
    original: &BasicProperties,
    headers: FieldTable,
    keep_expiration: bool,
) -> BasicProperties {
    let mut properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(headers);
    if let Some(value) = original.content_type().clone() {
        properties = properties.with_content_type(value);
    }
    if let Some(value) = original.content_encoding().clone() {
        properties = properties.with_content_encoding(value);
    }
    if let Some(value) = original.correlation_id().clone() {
        properties = properties.with_correlation_id(value);
    }
    if let Some(value) = original.reply_to().clone() {
        properties = properties.with_reply_to(value);
    }
    if let Some(value) = original.message_id().clone() {
        properties = properties.with_message_id(value);
    }
    if let Some(value) = original.kind().clone() {
        properties = properties.with_type(value);
    }
    if let Some(value) = original.app_id().clone() {
        properties = properties.with_app_id(value);
    }
    if let Some(value) = *original.priority() {
        properties = properties.with_priority(value);
    }
    if let Some(value) = *original.timestamp() {
        properties = properties.with_timestamp(value);
    }
    if keep_expiration && let Some(value) = original.expiration().clone() {
        properties = properties.with_expiration(value);
    }
    properties
}

/// Publishes `delivery`'s payload with `properties` to `exchange` and waits for the broker's
/// confirm (on a channel in confirm mode). Says why when the broker did not take it.
pub(crate) async fn publish(
    channel: &ConfirmChannel,
    delivery: &Delivery,
    exchange: &str,
    routing_key: &str,
    properties: BasicProperties,
) -> Result<(), String> {
    let data = &delivery.data;
    let sent = channel.publish(exchange, routing_key, data, properties, CONFIRM_TIMEOUT);
    sent.await.map_err(|problem| match problem {
        NotTaken::Unroutable { reply_text } => format!(
            "exchange {exchange:?} routes routing key {routing_key:?} to no queue ({reply_text})"
        ),
        problem => problem.to_string(),
    })
}

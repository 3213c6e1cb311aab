//! Copies of a delivered message, published again with confirms: to the dead-letter exchange
//! with the reason, or back to a quorum queue for a retry the broker must not count.

use std::time::Duration;

use lapin::BasicProperties;
use lapin::message::Delivery;
use lapin::types::FieldTable;

use crate::confirm::{ConfirmChannel, NotTaken};

/// How long a copy may wait for the broker's confirm; past it, the copy counts as not taken.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

/// The original's headers without the broker's delivery count, which belongs to the original: a
/// copy starts afresh.
pub(crate) fn headers_of(delivery: &Delivery) -> FieldTable {
    let mut headers = delivery
        .properties
        .headers()
        .as_ref()
        .map(|table| table.inner().clone())
        .unwrap_or_default();
    headers.remove("x-delivery-count");
    FieldTable::from(headers)
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
    channel
        .publish(
        exchange,
        routing_key,
        &delivery.data,
        properties,
        CONFIRM_TIMEOUT,
    )
    .await
    .map_err(|problem| match problem {
        NotTaken::Unroutable { reply_text } => format!(
            "exchange {exchange:?} routes routing key {routing_key:?} to no queue ({reply_text})"
        ),
        problem => problem.to_string(),
    })
}

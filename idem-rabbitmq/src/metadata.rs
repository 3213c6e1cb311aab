//! What a delivery tells the inbox: message id, correlation id, headers and CloudEvents
//! attributes.

use idem_runtime::{Metadata, transport::CloudEvent};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};

/// The prefixes of CloudEvents attributes in AMQP headers: the AMQP binding's `cloudEvents:`, and
/// the `cloudEvents_` that JMS-style clients use because `:` is not allowed there.
const CLOUD_EVENT_PREFIXES: [&str; 2] = ["cloudEvents:", "cloudEvents_"];

/// Reads a delivery's properties into [`Metadata`]. Header values that are text or numbers are
/// kept as text; others (tables, arrays, byte arrays) are left out.
pub fn metadata_of(properties: &BasicProperties, redelivered: bool) -> Metadata {
    let headers: std::collections::BTreeMap<String, String> = properties
        .headers()
        .as_ref()
        .map(|table| {
            table
                .inner()
                .iter()
                .filter_map(|(name, value)| Some((name.as_str().to_owned(), header_text(value)?)))
                .collect()
        })
        .unwrap_or_default();
    let cloud_event = cloud_event_of(&headers);
    Metadata {
        message_id: properties.message_id().as_ref().map(|id| id.to_string()),
        correlation_id: properties
            .correlation_id()
            .as_ref()
            .map(|id| id.to_string()),
        redelivered,
        headers,
        cloud_event,
        // The codec fingerprints the payload, once it has decoded it.
        payload_fingerprint: None,
    }
}

fn cloud_event_of(headers: &std::collections::BTreeMap<String, String>) -> Option<CloudEvent> {
    let attribute = |name: &str| {
        CLOUD_EVENT_PREFIXES
            .iter()
            .find_map(|prefix| headers.get(&format!("{prefix}{name}")).cloned())
    };
    Some(CloudEvent {
        source: attribute("source")?,
        id: attribute("id")?,
        event_type: attribute("type"),
    })
}

fn header_text(value: &AMQPValue) -> Option<String> {
    Some(match value {
        AMQPValue::LongString(text) => String::from_utf8(text.as_bytes().to_vec()).ok()?,
        AMQPValue::ShortString(text) => text.as_str().to_owned(),
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::ShortShortInt(n) => n.to_string(),
        AMQPValue::ShortShortUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::Timestamp(n) => n.to_string(),
        _ => return None,
    })
}

/// How many times the broker delivered this message before: the quorum queues' `x-delivery-count`
/// header, 0 when absent (first delivery). Only a quorum queue's delivery carries a count of its
/// own; elsewhere the header is a stale copy.
pub(crate) fn broker_delivery_count(headers: Option<&FieldTable>) -> u32 {
    let value = headers.and_then(|table| table.inner().get("x-delivery-count"));
    let count = match value {
        Some(AMQPValue::LongLongInt(n)) => *n,
        Some(AMQPValue::LongInt(n)) => i64::from(*n),
        Some(AMQPValue::LongUInt(n)) => i64::from(*n),
        Some(AMQPValue::ShortInt(n)) => i64::from(*n),
        Some(AMQPValue::ShortUInt(n)) => i64::from(*n),
        _ => 0,
    };
    u32::try_from(count).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::ShortString;

    fn properties(headers: &[(&str, AMQPValue)]) -> BasicProperties {
        let mut table = FieldTable::default();
        for (name, value) in headers {
            table.insert(ShortString::from(*name), value.clone());
        }
        BasicProperties::default()
            .with_message_id("m-1".into())
            .with_correlation_id("c-1".into())
            .with_headers(table)
    }

    #[test]
    fn ids_and_text_headers_are_read() {
        let meta = metadata_of(
            &properties(&[
                ("tenant", AMQPValue::LongString("acme".into())),
                ("retries", AMQPValue::LongInt(3)),
                ("blob", AMQPValue::FieldTable(FieldTable::default())),
            ]),
            true,
        );
        assert_eq!(meta.message_id(), Some("m-1"));
        assert_eq!(meta.correlation_id.as_deref(), Some("c-1"));
        assert_eq!(meta.header("tenant"), Some("acme"));
        assert_eq!(meta.header("retries"), Some("3"));
        assert_eq!(meta.header("blob"), None);
        assert!(meta.redelivered);
    }

    #[test]
    fn cloud_events_attributes_with_either_prefix() {
        for prefix in CLOUD_EVENT_PREFIXES {
            let meta = metadata_of(
                &properties(&[
                    (
                        &format!("{prefix}source"),
                        AMQPValue::LongString("/orders".into()),
                    ),
                    (&format!("{prefix}id"), AMQPValue::LongString("42".into())),
                ]),
                false,
            );
            let event = meta.cloud_event.clone().expect("a CloudEvent");
            assert_eq!(
                (event.source.as_str(), event.id.as_str()),
                ("/orders", "42")
            );
            assert_eq!(
                meta.cloud_event_key().unwrap(),
                idem_runtime::MessageKey::cloud_event("/orders", "42").unwrap()
            );
        }
        assert!(metadata_of(&properties(&[]), false).cloud_event.is_none());
    }

    #[test]
    fn quorum_delivery_count_is_read() {
        let props = properties(&[("x-delivery-count", AMQPValue::LongLongInt(4))]);
        assert_eq!(broker_delivery_count(props.headers().as_ref()), 4);
        assert_eq!(broker_delivery_count(None), 0);
    }
}

//! CloudEvents keys: `source` + `id` from the event itself or from the transport's attributes.
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use idem_runtime::{Handler, MessageKey, Metadata, idempotent, transport::CloudEvent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Event<T> {
    pub source: String,
    pub id: String,
    pub data: T,
}

#[derive(Serialize, Deserialize)]
pub struct StockChanged {
    pub sku: String,
    pub quantity: i64,
}

/// Structured mode: the attributes are in the message.
#[idempotent(key = MessageKey::cloud_event(&ev.source, &ev.id), consumer = "stock", fingerprint = ev.data)]
async fn on_stock(tx: &DatabaseTransaction, ev: Event<StockChanged>) -> Result<i64, DbErr> {
    let _ = tx;
    Ok(ev.data.quantity)
}

/// Binary mode: the transport read the attributes from its headers.
#[idempotent(key = meta.cloud_event_key(), consumer = "stock-binary")]
async fn on_stock_binary(
    tx: &DatabaseTransaction,
    meta: &Metadata,
    change: StockChanged,
) -> Result<i64, DbErr> {
    let _ = (tx, meta);
    Ok(change.quantity)
}

fn main() {
    let expected = MessageKey::cloud_event("/warehouse", "e-1").unwrap();
    let ev = Event {
        source: "/warehouse".into(),
        id: "e-1".into(),
        data: StockChanged { sku: "s".into(), quantity: 1 },
    };
    let meta = Metadata {
        cloud_event: Some(CloudEvent {
            source: "/warehouse".into(),
            id: "e-1".into(),
            event_type: None,
        }),
        ..Metadata::default()
    };
    assert_eq!(on_stock_handler().key(&ev, &Metadata::default()).unwrap(), expected);
    assert_eq!(on_stock_binary_handler().key(&ev.data, &meta).unwrap(), expected);
    assert!(on_stock_binary_handler().key(&ev.data, &Metadata::default()).is_err());
}

//! `fingerprint = <expr>` chooses what counts as the same content; `fingerprint = none` turns the
//! check off.
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use idem_runtime::{Handler, Metadata, idempotent};
use idem_runtime::fingerprint::Fingerprint;
use serde::{Deserialize, Serialize};

#[derive(Clone, Serialize, Deserialize)]
pub struct OrderPlaced {
    pub id: String,
    pub amount: i64,
    pub sent_at: String,
}

#[idempotent(key = order.id, consumer = "billing", fingerprint = (&order.id, order.amount))]
async fn charge(tx: &DatabaseTransaction, order: OrderPlaced) -> Result<i64, DbErr> {
    let _ = tx;
    Ok(order.amount)
}

/// A message that is not `Serialize` needs no fingerprint when the check is off.
pub struct Ping {
    pub id: String,
}

#[idempotent(key = ping.id, consumer = "pings", fingerprint = none)]
async fn ping(tx: &DatabaseTransaction, ping: Ping) -> Result<bool, DbErr> {
    let _ = (tx, ping);
    Ok(true)
}

fn main() {
    let handler = charge_handler();
    let order = OrderPlaced { id: "o-1".into(), amount: 5, sent_at: "10:00".into() };
    let resent = OrderPlaced { sent_at: "10:05".into(), ..order.clone() };
    assert_eq!(handler.fingerprint(&order, &idem_runtime::Metadata::default()).unwrap(), handler.fingerprint(&resent, &idem_runtime::Metadata::default()).unwrap());
    assert_eq!(
        handler.fingerprint(&order, &idem_runtime::Metadata::default()).unwrap(),
        Some(Fingerprint::of(&("o-1", 5)).unwrap())
    );
    let handler = ping_handler();
    let ping = Ping { id: "p".into() };
    assert_eq!(handler.fingerprint(&ping, &idem_runtime::Metadata::default()).unwrap(), None);
    assert_eq!(handler.key(&ping, &Metadata::default()).unwrap().as_str(), "p");
}

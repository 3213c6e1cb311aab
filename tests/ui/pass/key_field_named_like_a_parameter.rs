//! A key that reads a field named like another parameter: `payment.tx` is the message's field,
//! not the transaction `tx`.
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use idem_runtime::{Context, Handler, Metadata, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Payment {
    pub tx: String,
    pub cx: u64,
}

#[idempotent(key = payment.tx, consumer = "payments")]
async fn settle(tx: &DatabaseTransaction, payment: Payment) -> Result<(), DbErr> {
    let _ = (tx, payment);
    Ok(())
}

#[idempotent(key = format!("{}-{}", payment.tx, payment.cx), mode = two_phase)]
async fn notify(cx: &Context<'_>, payment: Payment) -> Result<(), DbErr> {
    let _ = (cx, payment);
    Ok(())
}

fn main() {
    let payment = Payment { tx: "t-1".into(), cx: 2 };
    let meta = Metadata::default();
    assert_eq!(settle_handler().key(&payment, &meta).unwrap().as_str(), "t-1");
    assert_eq!(notify_handler().key(&payment, &meta).unwrap().as_str(), "t-1-2");
}

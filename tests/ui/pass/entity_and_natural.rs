use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use idem_runtime::{Context, Handler, Mode, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

#[idempotent(key = order.id, mode = entity)]
async fn invoice(cx: &Context<'_>, order: Order) -> Result<(), DbErr> {
    let _ = (cx.fingerprint(), order);
    Ok(())
}

#[idempotent(key = order.id, mode = natural)]
async fn upsert(tx: &DatabaseTransaction, order: Order) -> Result<(), DbErr> {
    let _ = (tx, order);
    Ok(())
}

#[idempotent(key = order.id, mode = natural)]
async fn without_transaction(order: Order) -> Result<(), DbErr> {
    let _ = order;
    Ok(())
}

fn main() {
    assert_eq!(invoice_handler().mode(), Mode::Entity);
    assert_eq!(upsert_handler().mode(), Mode::Natural);
    assert_eq!(without_transaction_handler().mode(), Mode::Natural);
}

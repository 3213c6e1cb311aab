use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use idem_runtime::{Metadata, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

#[idempotent(key = (order.id.as_str(), meta.redelivered))]
async fn charge(tx: &DatabaseTransaction, meta: &Metadata, order: Order) -> Result<(), DbErr> {
    let _ = (tx, meta, order);
    Ok(())
}

#[idempotent(key = format!("{}-{:?}", order.id, std::time::SystemTime::now()))]
async fn refund(tx: &DatabaseTransaction, order: Order) -> Result<(), DbErr> {
    let _ = (tx, order);
    Ok(())
}

#[idempotent(key = meta.correlation_id.clone(), consumer = "ship")]
async fn ship(meta: &Metadata, order: Order) -> Result<(), DbErr> {
    let _ = (meta, order);
    Ok(())
}

fn main() {}

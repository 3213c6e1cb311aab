#![allow(unused_imports)]
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use idem_runtime::{Metadata, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

#[idempotent(key = order.id, consumer = "billing")]
async fn charge(
    tx: &DatabaseTransaction,
    #[cfg(test)] meta: &Metadata,
    order: Order,
) -> Result<(), DbErr> {
    let _ = (tx, order);
    Ok(())
}

fn main() {
    let _ = charge_handler();
}

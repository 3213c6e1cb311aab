#![allow(unused_imports)]
use idem_runtime::idempotent;
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

#[idempotent(key = order.id)]
async fn charge(
    tx: &DatabaseTransaction,
    other: &idem_runtime::sea_orm::DatabaseTransaction,
    order: Order,
) -> Result<(), DbErr> {
    let _ = (tx, other, order);
    Ok(())
}

fn main() {}

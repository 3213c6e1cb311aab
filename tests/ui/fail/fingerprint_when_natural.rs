#![allow(unused_imports)]
use idem_runtime::idempotent;
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use idem_runtime::Context;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

#[idempotent(key = order.id, mode = natural, fingerprint = order.id)]
async fn charge(tx: &DatabaseTransaction, order: Order) -> Result<(), DbErr> {
    let _ = (tx, order);
    Ok(())
}

fn main() {}

#![allow(unused_imports)]
use idem_runtime::idempotent;
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

#[derive(Clone, Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

#[idempotent(key = meta.message_id(), slice)]
async fn charge_all(tx: &DatabaseTransaction, orders: Vec<Order>) -> Result<Vec<()>, DbErr> {
    let _ = (tx, orders);
    Ok(vec![])
}

fn main() {}

#![allow(unused_imports)]
use idem_runtime::idempotent;
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

#[derive(Clone, Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

#[idempotent(key = order.id, slice)]
async fn charge_all(tx: &DatabaseTransaction, order: Order) -> Result<Vec<()>, DbErr> {
    let _ = (tx, order);
    Ok(vec![])
}

#[idempotent(key = order.id, slice)]
async fn ship_all(tx: &DatabaseTransaction, orders: Vec<Order>) -> Result<(), DbErr> {
    let _ = (tx, orders);
    Ok(())
}

fn main() {}

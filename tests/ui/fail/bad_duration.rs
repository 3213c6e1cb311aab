#![allow(unused_imports)]
use idem_runtime::idempotent;
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

#[idempotent(key = order.id, mode = two_phase, lease = "30 seconds")]
async fn notify(order: Order) -> Result<(), DbErr> {
    let _ = order;
    Ok(())
}

fn main() {}

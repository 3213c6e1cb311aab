//! A slice handler's key may call a function on one message: the function is not taken for the
//! message's name.
use idem_runtime::idempotent;
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

#[derive(Clone, Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

fn normalized(id: &str) -> String {
    id.trim().to_lowercase()
}

#[idempotent(key = normalized(&order.id), slice)]
async fn charge_all(tx: &DatabaseTransaction, orders: Vec<Order>) -> Result<Vec<()>, DbErr> {
    let _ = tx;
    Ok(orders.iter().map(|_| ()).collect())
}

fn main() {
    let _ = charge_all_handler();
}

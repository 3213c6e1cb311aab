use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use idem_runtime::idempotent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

#[idempotent(key = order.id)]
async fn charge(tx: &DatabaseTransaction, order: Order) -> Result<(), DbErr> {
    let amount = ;
    let _ = (tx, order, amount);
    Ok(())
}

fn main() {
    let _ = charge_handler();
}

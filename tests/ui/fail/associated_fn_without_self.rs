use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use idem_runtime::idempotent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

pub struct Billing;

impl Billing {
    fn validate(order: &Order) -> bool {
        !order.id.is_empty()
    }

    #[idempotent(key = order.id)]
    async fn charge(tx: &DatabaseTransaction, order: Order) -> Result<(), DbErr> {
        let _ = (tx, Self::validate(&order));
        Ok(())
    }
}

fn main() {
    let _ = Billing::charge_handler();
}

use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use idem_runtime::idempotent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

pub struct Billing;

impl Billing {
    // Nothing here says `Self`: the macro reads the file to know where it is.
    #[idempotent(key = order.id)]
    async fn charge(tx: &DatabaseTransaction, order: Order) -> Result<(), DbErr> {
        let _ = (tx, order);
        Ok(())
    }
}

fn main() {
    let _ = Billing::charge_handler();
}

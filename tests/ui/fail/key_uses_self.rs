use idem_runtime::idempotent;
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

pub struct Billing {
    pub prefix: String,
}

impl Billing {
    #[idempotent(key = format!("{}{}", self.prefix, order.id), consumer = "billing")]
    async fn charge(&self, tx: &DatabaseTransaction, order: Order) -> Result<(), DbErr> {
        let _ = (tx, order);
        Ok(())
    }
}

fn main() {}

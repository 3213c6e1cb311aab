use idem_runtime::idempotent;
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

pub trait OrderSink {
    async fn on_order(&self, tx: &DatabaseTransaction, order: Order) -> Result<(), DbErr>;
}

pub struct Billing;

impl OrderSink for Billing {
    #[idempotent(key = order.id, consumer = "billing")]
    async fn on_order(&self, tx: &DatabaseTransaction, order: Order) -> Result<(), DbErr> {
        let _ = (tx, order);
        Ok(())
    }
}

fn main() {}

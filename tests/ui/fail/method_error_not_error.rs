#![allow(unused_imports)]
use idem_runtime::idempotent;
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

#[derive(Debug)]
pub struct BillingError;


pub struct Billing;

impl Billing {
    #[idempotent(key = order.id, consumer = "billing")]
    async fn charge(&self, tx: &DatabaseTransaction, order: Order) -> Result<(), BillingError> {
        let _ = (tx, order);
        Ok(())
    }
}

fn main() {}

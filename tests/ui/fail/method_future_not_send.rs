#![allow(unused_imports)]
use idem_runtime::idempotent;
use idem_runtime::sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

pub struct Billing;

impl Billing {
    #[idempotent(key = order.id, consumer = "billing")]
    async fn charge(&self, tx: &DatabaseTransaction, order: Order) -> Result<(), DbErr> {
        let local = std::rc::Rc::new(order);
        tx.execute_unprepared("SELECT 1").await?;
        drop(local);
        Ok(())
    }
}

fn main() {}

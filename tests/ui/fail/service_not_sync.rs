#![allow(unused_imports)]
use std::cell::Cell;

use idem_runtime::idempotent;
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

pub struct Billing {
    pub charged: Cell<u32>,
}

impl Billing {
    #[idempotent(key = order.id, consumer = "billing")]
    async fn charge(&self, tx: &DatabaseTransaction, order: Order) -> Result<(), DbErr> {
        let _ = (tx, order);
        Ok(())
    }
}

fn main() {}

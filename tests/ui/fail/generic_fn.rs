#![allow(unused_imports)]
use idem_runtime::idempotent;
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

#[idempotent(key = format!("{:p}", &order))]
async fn charge<T: Serialize + Send>(tx: &DatabaseTransaction, order: T) -> Result<(), DbErr> {
    let _ = (tx, order);
    Ok(())
}

fn main() {}

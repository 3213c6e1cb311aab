#![allow(unused_imports)]
use idem_runtime::idempotent;
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

#[idempotent(key = meta.message_id())]
async fn charge(tx: &DatabaseTransaction, meta: &idem_runtime::Metadata) -> Result<(), DbErr> {
    let _ = (tx, meta);
    Ok(())
}

fn main() {}

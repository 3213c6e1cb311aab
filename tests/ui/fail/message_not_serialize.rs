#![allow(unused_imports)]
use idem_runtime::idempotent;
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

pub struct Ping {
    pub id: String,
}

#[idempotent(key = ping.id)]
async fn ping(tx: &DatabaseTransaction, ping: Ping) -> Result<(), DbErr> {
    let _ = (tx, ping);
    Ok(())
}

fn main() {}

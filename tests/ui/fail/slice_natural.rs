#![allow(unused_imports)]
use idem_runtime::idempotent;
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use idem_runtime::Context;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

use idem_runtime::SliceContext;

#[idempotent(key = order.id, mode = natural, slice)]
async fn charge(cx: &SliceContext<'_>, orders: Vec<Order>) -> Result<Vec<()>, DbErr> {
    let _ = cx;
    Ok(orders.iter().map(|_| ()).collect())
}

fn main() {}

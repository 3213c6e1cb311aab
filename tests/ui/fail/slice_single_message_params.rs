#![allow(unused_imports)]
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use idem_runtime::{Context, Metadata, SliceContext, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Clone, Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

#[idempotent(key = order.id, slice, mode = two_phase)]
async fn charge_all(meta: &Metadata, orders: Vec<Order>) -> Result<Vec<()>, DbErr> {
    let _ = (meta, orders);
    Ok(vec![])
}

#[idempotent(key = order.id)]
async fn charge(cx: &SliceContext<'_>, order: Order) -> Result<(), DbErr> {
    let _ = (cx, order);
    Ok(())
}

fn main() {}

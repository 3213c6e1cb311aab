use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use idem_runtime::{Inbox, Metadata, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

#[idempotent(key = order.id, consumer = "billing")]
async fn charge(tx: &DatabaseTransaction, order: Order) -> Result<(), DbErr> {
    let _ = (tx, order);
    Ok(())
}

pub async fn run(inbox: &Inbox) {
    let order = Order { id: "o-1".into() };
    let _ = inbox.process(&charge, order, &Metadata::default()).await;
}

fn main() {}

use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use idem_runtime::{Inbox, Metadata, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

// A declaration, which a trait would accept: the missing body is the one error (not also the
// compiler's "free function without a body").
#[idempotent(key = order.id)]
async fn charge(tx: &DatabaseTransaction, order: Order) -> Result<(), DbErr>;

pub async fn run(inbox: &Inbox) {
    // No second error here: a stand-in `charge_handler()` stands for the handler.
    let _ = inbox.process(&charge_handler(), Order { id: "o-1".into() }, &Metadata::default()).await;
}

fn main() {}

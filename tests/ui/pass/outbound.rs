use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use idem_runtime::{OutboxMessage, idempotent};
use idem_runtime::outbox::Outbound;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

// A transactional handler stages an event with its writes; a staging's error converts into
// the database's.
#[idempotent(key = order.id)]
async fn charge(
    tx: &DatabaseTransaction,
    outbound: &Outbound<'_>,
    order: Order,
) -> Result<String, DbErr> {
    let _ = tx;
    let event = OutboxMessage::new("billing.events", "invoice.issued", order.id.into_bytes());
    Ok(outbound.stage(event).await?)
}

// A two-phase handler derives the keys it passes downstream.
#[idempotent(key = order.id, mode = two_phase)]
async fn notify(outbound: &Outbound<'_>, order: Order) -> Result<String, std::io::Error> {
    let _ = order;
    Ok(outbound.downstream_key())
}

fn main() {
    let _ = (charge_handler(), notify_handler());
}

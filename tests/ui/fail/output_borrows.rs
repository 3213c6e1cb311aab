use idem_runtime::{Context, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

#[derive(Debug, thiserror::Error)]
#[error("failed")]
pub struct Failed;

#[idempotent(key = order.id)]
async fn charge<'a>(cx: &Context<'a>, order: Order) -> Result<&'a str, Failed> {
    let _ = order;
    Ok(cx.message_key().as_str())
}

fn main() {}

use idem_runtime::idempotent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Quote {
    pub price: f64,
}

#[derive(Debug, thiserror::Error)]
#[error("failed")]
pub struct Failed;

#[idempotent(key = quote.price)]
async fn accept(quote: Quote) -> Result<(), Failed> {
    let _ = quote;
    Ok(())
}

fn main() {}

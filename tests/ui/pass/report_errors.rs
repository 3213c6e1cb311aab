//! Handlers returning report types: `anyhow::Result`, `eyre::Result`, a `use anyhow::Result`
//! alias, `Box<dyn Error + Send + Sync>`, in free functions and methods. Their errors are
//! transient unless `permanent = ...` (which sees the report's own type) says otherwise.
use std::sync::Arc;

use idem_runtime::{Handler, idempotent, transport::BoxError};
use idem_runtime::transport::Report;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: String,
}

#[derive(Debug, thiserror::Error)]
#[error("card declined")]
pub struct Declined;

fn is_declined(error: &anyhow::Error) -> bool {
    error.is::<Declined>()
}

#[idempotent(key = order.id, permanent = is_declined)]
async fn with_anyhow(order: Order) -> anyhow::Result<u32> {
    let _ = order;
    Ok(1)
}

#[idempotent(key = order.id)]
async fn with_eyre(order: Order) -> eyre::Result<u32> {
    let _ = order;
    Err(eyre::eyre!("down"))
}

#[idempotent(key = order.id)]
async fn with_boxed(order: Order) -> Result<(), BoxError> {
    let _ = order;
    Ok(())
}

mod aliased {
    use anyhow::Result;

    use super::Order;
    use idem_runtime::idempotent;

    #[idempotent(key = order.id)]
    pub(super) async fn with_alias(order: Order) -> Result<String> {
        Ok(order.id)
    }
}

pub struct Billing;

impl Billing {
    #[idempotent(key = order.id, consumer = "billing.charge", permanent = is_declined)]
    async fn charge(&self, order: Order) -> anyhow::Result<u32> {
        let _ = order;
        Ok(2)
    }

    #[idempotent(key = order.id, consumer = "billing.refund")]
    async fn refund(&self, order: Order) -> Result<u32, anyhow::Error> {
        let _ = order;
        Ok(3)
    }
}

fn errors_are<H: Handler<Error = E>, E>(_: &H) {}

fn main() {
    let handler = with_anyhow_handler();
    errors_are::<_, Report<anyhow::Error>>(&handler);
    assert!(handler.is_permanent(&Report::new(anyhow::Error::new(Declined))));
    assert!(!handler.is_permanent(&Report::new(anyhow::anyhow!("timeout"))));
    errors_are::<_, Report<eyre::Report>>(&with_eyre_handler());
    assert!(!with_eyre_handler().is_permanent(&Report::new(eyre::eyre!("down"))));
    errors_are::<_, Report<BoxError>>(&with_boxed_handler());
    errors_are::<_, Report<anyhow::Error>>(&aliased::with_alias_handler());

    let billing = Arc::new(Billing);
    let charge = billing.charge_handler();
    errors_are::<_, Report<anyhow::Error>>(&charge);
    assert!(charge.is_permanent(&Report::new(anyhow::Error::new(Declined))));
    errors_are::<_, Report<anyhow::Error>>(&billing.refund_handler());
}

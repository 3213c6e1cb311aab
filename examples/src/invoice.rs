//! Billing's entity-mode variant (`billing --keys entity`): the invoice is the marker. Its
//! primary key is the order id, so the invoice table itself tells a new order from a copy, with
//! no inbox record; a copy compares the stored invoice with the order it carries.

use idem_runtime::entity::{Created, Marker};
use idem_runtime::fingerprint::Fingerprint;
use idem_runtime::{Context, idempotent};
use sea_orm::ActiveValue::Set;

use crate::billing::{Billing, BillingError, Receipt, is_permanent};
use crate::orders::OrderPlaced;

/// The table of invoices keyed by their order.
pub const TABLE: &str = "invoices_by_order";

/// The invoice entity: one row per order, keyed by the order id.
pub mod entity {
    use sea_orm::entity::prelude::*;

    /// An invoice.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "invoices_by_order")]
    pub struct Model {
        /// The order charged: the primary key, and the marker of its `OrderPlaced`.
        #[sea_orm(primary_key, auto_increment = false)]
        pub order_id: String,
        /// Who pays.
        pub customer: String,
        /// How much, in cents.
        pub amount_cents: i64,
    }

    /// No relations.
    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// A copy of an order is the same order when its customer and amount are the invoice's: the
/// handler fingerprints the order's `(customer, amount_cents)`, the invoice gives the same from
/// its own fields, so no fingerprint column is needed.
impl Marker for entity::Model {
    fn fingerprint(&self) -> Option<Fingerprint> {
        Fingerprint::of(&(&self.customer, self.amount_cents)).ok()
    }
}

impl Billing {
    /// Charges an order in entity mode: creates its invoice, keyed by the order id, and stages
    /// an `InvoiceIssued` event with it; a copy finds the invoice and returns its receipt, and
    /// nothing of its run is kept.
    #[idempotent(
        key = order.order_id,
        consumer = "billing.charge",
        mode = entity,
        fingerprint = (order.customer, order.amount_cents),
        permanent = is_permanent
    )]
    pub async fn charge_by_entity(
        &self,
        cx: &Context<'_>,
        order: OrderPlaced,
    ) -> Result<Receipt, BillingError> {
        if order.amount_cents <= 0 {
            return Err(BillingError::InvalidAmount(order.amount_cents));
        }
        let invoice = entity::ActiveModel {
            order_id: Set(order.order_id.clone()),
            customer: Set(order.customer.clone()),
            amount_cents: Set(order.amount_cents),
        };
        if let Created::Existing(stored) = cx.create(invoice).await? {
            return Ok(Receipt {
                order_id: stored.order_id,
                amount_cents: stored.amount_cents,
            });
        }
        cx.stage(self.invoice_issued(&order)?).await?;
        Ok(Receipt {
            order_id: order.order_id,
            amount_cents: order.amount_cents,
        })
    }
}

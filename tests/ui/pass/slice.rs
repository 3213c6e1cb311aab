//! A slice handler: the fresh messages of a batch in one call, written in one multi-row insert.
use idem_runtime::sea_orm::sea_query::{Alias, Query};
use idem_runtime::sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr};
use idem_runtime::{
    Handler, Metadata, MessageKey, OutboxMessage, SliceContext, SliceHandler, idempotent,
};
use serde::{Deserialize, Serialize};

#[derive(Clone, Serialize, Deserialize)]
pub struct OrderPlaced {
    pub id: String,
    pub amount: i64,
}

#[derive(Serialize, Deserialize)]
pub struct Receipt {
    pub id: String,
}

#[idempotent(key = order.id, consumer = "billing.charge", slice)]
async fn charge_all(
    tx: &DatabaseTransaction,
    orders: Vec<OrderPlaced>,
) -> Result<Vec<Receipt>, DbErr> {
    let mut insert = Query::insert();
    insert.into_table(Alias::new("charges")).columns(["id", "amount"]);
    for order in &orders {
        insert.values_panic([order.id.as_str().into(), order.amount.into()]);
    }
    tx.execute(&insert).await?;
    Ok(orders.into_iter().map(|order| Receipt { id: order.id }).collect())
}

/// Each message stages through its own context; the fingerprint reads one message too.
#[idempotent(key = (order.id, order.amount), fingerprint = order.amount, slice)]
async fn announce_all(
    cx: &SliceContext<'_>,
    orders: Vec<OrderPlaced>,
) -> anyhow::Result<Vec<String>> {
    let mut ids = Vec::with_capacity(orders.len());
    for (message, order) in cx.messages().iter().zip(&orders) {
        let event = OutboxMessage::json("billing.events", "charged", &order.id)?;
        ids.push(message.stage(event).await?);
    }
    Ok(ids)
}

/// A slice method: the service's dependencies in `&self`.
pub struct Billing {
    pub table: String,
}

impl Billing {
    #[idempotent(key = order.id, consumer = "billing.method", slice)]
    async fn charge_all(
        &self,
        cx: &SliceContext<'_>,
        orders: Vec<OrderPlaced>,
    ) -> Result<Vec<i64>, DbErr> {
        let mut insert = Query::insert();
        insert.into_table(Alias::new(&self.table)).columns(["id", "amount"]);
        for order in &orders {
            insert.values_panic([order.id.as_str().into(), order.amount.into()]);
        }
        cx.transaction().execute(&insert).await?;
        Ok(orders.iter().map(|order| order.amount).collect())
    }
}

fn requires_slice_handler<S: SliceHandler>(_: &S) {}

fn main() {
    let charge = charge_all_handler();
    requires_slice_handler(&charge);
    let order = OrderPlaced { id: "o-1".into(), amount: 5 };
    assert_eq!(charge.consumer(), "billing.charge");
    assert_eq!(
        charge.key(&order, &Metadata::default()).unwrap(),
        MessageKey::new("o-1").unwrap()
    );
    let billing = std::sync::Arc::new(Billing { table: "charges".into() });
    let method = billing.charge_all_handler();
    requires_slice_handler(&method);
    assert_eq!(method.consumer(), "billing.method");
    let announce = announce_all_handler();
    requires_slice_handler(&announce);
    assert_eq!(
        announce.key(&order, &Metadata::default()).unwrap(),
        MessageKey::new("o-1/5").unwrap()
    );
}

//! The example: a transactional free function, its effect written through `tx`.
use idem_runtime::sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr};
use idem_runtime::{Handler, Mode, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct OrderPlaced {
    pub id: String,
    pub amount: i64,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    pub amount: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum BillingError {
    #[error(transparent)]
    Db(#[from] DbErr),
}

#[idempotent(key = order.id, consumer = "billing")]
pub async fn charge(tx: &DatabaseTransaction, order: OrderPlaced) -> Result<Receipt, BillingError> {
    tx.execute_unprepared("INSERT INTO charges VALUES (1)").await?;
    Ok(Receipt { amount: order.amount })
}

fn is_handler<H>(_: &H)
where
    H: Handler<Message = OrderPlaced, Output = Receipt, Error = BillingError> + Send + Sync + 'static,
{
}

fn main() {
    let handler = charge_handler();
    is_handler(&handler);
    assert_eq!(handler.consumer(), "billing");
    assert_eq!(handler.mode(), Mode::Transactional);
    assert_eq!(handler.retention(), None);
    let order = OrderPlaced { id: "o-1".into(), amount: 3 };
    let meta = idem_runtime::Metadata::default();
    assert_eq!(handler.key(&order, &meta).unwrap().as_str(), "o-1");
    assert_eq!(
        handler.fingerprint(&order, &idem_runtime::Metadata::default()).unwrap(),
        Some(idem_runtime::fingerprint::Fingerprint::of(&order).unwrap())
    );
    // The function itself is unchanged and can be called (and tested) on its own.
    let _future = async {
        let db = idem_runtime::sea_orm::Database::connect("sqlite::memory:").await.unwrap();
        let tx = idem_runtime::sea_orm::TransactionTrait::begin(&db).await.unwrap();
        charge(&tx, OrderPlaced { id: "o-2".into(), amount: 1 }).await
    };
}

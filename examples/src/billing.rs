//! The billing service: charges each placed order once, in the same transaction as its inbox
//! record, and announces the invoice through its outbox.

use std::time::Duration;

use idem_rabbitmq::QueueTopology;
use idem_rabbitmq::lapin::ExchangeKind;
use idem_runtime::admin::ConsumerName;
use idem_runtime::admin::InboxKey;
use idem_runtime::outbox::derived_id;
use idem_runtime::outbox::{Outbound, Outbox, StagingError};
use idem_runtime::{MessageKey, OutboxMessage, SliceContext, idempotent};
use sea_orm::sea_query::{Alias, Asterisk, Expr, ExprTrait, Func, Query};
use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr};
use serde::{Deserialize, Serialize};

use crate::notifications::InvoiceIssued;
use crate::orders::{EXCHANGE, OrderPlaced, ROUTING_KEY};

/// The queue billing consumes.
pub const QUEUE: &str = "billing.orders";

/// The consumer name of billing's handlers (`consumer = "billing.charge"` on each).
pub const CONSUMER: &str = "billing.charge";

/// The exchange billing publishes its events to, through its outbox.
pub const EVENTS_EXCHANGE: &str = "billing.events";

/// The routing key of `InvoiceIssued` events.
pub const INVOICE_ISSUED: &str = "invoice.issued";

/// The broker's delivery limit on the queue: a message that crashes the consumer this often is
/// dead-lettered by the broker.
pub const DELIVERY_LIMIT: u32 = 20;

/// What a charge returns; recorded with the inbox record and replayed to duplicates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The order charged.
    pub order_id: String,
    /// The amount charged, in cents.
    pub amount_cents: i64,
}

/// Why a charge failed.
#[derive(Debug, thiserror::Error)]
pub enum BillingError {
    /// The database failed: worth retrying.
    #[error("database error: {0}")]
    Database(#[from] DbErr),
    /// The invoice's event was not staged (the database failed, or the transaction was lost).
    #[error(transparent)]
    Staging(#[from] StagingError),
    /// The order cannot be charged, ever.
    #[error("cannot charge {0} cents")]
    InvalidAmount(i64),
}

/// Invalid orders are dead-lettered at once; database errors are retried.
pub fn is_permanent(error: &BillingError) -> bool {
    matches!(error, BillingError::InvalidAmount(_))
}

/// The billing service: where it publishes its events.
#[derive(Debug, Clone)]
pub struct Billing {
    /// The exchange `InvoiceIssued` events go to.
    pub events_exchange: String,
}

impl Billing {
    /// The `InvoiceIssued` event of charging `order`, to stage in the charge's transaction.
    pub(crate) fn invoice_issued(&self, order: &OrderPlaced) -> Result<OutboxMessage, DbErr> {
        let event = InvoiceIssued {
            order_id: order.order_id.clone(),
            customer: order.customer.clone(),
            amount_cents: order.amount_cents,
        };
        OutboxMessage::json(&self.events_exchange, INVOICE_ISSUED, &event)
            .map_err(|error| DbErr::Custom(error.to_string()))
    }

    /// Charges an order: writes its invoice through the inbox's transaction and stages an
    /// `InvoiceIssued` event in the outbox, so the invoice, the event and the record that the
    /// order was charged commit together or not at all.
    #[idempotent(
        key = order.order_id,
        consumer = "billing.charge",
        retention = "14d",
        permanent = is_permanent
    )]
    pub async fn charge(
        &self,
        tx: &DatabaseTransaction,
        outbound: &Outbound<'_>,
        order: OrderPlaced,
    ) -> Result<Receipt, BillingError> {
        if order.amount_cents <= 0 {
            return Err(BillingError::InvalidAmount(order.amount_cents));
        }
        let insert = Query::insert()
            .into_table("invoices")
            .columns(["order_id", "customer", "amount_cents"])
            .values_panic([
                order.order_id.clone().into(),
                order.customer.clone().into(),
                order.amount_cents.into(),
            ])
            .to_owned();
        tx.execute(&insert).await?;
        outbound.stage(self.invoice_issued(&order)?).await?;
        tracing::debug!(order_id = %order.order_id, amount_cents = order.amount_cents, "charged");
        Ok(Receipt {
            order_id: order.order_id,
            amount_cents: order.amount_cents,
        })
    }
}

impl Billing {
    /// Charges a slice of orders at once: their invoices in one multi-row insert, and each
    /// order's `InvoiceIssued` event staged through that order's own context (its id derived
    /// from the order, as [`Billing::charge`] derives it). The same consumer as `charge`: the
    /// two share their records, and a service can switch between them.
    #[idempotent(
        key = order.order_id,
        consumer = "billing.charge",
        retention = "14d",
        permanent = is_permanent,
        slice
    )]
    pub async fn charge_all(
        &self,
        cx: &SliceContext<'_>,
        orders: Vec<OrderPlaced>,
    ) -> Result<Vec<Receipt>, BillingError> {
        if let Some(order) = orders.iter().find(|order| order.amount_cents <= 0) {
            return Err(BillingError::InvalidAmount(order.amount_cents));
        }
        let mut insert = Query::insert();
        insert
            .into_table("invoices")
            .columns(["order_id", "customer", "amount_cents"]);
        for order in &orders {
            insert.values_panic([
                order.order_id.clone().into(),
                order.customer.clone().into(),
                order.amount_cents.into(),
            ]);
        }
        cx.transaction().execute(&insert).await?;
        let mut receipts = Vec::with_capacity(orders.len());
        for (message, order) in cx.messages().iter().zip(orders) {
            message.stage(self.invoice_issued(&order)?).await?;
            receipts.push(Receipt {
                order_id: order.order_id,
                amount_cents: order.amount_cents,
            });
        }
        tracing::debug!(orders = receipts.len(), "charged a slice");
        Ok(receipts)
    }
}

/// The queue, its dead-letter queue and its binding to the orders exchange.
pub fn topology() -> QueueTopology {
    topology_on(QUEUE, EXCHANGE)
}

/// Like [`topology`], the quorum queue `queue` (dead letters to `<queue>.dlq`) bound to the
/// orders exchange `exchange`.
pub fn topology_on(queue: &str, exchange: &str) -> QueueTopology {
    QueueTopology::quorum(queue)
        .delivery_limit(DELIVERY_LIMIT)
        .bind(exchange, ExchangeKind::Topic, ROUTING_KEY)
}

/// Creates the invoices tables if they are missing. There is deliberately no unique constraint
/// on `invoices.order_id`: the inbox alone keeps an order from being charged twice; the entity
/// variant's `invoices_by_order` is keyed by the order, its marker.
///
/// Replicas starting together on PostgreSQL race in `CREATE TABLE IF NOT EXISTS`: all but one
/// may fail (a unique index of the catalog, or the relation created meanwhile). A loser tries
/// again and finds the table.
pub async fn create_tables(db: &DatabaseConnection) -> Result<(), DbErr> {
    create_table(
        db,
        "CREATE TABLE IF NOT EXISTS invoices (\
         order_id VARCHAR(255) NOT NULL, \
         customer VARCHAR(255) NOT NULL, \
         amount_cents BIGINT NOT NULL)",
    )
    .await?;
    // The entity-mode variant's, keyed by the order: the key is its marker, compared byte for
    // byte (MySQL's default collation would take `A-1` and `a-1` for one order).
    let key = match db.get_database_backend() {
        DbBackend::MySql => "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
        _ => "VARCHAR(255)",
    };
    create_table(
        db,
        &format!(
            "CREATE TABLE IF NOT EXISTS invoices_by_order (\
             order_id {key} NOT NULL PRIMARY KEY, \
             customer VARCHAR(255) NOT NULL, \
             amount_cents BIGINT NOT NULL)"
        ),
    )
    .await
}

async fn create_table(db: &DatabaseConnection, statement: &str) -> Result<(), DbErr> {
    let mut tries = 1;
    loop {
        match db.execute_unprepared(statement).await {
            // Replicas starting together race on PostgreSQL's `CREATE TABLE IF NOT EXISTS`
            // (a duplicate type, or the relation created meanwhile): the next try finds the
            // table. An error that lasts is returned after a few tries.
            Err(error) if tries < 5 => {
                tracing::debug!(%error, "creating a table raced another replica");
                tries += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            result => return result.map(drop),
        }
    }
}

/// How many invoices were written for orders whose id starts with `prefix`, by either variant
/// (`invoices`, or the entity mode's `invoices_by_order`).
pub async fn count_invoices(db: &DatabaseConnection, prefix: &str) -> Result<i64, DbErr> {
    let mut total = 0;
    for table in ["invoices", crate::invoice::TABLE] {
        let count = Query::select()
            .expr(Func::count(Expr::col(Asterisk)))
            .from(table)
            .and_where(Expr::col("order_id").like(format!("{prefix}%")))
            .to_owned();
        let row = db.query_one(&count).await?;
        total += row.map_or(Ok(0), |row| row.try_get_by_index::<i64>(0))?;
    }
    Ok(total)
}

/// The message id of the `InvoiceIssued` event that charging `order_id` stages: the first
/// message of the handler's run, derived from its inbox key (`None` for an id that is no
/// valid message key).
pub fn invoice_event_id(order_id: &str) -> Option<String> {
    let origin = InboxKey {
        consumer: ConsumerName::new(CONSUMER).ok()?,
        message_key: MessageKey::new(order_id).ok()?,
    };
    Some(derived_id(&origin, 0))
}

/// How many of the events with these message ids the outbox relay has published: rows of the
/// outbox table whose publish the broker confirmed (`sent_at` set).
pub async fn count_events_sent(outbox: &Outbox, message_ids: &[String]) -> Result<u64, DbErr> {
    let mut sent = 0;
    // A bounded list per statement, within every backend's limit on bound parameters.
    for ids in message_ids.chunks(500) {
        let count = Query::select()
            .expr(Func::count(Expr::col(Asterisk)))
            .from(Alias::new(outbox.table().as_str()))
            .and_where(Expr::col("sent_at").is_not_null())
            .and_where(Expr::col("message_id").is_in(ids.iter().cloned()))
            .to_owned();
        let row = outbox.connection().query_one(&count).await?;
        sent += row.map_or(Ok(0), |row| row.try_get_by_index::<i64>(0))? as u64;
    }
    Ok(sent)
}

/// How long a delivery may stay unacknowledged before RabbitMQ redelivers it (its default
/// `consumer_timeout`).
pub const CONSUMER_TIMEOUT: Duration = Duration::from_secs(30 * 60);

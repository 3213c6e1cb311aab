//! What the benchmarks share: the orders, idem's handler, the same work written by hand, and
//! the figures.
//!
//! - [`hand`]: the hand-written inbox of the suite, per message and per batch, with idem's
//!   guarantees;
//! - [`hand_outbox`]: the hand-written outbox and relay that the suite's `hand-outbox` mode
//!   sets against idem's outbox and relay ([`ChargeAndStage`]);
//! - [`probe`]: a proxy in front of the broker that times each delivery to its settlement;
//! - [`figures`]: latency histograms, medians, resident memory;
//! - [`seed`]: a million expired records for the cleaner, made by the database.

pub mod figures;
pub mod hand;
pub mod hand_outbox;
pub mod probe;
pub mod seed;

use idem_runtime::fingerprint::{Fingerprint, FingerprintError};
use idem_runtime::{
    Context, Handler, KeyError, MessageKey, Metadata, Mode, OutboxMessage, SliceContext,
    SliceHandler,
};
use sea_orm::sea_query::{Alias, OnConflict, Query};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, DbErr, SqliteTransactionMode, Statement,
    TransactionOptions, TransactionTrait,
};
use serde::{Deserialize, Serialize};

use crate::db::TestDb;
use figures::median;

/// A benchmark message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Order {
    /// The order id, also the message id.
    pub id: String,
    /// Anything.
    pub amount: i64,
}

/// `n` orders for `round`, every tenth a copy of an earlier one: 10 % duplicates. Their ids
/// begin with 16 hex digits drawn from the round and the order, so that they spread over a key
/// index as real ids (UUIDs, hashes) do, rather than all landing at its end.
pub fn orders(n: usize, round: usize) -> Vec<Order> {
    (0..n)
        .map(|i| {
            let id = if i % 10 == 9 { i - 5 } else { i };
            Order {
                id: format!(
                    "{:016x}-r{round}-o{id}",
                    spread((round as u64) << 32 | id as u64)
                ),
                amount: id as i64,
            }
        })
        .collect()
}

/// SplitMix64's finaliser: a number that looks random, the same for the same `x`.
fn spread(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The tables of a benchmark run: the business table both sides write, and the hand-written
/// side's inbox.
#[derive(Debug, Clone)]
pub struct Tables {
    /// `(order_id, amount)`, one row per processed order.
    pub charges: String,
    /// `(consumer, message_key)` with its primary key.
    pub hand_inbox: String,
}

impl Tables {
    /// Creates both in `db`.
    pub async fn create(db: &TestDb) -> Self {
        let tables = Self {
            charges: create_charges(db).await,
            hand_inbox: db.table("hand_inbox"),
        };
        db.exec(&format!(
            "CREATE TABLE {} (consumer VARCHAR(128) NOT NULL, message_key VARCHAR(255) NOT NULL, \
             PRIMARY KEY (consumer, message_key))",
            tables.hand_inbox
        ))
        .await;
        tables
    }

    /// Checks that each distinct order of `rounds` runs of `messages` (10 % duplicates) on each
    /// side was charged once.
    pub async fn assert_one_charge_per_order(&self, db: &TestDb, messages: usize, runs: usize) {
        let expected = (messages - messages / 10) * runs;
        assert_eq!(
            db.count(&self.charges, "1=1").await as usize,
            expected,
            "one charge per distinct order"
        );
    }
}

/// Creates a business table `(order_id, amount)` in `db` and returns its name.
pub async fn create_charges(db: &TestDb) -> String {
    let charges = db.table("charges");
    db.exec(&format!(
        "CREATE TABLE {charges} (order_id VARCHAR(255) NOT NULL, amount BIGINT NOT NULL)"
    ))
    .await;
    charges
}

/// Creates a charges table whose primary key is the order id, for [`Upsert`].
pub async fn create_keyed_charges(db: &TestDb) -> String {
    let charges = db.table("keyed_charges");
    db.exec(&format!(
        "CREATE TABLE {charges} (order_id VARCHAR(255) PRIMARY KEY, amount BIGINT NOT NULL)"
    ))
    .await;
    charges
}

/// The charge as a naturally idempotent handler (`Mode::Natural`): an upsert keyed on the order
/// id, with no inbox record, for the inbox bench's `--mode natural`.
#[derive(Debug, Clone)]
pub struct Upsert {
    /// The business table, keyed on the order id ([`create_keyed_charges`]).
    pub table: String,
}

impl Handler for Upsert {
    type Message = Order;
    type Output = ();
    type Error = DbErr;

    fn consumer(&self) -> &str {
        "bench"
    }
    fn key(&self, order: &Order, _: &Metadata) -> Result<MessageKey, KeyError> {
        MessageKey::new(order.id.as_str())
    }
    fn fingerprint(
        &self,
        _: &Order,
        _: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        Ok(None)
    }
    fn mode(&self) -> Mode {
        Mode::Natural
    }
    async fn handle(&self, cx: &Context<'_>, order: Order) -> Result<(), DbErr> {
        let upsert = Query::insert()
            .into_table(Alias::new(&self.table))
            .columns(["order_id", "amount"])
            .values_panic([order.id.into(), order.amount.into()])
            .on_conflict(
                OnConflict::column("order_id")
                    .update_column("amount")
                    .to_owned(),
            )
            .to_owned();
        cx.transaction()
            .expect("a transaction")
            .execute(&upsert)
            .await?;
        Ok(())
    }
}

/// idem's side: the business insert, through the inbox's transaction.
#[derive(Debug, Clone)]
pub struct Charge {
    /// The business table.
    pub table: String,
    /// Whether the key is the transport's message id rather than the order id.
    pub key_from_message_id: bool,
}

impl Handler for Charge {
    type Message = Order;
    type Output = ();
    type Error = DbErr;

    fn consumer(&self) -> &str {
        "bench"
    }
    fn key(&self, order: &Order, meta: &Metadata) -> Result<MessageKey, KeyError> {
        if self.key_from_message_id {
            MessageKey::new(meta.message_id().ok_or(KeyError::Missing("message id"))?)
        } else {
            MessageKey::new(order.id.as_str())
        }
    }
    fn fingerprint(
        &self,
        order: &Order,
        meta: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        meta.content_fingerprint(order).map(Some)
    }
    async fn handle(&self, cx: &Context<'_>, order: Order) -> Result<(), DbErr> {
        insert_charge(cx.transaction().expect("transactional"), &self.table, order).await
    }
}

/// The slice mode of the suite: every fresh order's charge in one multi-row insert, as the
/// hand-written multi-row batch writes them.
impl SliceHandler for Charge {
    async fn handle_slice(
        &self,
        cx: &SliceContext<'_>,
        orders: Vec<Order>,
    ) -> Result<Vec<()>, DbErr> {
        let mut insert = Query::insert();
        insert
            .into_table(Alias::new(&self.table))
            .columns(["order_id", "amount"]);
        for order in &orders {
            insert.values_panic([order.id.as_str().into(), order.amount.into()]);
        }
        cx.transaction().execute(&insert).await?;
        Ok(vec![(); orders.len()])
    }
}

/// The event both outbox modes of the suite publish for each fresh order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charged {
    /// The order charged.
    pub order_id: String,
    /// Its amount.
    pub amount: i64,
}

impl From<&Order> for Charged {
    fn from(order: &Order) -> Self {
        Self {
            order_id: order.id.clone(),
            amount: order.amount,
        }
    }
}

/// idem's side of the outbox modes: [`Charge`]'s work, then one [`Charged`] event staged in the
/// same transaction, to the queue `events` through the default exchange.
#[derive(Debug, Clone)]
pub struct ChargeAndStage {
    /// The business insert, its key and fingerprint.
    pub charge: Charge,
    /// The queue the events go to.
    pub events: String,
}

impl Handler for ChargeAndStage {
    type Message = Order;
    type Output = ();
    type Error = DbErr;

    fn consumer(&self) -> &str {
        self.charge.consumer()
    }
    fn key(&self, order: &Order, meta: &Metadata) -> Result<MessageKey, KeyError> {
        self.charge.key(order, meta)
    }
    fn fingerprint(
        &self,
        order: &Order,
        meta: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        self.charge.fingerprint(order, meta)
    }
    async fn handle(&self, cx: &Context<'_>, order: Order) -> Result<(), DbErr> {
        let event = OutboxMessage::json("", self.events.as_str(), &Charged::from(&order))
            .map_err(|error| DbErr::Custom(error.to_string()))?;
        let tx = cx.transaction().expect("transactional");
        insert_charge(tx, &self.charge.table, order).await?;
        cx.stage(event).await?;
        Ok(())
    }
}

/// The business work: one insert.
pub async fn insert_charge(
    conn: &impl ConnectionTrait,
    table: &str,
    order: Order,
) -> Result<(), DbErr> {
    let insert = Query::insert()
        .into_table(Alias::new(table))
        .columns(["order_id", "amount"])
        .values_panic([order.id.into(), order.amount.into()])
        .to_owned();
    conn.execute(&insert).await?;
    Ok(())
}

/// The same work written by hand: in one transaction, a conditional insert of `key` into the
/// hand-written inbox and, if the key was new, the business insert.
pub async fn hand_written(
    db: &DatabaseConnection,
    tables: &Tables,
    key: &str,
    order: Order,
) -> Result<(), DbErr> {
    let backend = db.get_database_backend();
    let tx = if backend == DbBackend::Sqlite {
        db.begin_with_options(TransactionOptions {
            sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
            ..TransactionOptions::default()
        })
        .await?
    } else {
        db.begin().await?
    };
    let inbox = &tables.hand_inbox;
    let claim = match backend {
        DbBackend::MySql => {
            format!("INSERT IGNORE INTO {inbox} (consumer, message_key) VALUES (?, ?)")
        }
        DbBackend::Postgres => format!(
            "INSERT INTO {inbox} (consumer, message_key) VALUES ($1, $2) ON CONFLICT DO NOTHING"
        ),
        _ => format!(
            "INSERT INTO {inbox} (consumer, message_key) VALUES (?, ?) ON CONFLICT DO NOTHING"
        ),
    };
    let claimed = tx
        .execute_raw(Statement::from_sql_and_values(
            backend,
            claim,
            ["bench".into(), key.into()],
        ))
        .await?
        .rows_affected();
    if claimed == 1 {
        insert_charge(&tx, &tables.charges, order).await?;
    }
    tx.commit().await
}

/// Messages per second of idem and of the hand-written side, round by round.
#[derive(Debug, Default)]
pub struct Rates {
    idem: Vec<f64>,
    hand: Vec<f64>,
}

impl Rates {
    /// Records one round: both sides ran alternately, so that their ratio cancels slow drift of
    /// the machine.
    pub fn push(&mut self, idem: f64, hand: f64) {
        self.idem.push(idem);
        self.hand.push(hand);
    }

    /// The medians of idem's and the hand-written rates, and the median of the per-round ratios.
    pub fn summary(&self) -> (f64, f64, f64) {
        let ratios = self
            .idem
            .iter()
            .zip(&self.hand)
            .map(|(idem, hand)| idem / hand)
            .collect();
        (
            median(self.idem.clone()),
            median(self.hand.clone()),
            median(ratios),
        )
    }
}

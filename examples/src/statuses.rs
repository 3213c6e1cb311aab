//! Order statuses, a naturally idempotent consumer (`mode = natural`): each `StatusChanged`
//! event carries an order's whole status and its version, and the handler keeps the newest
//! with a version check. A copy, or an event older than the stored one, changes nothing, so no
//! inbox record is needed; the events may come in any order and any number of times.

use std::hash::BuildHasher;

use idem_rabbitmq::QueueTopology;
use idem_rabbitmq::lapin::ExchangeKind;
use idem_runtime::idempotent;
use sea_orm::sea_query::{Alias, Asterisk, Expr, ExprTrait, Func, OnConflict, Query};
use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr};
use serde::{Deserialize, Serialize};

/// The exchange status events are published to.
pub const EXCHANGE: &str = "orders.statuses";
/// The routing key of `StatusChanged` events.
pub const ROUTING_KEY: &str = "order.status";
/// The queue the statuses service consumes.
pub const QUEUE: &str = "statuses.orders";
/// The statuses an order goes through, in order: version 1 is `placed`.
pub const STATUSES: [&str; 5] = ["placed", "paid", "packed", "shipped", "delivered"];

/// An order's status as of `version`: the whole state, not a change to it (event-carried state
/// transfer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusChanged {
    /// The order.
    pub order_id: String,
    /// Its status.
    pub status: String,
    /// The status's version: later statuses have higher versions.
    pub version: i64,
}

/// Why an event was not applied.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The database failed: worth retrying.
    #[error(transparent)]
    Database(#[from] DbErr),
    /// A status no order goes through: dead-lettered.
    #[error("unknown status {0:?}")]
    Unknown(String),
}

/// Unknown statuses are dead-lettered at once; database errors are retried.
pub fn is_unknown(error: &StatusError) -> bool {
    matches!(error, StatusError::Unknown(_))
}

/// The statuses service: the table where each order's newest status is kept.
#[derive(Debug, Clone)]
pub struct Statuses {
    /// The table `(order_id, status, version)`, keyed by the order.
    pub table: String,
}

impl Statuses {
    /// Sets the order's status unless the stored one is as new or newer: applying an event
    /// twice, or after a newer one, changes nothing.
    #[idempotent(
        key = (event.order_id, event.version),
        consumer = "statuses.apply",
        mode = natural,
        permanent = is_unknown
    )]
    pub async fn apply(
        &self,
        tx: &DatabaseTransaction,
        event: StatusChanged,
    ) -> Result<(), StatusError> {
        if !STATUSES.contains(&event.status.as_str()) {
            return Err(StatusError::Unknown(event.status));
        }
        let table = Alias::new(&self.table);
        let mut upsert = Query::insert();
        upsert
            .into_table(table.clone())
            .columns(["order_id", "status", "version"])
            .values_panic([
                event.order_id.into(),
                event.status.into(),
                event.version.into(),
            ]);
        let backend = tx.get_database_backend();
        if backend == DbBackend::MySql {
            // MySQL has no conditional upsert; it assigns left to right, so the status reads
            // the version before the version changes.
            let mut statement = backend.build(&upsert);
            statement.sql.push_str(
                " ON DUPLICATE KEY UPDATE \
                 status = IF(VALUES(version) > version, VALUES(status), status), \
                 version = GREATEST(version, VALUES(version))",
            );
            tx.execute_raw(statement).await?;
        } else {
            let newer = Expr::col((Alias::new("excluded"), Alias::new("version")))
                .gt(Expr::col((table, Alias::new("version"))));
            upsert.on_conflict(
                OnConflict::column("order_id")
                    .update_columns(["status", "version"])
                    .action_and_where(newer)
                    .to_owned(),
            );
            tx.execute(&upsert).await?;
        }
        Ok(())
    }

    /// Creates the table if it is missing.
    ///
    /// # Errors
    ///
    /// The database's.
    pub async fn create_table(&self, db: &impl ConnectionTrait) -> Result<(), DbErr> {
        // Order ids compared byte for byte (MySQL's default collation ignores case).
        let key = match db.get_database_backend() {
            DbBackend::MySql => "VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
            _ => "VARCHAR(64)",
        };
        db.execute_unprepared(&format!(
            "CREATE TABLE IF NOT EXISTS {} (order_id {key} NOT NULL PRIMARY KEY, \
             status VARCHAR(32) NOT NULL, version BIGINT NOT NULL)",
            self.table
        ))
        .await
        .map(drop)
    }

    /// How many orders whose id starts with `prefix` are in the newest status (`delivered`,
    /// version 5), and how many are stored at all.
    ///
    /// # Errors
    ///
    /// The database's.
    pub async fn count(&self, db: &DatabaseConnection, prefix: &str) -> Result<(i64, i64), DbErr> {
        let newest = STATUSES.len() as i64;
        let mut counts = [0; 2];
        for (count, newest_only) in counts.iter_mut().zip([true, false]) {
            let mut select = Query::select();
            select
                .expr(Func::count(Expr::col(Asterisk)))
                .from(Alias::new(&self.table))
                .and_where(Expr::col("order_id").like(format!("{prefix}%")));
            if newest_only {
                select.and_where(Expr::col("version").eq(newest));
            }
            let row = db.query_one(&select).await?;
            *count = row.map_or(Ok(0), |row| row.try_get_by_index::<i64>(0))?;
        }
        Ok((counts[0], counts[1]))
    }
}

/// Every order's five events, each twice (a producer retry), in a random order: what an
/// at-least-once broker may well deliver.
pub fn shuffled_events(prefix: &str, orders: usize) -> Vec<StatusChanged> {
    let mut events: Vec<_> = (0..orders)
        .flat_map(|order| {
            STATUSES
                .iter()
                .zip(1..)
                .map(move |(status, version)| StatusChanged {
                    order_id: format!("{prefix}{order:05}"),
                    status: (*status).to_owned(),
                    version,
                })
        })
        .flat_map(|event| [event.clone(), event])
        .collect();
    // A random order: each position hashed with this run's random keys.
    let random = std::hash::RandomState::new();
    let mut keyed: Vec<_> = events
        .drain(..)
        .enumerate()
        .map(|(position, event)| (random.hash_one(position), event))
        .collect();
    keyed.sort_by_key(|(key, _)| *key);
    keyed.into_iter().map(|(_, event)| event).collect()
}

/// The statuses queue (dead letters to `<queue>.dlq`), bound to the status exchange.
pub fn topology() -> QueueTopology {
    QueueTopology::quorum(QUEUE).bind(EXCHANGE, ExchangeKind::Topic, ROUTING_KEY)
}

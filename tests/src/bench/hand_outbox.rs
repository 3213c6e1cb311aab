//! The hand-written outbox of the suite's `hand-outbox` mode: a table beside the hand-written
//! inbox in which each fresh order stages one event in the transaction that charges it, and a
//! relay loop that publishes the committed events with publisher confirms and marks them sent.
//!
//! It gives what idem's outbox and relay give, with the shortest SQL that does it: an event
//! leaves only if its transaction committed; it is marked sent only once the broker confirmed
//! it, so a failure publishes it again with the same message id (the order's key), never loses
//! it; events go out in the order they were staged; relays in several processes could share the
//! table on PostgreSQL and MariaDB (`FOR UPDATE SKIP LOCKED`). The table holds only what this
//! one event needs (its id and payload: the destination is the relay's), and no unique index on
//! the id: the inbox's claim already stages each order once.
//!
//! The relay takes up to a batch of unsent rows in order, publishes them all (`mandatory`,
//! persistent) before it waits for their confirms, marks the confirmed ones sent, the first
//! that is not confirmed and those after it left for the next try, and commits. On SQLite,
//! which serves one process, it reads and marks in two short statements rather than holding
//! the write lock while it publishes.

use std::sync::Arc;
use std::time::Duration;

use idem_rabbitmq::lapin::options::BasicPublishOptions;
use idem_rabbitmq::lapin::{BasicProperties, Channel, Confirmation};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, IsolationLevel,
    QueryResult, Statement, TransactionTrait, Value,
};
use tokio::sync::{Notify, watch};

use super::Charged;
use super::hand::{HandMessage, Params, now_ms};
use crate::db::TestDb;

/// How often the relay looks when nothing woke it: idem's relay default.
const POLL: Duration = Duration::from_secs(1);
/// The wait after a publish the broker did not take or a database error: idem's first back-off.
const RETRY: Duration = Duration::from_millis(200);
/// How long a confirm may take: idem's relay default.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// A hand-written outbox table, and the signal that wakes its relay after a commit that staged.
#[derive(Debug, Clone)]
pub struct HandOutbox {
    backend: DbBackend,
    table: String,
    staged: Arc<Notify>,
}

/// Why a relay batch did not go out whole.
#[derive(Debug)]
enum Failure {
    /// The database failed: nothing of the batch was marked sent.
    Database(DbErr),
    /// The channel failed: the relay stops.
    Channel(String),
    /// The broker did not take a message: those before it were marked sent.
    NotTaken(String),
}

impl From<DbErr> for Failure {
    fn from(error: DbErr) -> Self {
        Failure::Database(error)
    }
}

impl HandOutbox {
    /// Creates the outbox table in `db`: `seq` orders the rows; the index covers unsent rows
    /// only where the backend has partial indexes (PostgreSQL, SQLite), `(sent_at, seq)` on
    /// MariaDB.
    pub async fn create(db: &TestDb) -> Self {
        let backend = db.db.get_database_backend();
        let table = db.table("hand_outbox");
        let columns = "message_id VARCHAR(255) NOT NULL, sent_at BIGINT NULL";
        match backend {
            DbBackend::MySql => {
                db.exec(&format!(
                    "CREATE TABLE {table} (seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
                     {columns}, payload LONGBLOB NOT NULL, KEY {table}_pending (sent_at, seq)) \
                     ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
                ))
                .await;
            }
            _ => {
                let (seq, payload) = match backend {
                    DbBackend::Postgres => ("BIGSERIAL PRIMARY KEY", "BYTEA"),
                    _ => ("INTEGER PRIMARY KEY", "BLOB"),
                };
                db.exec(&format!(
                    "CREATE TABLE {table} (seq {seq}, {columns}, payload {payload} NOT NULL)"
                ))
                .await;
                db.exec(&format!(
                    "CREATE INDEX {table}_pending ON {table} (seq) WHERE sent_at IS NULL"
                ))
                .await;
            }
        }
        Self {
            backend,
            table,
            staged: Arc::new(Notify::new()),
        }
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Stages one [`Charged`] event per message in `tx`, with the message's key as its id: one
    /// statement.
    pub(super) async fn stage(
        &self,
        tx: &DatabaseTransaction,
        messages: &[&HandMessage],
    ) -> Result<(), DbErr> {
        let mut p = Params::new(self.backend);
        let mut values = Vec::with_capacity(messages.len() * 2);
        let rows: Vec<String> = messages
            .iter()
            .map(|message| {
                let payload =
                    serde_json::to_vec(&Charged::from(&message.order)).expect("JSON serializes");
                values.extend([Value::from(message.key.as_str()), Value::from(payload)]);
                format!("({}, {})", p.next(), p.next())
            })
            .collect();
        let sql = format!(
            "INSERT INTO {} (message_id, payload) VALUES {}",
            self.table,
            rows.join(", ")
        );
        tx.execute_raw(Statement::from_sql_and_values(self.backend, sql, values))
            .await?;
        Ok(())
    }

    /// Wakes the relay: a transaction that staged committed.
    pub(super) fn notify(&self) {
        self.staged.notify_one();
    }

    /// The relay: publishes committed events to `queue` on `channel` (in confirm mode) in
    /// batches of up to `batch`, until `stop` is set; waits for a commit's wake-up or a second
    /// when there is nothing to publish. Returns how many events the broker confirmed.
    ///
    /// # Errors
    ///
    /// The channel failed (a publish the broker did not take, or a database error, is retried
    /// after a pause).
    pub async fn relay(
        self,
        db: DatabaseConnection,
        channel: Channel,
        queue: String,
        batch: u32,
        mut stop: watch::Receiver<bool>,
    ) -> Result<u64, String> {
        let mut published = 0;
        loop {
            if *stop.borrow() {
                return Ok(published);
            }
            let pause = match self
                .relay_batch(&db, &channel, &queue, batch, &mut published)
                .await
            {
                Ok(0) => POLL,
                Ok(_) => continue,
                Err(Failure::Channel(error)) => return Err(error),
                Err(Failure::Database(error)) => {
                    eprintln!("  hand-written relay: database error, retrying: {error}");
                    RETRY
                }
                Err(Failure::NotTaken(why)) => {
                    eprintln!("  hand-written relay: a publish was not taken, retrying: {why}");
                    RETRY
                }
            };
            tokio::select! {
                biased;
                _ = stop.wait_for(|stop| *stop) => {}
                () = self.staged.notified(), if pause == POLL => {}
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// One batch: take the unsent rows in order, publish them all, wait for their confirms,
    /// mark the confirmed prefix sent, commit. Returns how many rows it took.
    async fn relay_batch(
        &self,
        db: &DatabaseConnection,
        channel: &Channel,
        queue: &str,
        batch: u32,
        published: &mut u64,
    ) -> Result<usize, Failure> {
        let tx = match self.backend {
            DbBackend::Sqlite => None,
            // Without gap locks, which would hold up the consumers' inserts of new rows.
            DbBackend::MySql => Some(
                db.begin_with_config(Some(IsolationLevel::ReadCommitted), None)
                    .await?,
            ),
            _ => Some(db.begin().await?),
        };
        let lock = if tx.is_some() {
            " FOR UPDATE SKIP LOCKED"
        } else {
            ""
        };
        let select = Statement::from_string(
            self.backend,
            format!(
                "SELECT seq, message_id, payload FROM {} WHERE sent_at IS NULL ORDER BY seq \
                 LIMIT {batch}{lock}",
                self.table
            ),
        );
        let rows = match &tx {
            Some(tx) => tx.query_all_raw(select).await?,
            None => db.query_all_raw(select).await?,
        };
        if rows.is_empty() {
            if let Some(tx) = tx {
                tx.commit().await?;
            }
            return Ok(0);
        }
        let (sent, failure) = publish(channel, queue, &rows).await?;
        if !sent.is_empty() {
            let mut p = Params::new(self.backend);
            let now = p.next();
            let list: Vec<String> = sent.iter().map(|_| p.next()).collect();
            let mut values = vec![Value::from(now_ms())];
            values.extend(sent.iter().map(|seq| Value::from(*seq)));
            let update = Statement::from_sql_and_values(
                self.backend,
                format!(
                    "UPDATE {} SET sent_at = {now} WHERE seq IN ({})",
                    self.table,
                    list.join(", ")
                ),
                values,
            );
            match &tx {
                Some(tx) => tx.execute_raw(update).await?,
                None => db.execute_raw(update).await?,
            };
        }
        if let Some(tx) = tx {
            tx.commit().await?;
        }
        *published += sent.len() as u64;
        match failure {
            Some(failure) => Err(failure),
            None => Ok(rows.len()),
        }
    }
}

/// Publishes `rows` (`seq, message_id, payload`) to `queue`, all before waiting for any
/// confirm; returns the seqs confirmed before the first that was not, and why that one was not.
async fn publish(
    channel: &Channel,
    queue: &str,
    rows: &[QueryResult],
) -> Result<(Vec<i64>, Option<Failure>), Failure> {
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let mut confirms = Vec::with_capacity(rows.len());
    for row in rows {
        let seq: i64 = row.try_get_by_index(0)?;
        let id: String = row.try_get_by_index(1)?;
        let payload: Vec<u8> = row.try_get_by_index(2)?;
        let properties = BasicProperties::default()
            .with_message_id(id.as_str().into())
            .with_content_type("application/json".into())
            .with_delivery_mode(2);
        let confirm = channel
            .basic_publish("".into(), queue.into(), options, &payload, properties)
            .await
            .map_err(|error| Failure::Channel(error.to_string()))?;
        confirms.push((seq, confirm));
    }
    let mut sent = Vec::with_capacity(confirms.len());
    for (seq, confirm) in confirms {
        let why = match tokio::time::timeout(CONFIRM_TIMEOUT, confirm).await {
            Ok(Ok(Confirmation::Ack(None))) => {
                sent.push(seq);
                continue;
            }
            Ok(Ok(other)) => Failure::NotTaken(format!("{other:?}")),
            Ok(Err(error)) => Failure::Channel(error.to_string()),
            Err(_) => Failure::NotTaken(format!("no confirm within {CONFIRM_TIMEOUT:?}")),
        };
        return Ok((sent, Some(why)));
    }
    Ok((sent, None))
}

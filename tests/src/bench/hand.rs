//! The hand-written side of the suite: an inbox table and the SQL a careful engineer would write
//! to give a consumer the same guarantees as idem, per message and per batch.
//!
//! The guarantees are idem's: a claim row per key with its status and the SHA-256 of the
//! payload; a known key whose fingerprint differs is refused (a mismatch), one still in progress
//! is retried later, one whose record expired is taken over; the business insert runs for fresh
//! keys only, and the completion with its output is recorded in the same transaction, before
//! the acknowledgement. The SQL is the shortest that does it: one conditional insert, and no
//! read on the fresh path.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, QueryResult,
    SqliteTransactionMode, Statement, TransactionOptions, TransactionTrait, Value,
};
use sha2::{Digest, Sha256};

use super::Order;
use super::hand_outbox::HandOutbox;
use crate::db::TestDb;

/// The consumer name the hand-written side records.
const CONSUMER: &str = "bench";
/// How long a record is kept: idem's default retention.
const RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// The output recorded for every message: the handler's `()`, as JSON.
const OUTPUT: &str = "null";

/// One delivery as the hand-written consumer sees it once decoded.
#[derive(Debug, Clone)]
pub struct HandMessage {
    /// The message key: the message id.
    pub key: String,
    /// SHA-256 of the payload bytes.
    pub fingerprint: [u8; 32],
    /// The decoded payload.
    pub order: Order,
}

/// How a hand-written batch runs its business work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusinessInserts {
    /// One statement per fresh message, as a handler, a function of one message, runs it.
    PerMessage,
    /// One multi-row statement for the batch: a different program, which knows every message's
    /// work at once.
    MultiRow,
}

/// How the hand-written side settles a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandOutcome {
    /// Fresh: its charge and completion are committed. Ack.
    Processed,
    /// Known and completed with the same fingerprint. Ack.
    Duplicate,
    /// Known with another fingerprint: a reused key. Reject to the dead-letter queue.
    Mismatch,
    /// Known and still in progress elsewhere. Requeue.
    Busy,
}

/// SHA-256 of a payload.
pub fn fingerprint(payload: &[u8]) -> [u8; 32] {
    Sha256::digest(payload).into()
}

/// A hand-written inbox table and the business table it guards, and the outbox in which each
/// fresh message stages one event, if it has one.
#[derive(Debug, Clone)]
pub struct HandInbox {
    backend: DbBackend,
    table: String,
    charges: String,
    outbox: Option<HandOutbox>,
}

impl HandInbox {
    /// Creates the inbox table in `db`, with its primary key on `(consumer, message_key)` and
    /// an index on `expires_at` for cleanup, as idem's; `charges` is the business table.
    pub async fn create(db: &TestDb, charges: &str) -> Self {
        let backend = db.db.get_database_backend();
        let table = db.table("hand_inbox");
        let (key, consumer, hash) = match backend {
            // Keys compare byte for byte, as idem's do.
            DbBackend::MySql => ("VARBINARY(255)", "VARBINARY(128)", "BINARY(32)"),
            DbBackend::Postgres => ("VARCHAR(255)", "VARCHAR(128)", "BYTEA"),
            _ => ("VARCHAR(255)", "VARCHAR(128)", "BLOB"),
        };
        let columns = format!(
            "consumer {consumer} NOT NULL, message_key {key} NOT NULL, \
             status VARCHAR(16) NOT NULL, fingerprint {hash} NOT NULL, output TEXT NULL, \
             created_at BIGINT NOT NULL, completed_at BIGINT NULL, expires_at BIGINT NOT NULL, \
             PRIMARY KEY (consumer, message_key)"
        );
        if backend == DbBackend::MySql {
            db.exec(&format!(
                "CREATE TABLE {table} ({columns}, INDEX {table}_expires (expires_at)) \
                 ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
            ))
            .await;
        } else {
            db.exec(&format!("CREATE TABLE {table} ({columns})")).await;
            db.exec(&format!(
                "CREATE INDEX {table}_expires ON {table} (expires_at)"
            ))
            .await;
        }
        Self {
            backend,
            table,
            charges: charges.to_owned(),
            outbox: None,
        }
    }

    /// The same inbox, staging one event per fresh message in `outbox`, in the transaction that
    /// charges it, and waking the outbox's relay after the commit.
    pub fn with_outbox(mut self, outbox: HandOutbox) -> Self {
        self.outbox = Some(outbox);
        self
    }

    /// The inbox table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Processes one message in one transaction: the conditional claim, then for a fresh key the
    /// business insert and the completion; for a known key one read of its record.
    ///
    /// # Errors
    /// A database error; nothing is committed then.
    pub async fn process(
        &self,
        db: &DatabaseConnection,
        message: HandMessage,
    ) -> Result<HandOutcome, DbErr> {
        let tx = begin(db).await?;
        let now = now_ms();
        let mut p = Params::new(self.backend);
        let claim = format!(
            "{insert} {t} (consumer, message_key, status, fingerprint, created_at, expires_at) \
             VALUES ({}, {}, 'in_progress', {}, {}, {}){on_conflict}",
            p.next(),
            p.next(),
            p.next(),
            p.next(),
            p.next(),
            insert = self.insert(),
            t = self.table,
            on_conflict = self.on_conflict(),
        );
        let claimed = tx
            .execute_raw(self.statement(
                claim,
                vec![
                    CONSUMER.into(),
                    message.key.as_str().into(),
                    message.fingerprint.to_vec().into(),
                    now.into(),
                    (now + retention_ms()).into(),
                ],
            ))
            .await?
            .rows_affected()
            == 1;
        if !claimed {
            let outcome = match self.known(&tx, &message, now).await? {
                Known::TakenOver => None,
                Known::Completed => Some(HandOutcome::Duplicate),
                Known::Mismatch => Some(HandOutcome::Mismatch),
                Known::Busy => Some(HandOutcome::Busy),
            };
            if let Some(outcome) = outcome {
                tx.rollback().await?;
                return Ok(outcome);
            }
        }
        self.insert_charges(&tx, &[&message.order]).await?;
        if let Some(outbox) = &self.outbox {
            outbox.stage(&tx, &[&message]).await?;
        }
        self.complete(&tx, &[message.key.as_str()], now).await?;
        tx.commit().await?;
        if let Some(outbox) = &self.outbox {
            outbox.notify();
        }
        Ok(HandOutcome::Processed)
    }

    /// What a known key's record says, taking it over when it expired.
    async fn known(
        &self,
        tx: &DatabaseTransaction,
        message: &HandMessage,
        now: i64,
    ) -> Result<Known, DbErr> {
        let mut p = Params::new(self.backend);
        let read = format!(
            "SELECT message_key, status, fingerprint, expires_at FROM {} \
             WHERE consumer = {} AND message_key = {}{}",
            self.table,
            p.next(),
            p.next(),
            self.share_lock()
        );
        let row = tx
            .query_one_raw(self.statement(read, vec![CONSUMER.into(), message.key.as_str().into()]))
            .await?;
        let Some(row) = row else {
            // Deleted by a cleanup since the claim: try again later.
            return Ok(Known::Busy);
        };
        let record = self.record(&row)?;
        self.judge(tx, &record, message, now).await
    }

    async fn judge(
        &self,
        tx: &DatabaseTransaction,
        record: &Record,
        message: &HandMessage,
        now: i64,
    ) -> Result<Known, DbErr> {
        if record.expires_at < now {
            return Ok(if self.take_over(tx, message, now).await? {
                Known::TakenOver
            } else {
                Known::Busy
            });
        }
        Ok(if record.fingerprint != message.fingerprint {
            Known::Mismatch
        } else if record.status != "completed" {
            Known::Busy
        } else {
            Known::Completed
        })
    }

    /// Claims an expired record for `message`; returns whether it did.
    async fn take_over(
        &self,
        tx: &DatabaseTransaction,
        message: &HandMessage,
        now: i64,
    ) -> Result<bool, DbErr> {
        let mut p = Params::new(self.backend);
        let sql = format!(
            "UPDATE {} SET status = 'in_progress', fingerprint = {}, created_at = {}, \
             expires_at = {}, output = NULL, completed_at = NULL \
             WHERE consumer = {} AND message_key = {} AND expires_at < {}",
            self.table,
            p.next(),
            p.next(),
            p.next(),
            p.next(),
            p.next(),
            p.next()
        );
        let values = vec![
            message.fingerprint.to_vec().into(),
            now.into(),
            (now + retention_ms()).into(),
            CONSUMER.into(),
            message.key.as_str().into(),
            now.into(),
        ];
        Ok(tx
            .execute_raw(self.statement(sql, values))
            .await?
            .rows_affected()
            == 1)
    }

    /// Processes `messages` (in delivery order) in one transaction: one multi-row conditional
    /// insert that returns the fresh keys, one read of the known keys' records, the business
    /// inserts for the fresh ones (`business`), one multi-row completion, one commit. A key that
    /// appears twice in the batch is processed once; its later copies are judged against the
    /// first one's fingerprint. Returns an outcome per message, in order.
    ///
    /// # Errors
    /// A database error; nothing is committed then.
    pub async fn process_batch(
        &self,
        db: &DatabaseConnection,
        messages: &[HandMessage],
        business: BusinessInserts,
    ) -> Result<Vec<HandOutcome>, DbErr> {
        // The first message of each key; the others are copies within the batch.
        let mut first: HashMap<&str, usize> = HashMap::with_capacity(messages.len());
        let mut unique = Vec::with_capacity(messages.len());
        for (index, message) in messages.iter().enumerate() {
            first.entry(message.key.as_str()).or_insert_with(|| {
                unique.push(index);
                index
            });
        }
        let now = now_ms();
        let tx = begin(db).await?;
        let fresh = self.claim_batch(&tx, messages, &unique, now).await?;
        let mut outcomes: Vec<Option<HandOutcome>> = vec![None; messages.len()];
        let known: Vec<usize> = unique
            .iter()
            .copied()
            .filter(|&i| !fresh.contains(messages[i].key.as_str()))
            .collect();
        let mut processed: Vec<usize> = unique
            .iter()
            .copied()
            .filter(|&i| fresh.contains(messages[i].key.as_str()))
            .collect();
        if !known.is_empty() {
            let records = self.read_batch(&tx, messages, &known).await?;
            for &index in &known {
                let message = &messages[index];
                let judged = match records.get(message.key.as_str()) {
                    Some(record) => self.judge(&tx, record, message, now).await?,
                    None => Known::Busy,
                };
                outcomes[index] = Some(match judged {
                    Known::TakenOver => {
                        processed.push(index);
                        HandOutcome::Processed
                    }
                    Known::Completed => HandOutcome::Duplicate,
                    Known::Mismatch => HandOutcome::Mismatch,
                    Known::Busy => HandOutcome::Busy,
                });
            }
        }
        for &index in &processed {
            outcomes[index] = Some(HandOutcome::Processed);
        }
        if !processed.is_empty() {
            let orders: Vec<&Order> = processed.iter().map(|&i| &messages[i].order).collect();
            match business {
                BusinessInserts::PerMessage => {
                    for order in &orders {
                        self.insert_charges(&tx, &[order]).await?;
                    }
                }
                BusinessInserts::MultiRow => self.insert_charges(&tx, &orders).await?,
            }
            if let Some(outbox) = &self.outbox {
                let staged: Vec<&HandMessage> = processed.iter().map(|&i| &messages[i]).collect();
                outbox.stage(&tx, &staged).await?;
            }
            let keys: Vec<&str> = processed
                .iter()
                .map(|&i| messages[i].key.as_str())
                .collect();
            self.complete(&tx, &keys, now).await?;
        }
        tx.commit().await?;
        if let Some(outbox) = self.outbox.as_ref().filter(|_| !processed.is_empty()) {
            outbox.notify();
        }
        // Later copies of a key within the batch.
        Ok(messages
            .iter()
            .enumerate()
            .map(|(index, message)| {
                outcomes[index].unwrap_or_else(|| {
                    let original = first[message.key.as_str()];
                    match outcomes[original] {
                        Some(HandOutcome::Mismatch) | None => HandOutcome::Mismatch,
                        Some(HandOutcome::Busy) => HandOutcome::Busy,
                        Some(_) if messages[original].fingerprint != message.fingerprint => {
                            HandOutcome::Mismatch
                        }
                        Some(_) => HandOutcome::Duplicate,
                    }
                })
            })
            .collect())
    }

    /// The multi-row conditional claim; returns the keys it inserted.
    async fn claim_batch(
        &self,
        tx: &DatabaseTransaction,
        messages: &[HandMessage],
        unique: &[usize],
        now: i64,
    ) -> Result<HashSet<String>, DbErr> {
        let mut p = Params::new(self.backend);
        let mut values = Vec::with_capacity(unique.len() * 5);
        let rows: Vec<String> = unique
            .iter()
            .map(|&index| {
                let message = &messages[index];
                values.extend([
                    Value::from(CONSUMER),
                    message.key.as_str().into(),
                    message.fingerprint.to_vec().into(),
                    now.into(),
                    (now + retention_ms()).into(),
                ]);
                format!(
                    "({}, {}, 'in_progress', {}, {}, {})",
                    p.next(),
                    p.next(),
                    p.next(),
                    p.next(),
                    p.next()
                )
            })
            .collect();
        let sql = format!(
            "{} {} (consumer, message_key, status, fingerprint, created_at, expires_at) \
             VALUES {}{} RETURNING message_key",
            self.insert(),
            self.table,
            rows.join(", "),
            self.on_conflict()
        );
        let rows = tx.query_all_raw(self.statement(sql, values)).await?;
        rows.iter().map(|row| self.key(row, 0)).collect()
    }

    /// The records of the known keys, by key.
    async fn read_batch(
        &self,
        tx: &DatabaseTransaction,
        messages: &[HandMessage],
        known: &[usize],
    ) -> Result<HashMap<String, Record>, DbErr> {
        let mut p = Params::new(self.backend);
        let consumer = p.next();
        let keys: Vec<String> = known.iter().map(|_| p.next()).collect();
        let sql = format!(
            "SELECT message_key, status, fingerprint, expires_at FROM {} \
             WHERE consumer = {consumer} AND message_key IN ({}){}",
            self.table,
            keys.join(", "),
            self.share_lock()
        );
        let mut values = vec![Value::from(CONSUMER)];
        values.extend(known.iter().map(|&i| Value::from(messages[i].key.as_str())));
        let rows = tx.query_all_raw(self.statement(sql, values)).await?;
        rows.iter()
            .map(|row| Ok((self.key(row, 0)?, self.record(row)?)))
            .collect()
    }

    /// The business insert of `orders`, one statement.
    async fn insert_charges(
        &self,
        tx: &DatabaseTransaction,
        orders: &[&Order],
    ) -> Result<(), DbErr> {
        let mut p = Params::new(self.backend);
        let mut values = Vec::with_capacity(orders.len() * 2);
        let rows: Vec<String> = orders
            .iter()
            .map(|order| {
                values.extend([Value::from(order.id.as_str()), order.amount.into()]);
                format!("({}, {})", p.next(), p.next())
            })
            .collect();
        let sql = format!(
            "INSERT INTO {} (order_id, amount) VALUES {}",
            self.charges,
            rows.join(", ")
        );
        tx.execute_raw(self.statement(sql, values)).await?;
        Ok(())
    }

    /// Records the completion and output of `keys`, one statement.
    async fn complete(
        &self,
        tx: &DatabaseTransaction,
        keys: &[&str],
        now: i64,
    ) -> Result<(), DbErr> {
        let mut p = Params::new(self.backend);
        let (output, completed_at, consumer) = (p.next(), p.next(), p.next());
        let key = if keys.len() == 1 {
            format!("= {}", p.next())
        } else {
            let list: Vec<String> = keys.iter().map(|_| p.next()).collect();
            format!("IN ({})", list.join(", "))
        };
        let sql = format!(
            "UPDATE {} SET status = 'completed', output = {output}, completed_at = \
             {completed_at} WHERE consumer = {consumer} AND message_key {key}",
            self.table
        );
        let mut values = vec![OUTPUT.into(), now.into(), CONSUMER.into()];
        values.extend(keys.iter().map(|key| Value::from(*key)));
        tx.execute_raw(self.statement(sql, values)).await?;
        Ok(())
    }

    fn insert(&self) -> &'static str {
        match self.backend {
            DbBackend::MySql => "INSERT IGNORE INTO",
            _ => "INSERT INTO",
        }
    }

    fn on_conflict(&self) -> &'static str {
        match self.backend {
            DbBackend::MySql => "",
            _ => " ON CONFLICT DO NOTHING",
        }
    }

    /// A locking read on MariaDB sees the latest committed record inside a REPEATABLE READ
    /// transaction; PostgreSQL and SQLite read it anyway.
    fn share_lock(&self) -> &'static str {
        match self.backend {
            DbBackend::MySql => " LOCK IN SHARE MODE",
            _ => "",
        }
    }

    fn statement(&self, sql: String, values: Vec<Value>) -> Statement {
        Statement::from_sql_and_values(self.backend, sql, values)
    }

    /// A key column: bytes on MariaDB (`VARBINARY`), text elsewhere.
    fn key(&self, row: &QueryResult, index: usize) -> Result<String, DbErr> {
        if self.backend == DbBackend::MySql {
            let bytes: Vec<u8> = row.try_get_by_index(index)?;
            String::from_utf8(bytes).map_err(|e| DbErr::Type(e.to_string()))
        } else {
            row.try_get_by_index(index)
        }
    }

    /// `status, fingerprint, expires_at` from columns 1 to 3.
    fn record(&self, row: &QueryResult) -> Result<Record, DbErr> {
        let fingerprint: Vec<u8> = row.try_get_by_index(2)?;
        Ok(Record {
            status: row.try_get_by_index(1)?,
            fingerprint: fingerprint.try_into().unwrap_or([0; 32]),
            expires_at: row.try_get_by_index(3)?,
        })
    }
}

/// A known key's record.
#[derive(Debug)]
struct Record {
    status: String,
    fingerprint: [u8; 32],
    expires_at: i64,
}

/// What a known key's record decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    Completed,
    Mismatch,
    Busy,
    /// It had expired and is now claimed for this message.
    TakenOver,
}

/// Placeholders in order: `$1, $2...` on PostgreSQL, `?` elsewhere.
pub(super) struct Params {
    numbered: bool,
    next: usize,
}

impl Params {
    pub(super) fn new(backend: DbBackend) -> Self {
        Self {
            numbered: backend == DbBackend::Postgres,
            next: 0,
        }
    }

    pub(super) fn next(&mut self) -> String {
        self.next += 1;
        if self.numbered {
            format!("${}", self.next)
        } else {
            "?".to_owned()
        }
    }
}

/// Begins a transaction; on SQLite an immediate one, which takes the write lock at once rather
/// than failing to upgrade a read lock when writers meet.
pub(super) async fn begin(db: &DatabaseConnection) -> Result<DatabaseTransaction, DbErr> {
    if db.get_database_backend() == DbBackend::Sqlite {
        db.begin_with_options(TransactionOptions {
            sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
            ..TransactionOptions::default()
        })
        .await
    } else {
        db.begin().await
    }
}

pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn retention_ms() -> i64 {
    RETENTION.as_millis() as i64
}

//! SQL access to the inbox table: statements prepared once per inbox, run on any connection or
//! transaction.

pub(crate) mod dialect;
mod many;
#[cfg(feature = "postgres")]
mod many_pg;
pub(crate) mod startup;
mod statements;
pub(crate) mod table;

use std::time::Duration;

use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, TransactionTrait, Value,
};

use crate::clock::duration_ms;
use crate::key::{ConsumerName, InboxKey, MessageKey};
use dialect::{Dialect, Failure, classify};
pub(crate) use many::{BatchClaim, Claims};

/// The most messages one batch transaction carries: its statements bind a few values per
/// message, and every backend limits how many one statement may have. Larger batches are split.
pub const MAX_BATCH: usize = 1000;
use statements::Statements;
use table::TableName;

/// A record's status column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Claimed by a two-phase handler that has not completed.
    InProgress,
    /// Processed; the output is stored.
    Completed,
}

impl Status {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
        }
    }

    /// The status a column holds; `None` for text no version of idem writes.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        match text {
            "in_progress" => Some(Status::InProgress),
            "completed" => Some(Status::Completed),
            _ => None,
        }
    }
}

/// An inbox row as read back, with the database's clock at the time of reading.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    /// The status column as stored; [`Status::parse`] reads it.
    pub(crate) status: String,
    pub(crate) fingerprint: Option<Vec<u8>>,
    pub(crate) output: Option<String>,
    pub(crate) attempts: i64,
    pub(crate) claim_token: i64,
    pub(crate) created_at: i64,
    pub(crate) claimed_at: i64,
    pub(crate) lease_until: Option<i64>,
    pub(crate) completed_at: Option<i64>,
    pub(crate) expires_at: i64,
    /// The database's clock when the row was read.
    pub(crate) now: i64,
}

impl Row {
    /// Reads [`statements::READ_COLUMNS`] and the database's clock from `row`, starting at
    /// column `first`.
    fn read(row: &sea_orm::QueryResult, first: usize) -> Result<Self, DbErr> {
        let column = |n: usize| first + n;
        Ok(Row {
            status: row.try_get_by_index(column(0))?,
            fingerprint: row.try_get_by_index(column(1))?,
            output: row.try_get_by_index(column(2))?,
            attempts: row.try_get_by_index(column(3))?,
            claim_token: row.try_get_by_index(column(4))?,
            created_at: row.try_get_by_index(column(5))?,
            claimed_at: row.try_get_by_index(column(6))?,
            lease_until: row.try_get_by_index(column(7))?,
            completed_at: row.try_get_by_index(column(8))?,
            expires_at: row.try_get_by_index(column(9))?,
            now: row.try_get_by_index(column(10))?,
        })
    }
}

/// The values a claim writes, by insert or by takeover. Times are the database's: a claim gives
/// durations from its clock.
#[derive(Debug, Clone)]
pub(crate) struct ClaimValues<'a> {
    pub(crate) fingerprint: Option<&'a [u8; 32]>,
    pub(crate) attempts: i64,
    pub(crate) claim_token: i64,
    /// When the key was first claimed; `None` for now.
    pub(crate) created_at: Option<i64>,
    /// How long the claim is held before another worker may take it over; `None` for a claim
    /// inside the handler's transaction, which no other worker sees before it completes.
    pub(crate) lease: Option<Duration>,
    /// How long the record is kept after its lease.
    pub(crate) retention: Duration,
}

/// What a probe claim of start-up's schema check did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probed {
    /// It stored its row.
    Stored,
    /// A row with an equal key was there.
    Duplicate,
    /// The table dropped its row (MySQL/MariaDB's `INSERT IGNORE` on a refused value).
    Dropped,
}

impl ClaimValues<'_> {
    /// Every claim is recorded in progress; the handler's completion marks it completed, in
    /// the same transaction (transactional mode) or after the handler (two-phase mode).
    fn values(&self) -> [Value; 5] {
        [
            text(Status::InProgress.as_str()),
            Value::from(self.fingerprint.map(|bytes| bytes.to_vec())),
            Value::from(self.attempts),
            Value::from(self.claim_token),
            Value::from(self.created_at),
        ]
    }

    /// The lease and the expiry, in milliseconds from the database's now. A record in progress
    /// is kept for the retention after its lease, however short the retention: a live claim
    /// never counts as expired.
    fn times(&self) -> [Value; 2] {
        let lease = self.lease.map(duration_ms);
        [
            Value::from(lease),
            Value::from(
                lease
                    .unwrap_or(0)
                    .saturating_add(duration_ms(self.retention)),
            ),
        ]
    }
}

/// The inbox table on one backend.
#[derive(Debug)]
pub(crate) struct Store {
    dialect: Dialect,
    table: TableName,
    /// The table's name quoted for the backend, for statements made elsewhere.
    quoted: String,
    sql: Statements,
    /// PostgreSQL's `lock_timeout` as configured, restored after each claim.
    lock_timeout: String,
    /// How long a claim waits for another transaction holding its key.
    claim_wait: Duration,
    /// On MySQL/MariaDB, the hint naming the table's unique index on `(consumer, message_key)`
    /// (see [`Store::read_key_index`]).
    key_index: Option<String>,
    /// On MySQL/MariaDB, the largest packet the server takes (`max_allowed_packet`, see
    /// [`Store::read_packet_limit`]).
    packet_limit: Option<usize>,
}

/// An output the database would not take in one statement: MySQL/MariaDB reset the connection
/// that sends a packet larger than `max_allowed_packet`, and the transaction goes with it.
#[derive(Debug, thiserror::Error)]
#[error(
    "an output of {bytes} bytes is more than the database takes in one statement \
     (max_allowed_packet is {limit} bytes)"
)]
pub(crate) struct OutputTooLarge {
    bytes: usize,
    limit: usize,
}

/// What a completion's packet carries besides its output, key and consumer, at most.
pub(super) const PACKET_ROOM: usize = 4096;

fn text(value: &str) -> Value {
    Value::from(value.to_owned())
}

fn opt_text(value: Option<&str>) -> Value {
    Value::from(value.map(str::to_owned))
}

impl Store {
    pub(crate) fn new(dialect: Dialect, table: TableName, claim_wait: Duration) -> Self {
        let sql = Statements::new(dialect, &table, claim_wait);
        Self {
            dialect,
            quoted: dialect.quote(table.as_str()),
            table,
            sql,
            lock_timeout: "0".to_owned(),
            claim_wait,
            key_index: None,
            packet_limit: None,
        }
    }

    /// Reads which unique index of a MySQL/MariaDB table is on `(consumer, message_key)`: the
    /// primary key of the table idem creates, or the index a table provisioned otherwise has.
    /// Batch statements that look many keys up name it, so that the server looks each key up
    /// and locks only its record, where a plan that scans would lock every record it reads.
    pub(crate) async fn read_key_index(&mut self, db: &DatabaseConnection) -> Result<(), DbErr> {
        if self.backend() != DbBackend::MySql {
            return Ok(());
        }
        // Column names compare without case; an index on a prefix of a column does not count.
        let sql = "SELECT CAST(index_name AS CHAR), \
                   CAST(GROUP_CONCAT(LOWER(column_name) ORDER BY seq_in_index) AS CHAR), \
                   CAST(MAX(sub_part IS NOT NULL) AS SIGNED) \
                   FROM information_schema.statistics \
                   WHERE table_schema = DATABASE() AND table_name = ? AND non_unique = 0 \
                   GROUP BY index_name ORDER BY index_name <> 'PRIMARY', index_name";
        let rows = db
            .query_all_raw(self.statement(sql, vec![text(self.table.as_str())]))
            .await?;
        for row in rows {
            let name: String = row.try_get_by_index(0)?;
            let columns: String = row.try_get_by_index(1)?;
            let prefixed: i64 = row.try_get_by_index(2)?;
            if columns == "consumer,message_key" && prefixed == 0 {
                self.key_index = Some(format!(" FORCE INDEX (`{}`)", name.replace('`', "``")));
                break;
            }
        }
        Ok(())
    }

    /// Reads the largest packet a MySQL/MariaDB server takes, which an output must leave room
    /// under (see [`Store::check_output`]).
    pub(crate) async fn read_packet_limit(&mut self, db: &DatabaseConnection) -> Result<(), DbErr> {
        if self.backend() == DbBackend::MySql {
            let sql = "SELECT CAST(@@max_allowed_packet AS SIGNED)";
            let limit: i64 = self.first_column(db, sql, Vec::new()).await?;
            self.packet_limit = usize::try_from(limit).ok();
        }
        Ok(())
    }

    /// Refuses an output the database would not take in the statement that completes `key`'s
    /// record: checked before it is sent, since a MySQL/MariaDB server meets a packet larger
    /// than it takes by resetting the connection, and the transaction with it.
    pub(crate) fn check_output(
        &self,
        key: &MessageKey,
        output: &str,
    ) -> Result<(), OutputTooLarge> {
        let Some(limit) = self.packet_limit else {
            return Ok(());
        };
        // The completion binds the key and the consumer beside the output, each with a few
        // bytes of framing, in a packet with a header of its own.
        let bytes = output.len() + 2 * key.as_str().len() + ConsumerName::MAX_LEN + PACKET_ROOM;
        if bytes > limit {
            return Err(OutputTooLarge {
                bytes: output.len(),
                limit,
            });
        }
        Ok(())
    }

    /// Reads the `lock_timeout` PostgreSQL sessions have, which claims restore after bounding
    /// their own wait.
    pub(crate) async fn read_lock_timeout(&mut self, db: &DatabaseConnection) -> Result<(), DbErr> {
        if self.backend() == DbBackend::Postgres {
            let sql = "SELECT current_setting('lock_timeout')";
            if let Some(row) = db.query_one_raw(self.statement(sql, Vec::new())).await? {
                self.lock_timeout = row.try_get_by_index(0)?;
            }
        }
        Ok(())
    }

    pub(crate) fn dialect(&self) -> Dialect {
        self.dialect
    }

    pub(crate) fn backend(&self) -> DbBackend {
        self.dialect.backend()
    }

    pub(crate) fn table(&self) -> &TableName {
        &self.table
    }

    /// The table's name, quoted.
    pub(crate) fn quoted_table(&self) -> &str {
        &self.quoted
    }

    fn statement(&self, sql: &str, values: Vec<Value>) -> Statement {
        Statement::from_sql_and_values(self.backend(), sql, values)
    }

    fn key_values(key: &InboxKey) -> [Value; 2] {
        [text(key.consumer.as_str()), text(key.message_key.as_str())]
    }

    /// Creates the table and its index if they do not exist. On PostgreSQL, whose
    /// `CREATE ... IF NOT EXISTS` races between sessions, creators take turns under a lock.
    pub(crate) async fn create_table(&self, db: &DatabaseConnection) -> Result<(), DbErr> {
        let tx = db.begin().await?;
        if let Some((sql, values)) = self.dialect.schema_lock(self.table.as_str()) {
            tx.query_one_raw(self.statement(&sql, values)).await?;
        }
        for sql in table::create_table_statements(self.backend(), &self.table) {
            tx.execute_unprepared(&sql).await?;
        }
        tx.commit().await
    }

    /// Checks that the table has the schema this version writes and reads: claims a record with
    /// the widest values a claim can have, completes it and reads it back, in a transaction that
    /// is rolled back. A table created by another version fails here, at start-up, instead of
    /// failing every message. The probe's key is this call's own, so replicas starting together
    /// do not wait for each other's probes.
    pub(crate) async fn check_schema(&self, db: &DatabaseConnection) -> Result<(), DbErr> {
        let tx = db.begin().await?;
        let unique = uuid::Uuid::new_v4().simple().to_string();
        let key = InboxKey {
            consumer: ConsumerName::new("c".repeat(ConsumerName::MAX_LEN)).expect("valid"),
            message_key: MessageKey::new(format!(
                "{}{unique}",
                "k".repeat(MessageKey::MAX_LEN - unique.len())
            ))
            .expect("valid"),
        };
        let fingerprint = [0xab; 32];
        let [consumer, message_key] = Self::key_values(&key);
        let values = vec![
            consumer,
            message_key,
            text(Status::InProgress.as_str()),
            Value::from(fingerprint.to_vec()),
            Value::from(i64::from(u32::MAX)),
            Value::from(i64::MIN),
            Value::from(i64::MAX),
            Value::from(i64::MAX),
            Value::from(i64::MAX),
            Value::from(i64::MAX),
            Value::from(i64::MAX),
            Value::from(None::<String>),
        ];
        tx.execute_raw(self.statement(&self.sql.insert_probe, values))
            .await?;
        let completed = self
            .complete(&tx, &key, i64::MIN, Some("{}"), Duration::ZERO)
            .await?;
        let row = self.find(&tx, &key).await?;
        let merged = self.keys_merged(&tx, &key, &unique).await;
        tx.rollback().await?;
        if let Some(merged) = merged? {
            return Err(DbErr::Custom(format!(
                "the table takes keys that differ only {merged} for one another: it needs a \
                 unique key on the whole (consumer, message_key) columns comparing their bytes \
                 (a binary collation)"
            )));
        }
        match row {
            Some(row)
                if completed
                    && row.fingerprint.as_deref() == Some(&fingerprint[..])
                    && row.claim_token == i64::MIN
                    && row.status == Status::Completed.as_str()
                    && row.output.as_deref() == Some("{}") =>
            {
                Ok(())
            }
            other => Err(DbErr::Custom(format!(
                "a probe record did not read back as written: {other:?}"
            ))),
        }
    }

    /// Claims keys that a table made by someone else could take for one another, beside the
    /// probe record `probe`: the probe's key again (no unique key), then pairs that differ only
    /// in case, a trailing space, an accent, a 4-byte character, or past a prefix. Returns how
    /// the first pair the table merged differs.
    async fn keys_merged(
        &self,
        conn: &impl ConnectionTrait,
        probe: &InboxKey,
        unique: &str,
    ) -> Result<Option<&'static str>, DbErr> {
        let claim = ClaimValues {
            fingerprint: None,
            attempts: 1,
            claim_token: 0,
            created_at: None,
            lease: None,
            retention: Duration::ZERO,
        };
        if self.insert_claim(conn, probe, &claim).await? {
            return Ok(Some("in nothing (one key is claimed twice)"));
        }
        let key = |consumer: &str, message_key: String| InboxKey {
            consumer: ConsumerName::new(format!("{consumer}{unique}")).expect("a valid name"),
            message_key: MessageKey::new(message_key).expect("a valid key"),
        };
        let pair = |at: usize, first: &str, second: &str| {
            let ours = |suffix| key("c", format!("{unique}-{at}{suffix}"));
            (Some(ours(first)), ours(second))
        };
        // The probe's key but its last character, not a hexadecimal digit.
        let long = InboxKey {
            consumer: probe.consumer.clone(),
            message_key: MessageKey::new(format!(
                "{}x",
                &probe.message_key.as_str()[..MessageKey::MAX_LEN - 1]
            ))
            .expect("a valid key"),
        };
        let consumers = (
            Some(key("c", format!("{unique}-0"))),
            key("C", format!("{unique}-0")),
        );
        let pairs = [
            (consumers, "in the consumer name's case"),
            (pair(1, "a", "A"), "in case"),
            (pair(2, "a", "a "), "in a trailing space"),
            (pair(3, "a", "\u{e1}"), "in an accent"),
            (pair(4, "\u{1f600}", "\u{1f601}"), "in a 4-byte character"),
            // The probe's own record is the first.
            ((None, long), "in their last byte"),
        ];
        for ((first, second), difference) in &pairs {
            if self
                .pair_merged(conn, first.as_ref(), second, &claim)
                .await?
            {
                return Ok(Some(difference));
            }
        }
        Ok(None)
    }

    /// Claims `first` (unless it is already recorded), then `second`, under a savepoint: whether
    /// the table took `second` for `first`. A key the table refuses outright (a constraint of its
    /// operators, a character its encoding lacks) tells nothing of its key, and is rolled back.
    async fn pair_merged(
        &self,
        conn: &impl ConnectionTrait,
        first: Option<&InboxKey>,
        second: &InboxKey,
        claim: &ClaimValues<'_>,
    ) -> Result<bool, DbErr> {
        conn.execute_unprepared("SAVEPOINT idem_keys").await?;
        let tried = async {
            if let Some(first) = first
                && self.probe_claim(conn, first, claim).await? != Probed::Stored
            {
                return Ok(false);
            }
            Ok(self.probe_claim(conn, second, claim).await? == Probed::Duplicate)
        };
        match tried.await {
            Ok(merged) => {
                conn.execute_unprepared("RELEASE SAVEPOINT idem_keys")
                    .await?;
                Ok(merged)
            }
            Err(error) if classify(&error) == Failure::Unreachable => Err(error),
            Err(_) => {
                conn.execute_unprepared("ROLLBACK TO SAVEPOINT idem_keys")
                    .await?;
                Ok(false)
            }
        }
    }

    /// Claims `key` as a claim does, telling a duplicate key from a row the table drops:
    /// MySQL/MariaDB's `INSERT IGNORE` drops both without an error (and stores a character its
    /// column cannot hold as `?`); with `ON DUPLICATE KEY UPDATE` a duplicate counts two rows.
    async fn probe_claim(
        &self,
        conn: &impl ConnectionTrait,
        key: &InboxKey,
        claim: &ClaimValues<'_>,
    ) -> Result<Probed, DbErr> {
        if self.backend() != DbBackend::MySql {
            // Elsewhere a refused row is an error.
            return Ok(match self.insert_claim(conn, key, claim).await? {
                true => Probed::Stored,
                false => Probed::Duplicate,
            });
        }
        let sql = format!(
            "{} ON DUPLICATE KEY UPDATE claim_token = claim_token + 1",
            self.sql.insert_claim
        );
        let result = conn
            .execute_raw(self.statement(&sql, self.claim_values(key, claim)))
            .await?;
        Ok(match result.rows_affected() {
            0 => Probed::Dropped,
            1 => Probed::Stored,
            _ => Probed::Duplicate,
        })
    }

    /// What [`Store::insert_claim`] binds, PostgreSQL's `lock_timeout` aside.
    fn claim_values(&self, key: &InboxKey, claim: &ClaimValues<'_>) -> Vec<Value> {
        let mut values = Self::key_values(key).to_vec();
        values.extend(claim.values().into_iter().take(4));
        values.extend(claim.times());
        values
    }

    /// Inserts a claim unless a record exists; `true` when this call inserted it. The
    /// database's primary key decides between concurrent claims; a concurrent claim that has not
    /// committed is waited for at most the inbox's claim wait.
    pub(crate) async fn insert_claim(
        &self,
        conn: &impl ConnectionTrait,
        key: &InboxKey,
        claim: &ClaimValues<'_>,
    ) -> Result<bool, DbErr> {
        let mut values = self.claim_values(key, claim);
        if self.backend() == DbBackend::Postgres {
            values.push(text(&self.lock_timeout));
            let row = conn
                .query_one_raw(self.statement(&self.sql.insert_claim, values))
                .await?;
            return Ok(row.is_some());
        }
        let result = conn
            .execute_raw(self.statement(&self.sql.insert_claim, values))
            .await?;
        Ok(result.rows_affected() == 1)
    }

    /// Restores PostgreSQL's `lock_timeout` in a transaction whose claim did not insert (it stays
    /// bounded for a takeover until then).
    pub(crate) async fn end_claim_wait(&self, conn: &impl ConnectionTrait) -> Result<(), DbErr> {
        if let Some(sql) = &self.sql.restore_lock_timeout {
            conn.query_one_raw(self.statement(sql, vec![text(&self.lock_timeout)]))
                .await?;
        }
        Ok(())
    }

    /// The id of the transaction `conn` is in, if it has written (PostgreSQL): a handler that
    /// ended the batch's transaction (a `COMMIT` or `ROLLBACK` of its own) left `conn` outside
    /// it, where every statement commits on its own.
    pub(crate) async fn transaction_id(
        &self,
        conn: &impl ConnectionTrait,
    ) -> Result<Option<i64>, DbErr> {
        self.first_column(conn, "SELECT txid_current_if_assigned()", Vec::new())
            .await
    }

    /// The first column of the one row `sql` returns.
    async fn first_column<T: sea_orm::TryGetable>(
        &self,
        conn: &impl ConnectionTrait,
        sql: &str,
        values: Vec<Value>,
    ) -> Result<T, DbErr> {
        conn.query_one_raw(self.statement(sql, values))
            .await?
            .ok_or_else(|| DbErr::Custom(format!("{sql} returned no row")))?
            .try_get_by_index(0)
    }

    /// Reads a record, with the database's clock.
    pub(crate) async fn find(
        &self,
        conn: &impl ConnectionTrait,
        key: &InboxKey,
    ) -> Result<Option<Row>, DbErr> {
        let row = conn
            .query_one_raw(self.statement(&self.sql.select, Self::key_values(key).into()))
            .await?;
        row.map(|row| Row::read(&row, 0)).transpose()
    }

    /// Replaces a record with a new claim, only if it still carries `previous_token` and may
    /// still be taken over (expired, or in progress with its lease run out, by the database's
    /// clock when the statement runs): of two workers taking over the same record, one wins,
    /// and a completion that lands between the read and the takeover stands.
    pub(crate) async fn take_over(
        &self,
        conn: &impl ConnectionTrait,
        key: &InboxKey,
        previous_token: i64,
        claim: &ClaimValues<'_>,
    ) -> Result<bool, DbErr> {
        let mut values = claim.values().to_vec();
        values.extend(claim.times());
        values.extend(Self::key_values(key));
        values.push(Value::from(previous_token));
        let result = conn
            .execute_raw(self.statement(&self.sql.take_over, values))
            .await?;
        Ok(result.rows_affected() == 1)
    }

    /// Completes a claim with its output, only if `token` still holds it in progress; `false`
    /// when it does not (taken over, or gone with an aborted transaction). The record is kept
    /// for `retention` from now.
    pub(crate) async fn complete(
        &self,
        conn: &impl ConnectionTrait,
        key: &InboxKey,
        token: i64,
        output: Option<&str>,
        retention: Duration,
    ) -> Result<bool, DbErr> {
        let mut values = vec![opt_text(output), Value::from(duration_ms(retention))];
        values.extend(Self::key_values(key));
        values.push(Value::from(token));
        let result = conn
            .execute_raw(self.statement(&self.sql.complete, values))
            .await?;
        Ok(result.rows_affected() == 1)
    }

    /// Extends the lease of a claim that `token` still holds in progress to `lease` from now,
    /// its expiry to `retention` after that; `false` when the claim is no longer this token's
    /// (taken over, completed or released).
    pub(crate) async fn renew(
        &self,
        conn: &impl ConnectionTrait,
        key: &InboxKey,
        token: i64,
        lease: Duration,
        retention: Duration,
    ) -> Result<bool, DbErr> {
        let lease = duration_ms(lease);
        let mut values = vec![
            Value::from(lease),
            Value::from(lease.saturating_add(duration_ms(retention))),
        ];
        values.extend(Self::key_values(key));
        values.push(Value::from(token));
        let result = conn
            .execute_raw(self.statement(&self.sql.renew, values))
            .await?;
        Ok(result.rows_affected() == 1)
    }

    /// Deletes a claim held by `token`, so a redelivery can retry.
    pub(crate) async fn release(
        &self,
        conn: &impl ConnectionTrait,
        key: &InboxKey,
        token: i64,
    ) -> Result<bool, DbErr> {
        self.on_claim(conn, &self.sql.release, key, token).await
    }

    /// Ends the lease of the claim `token` holds on `key` at once, keeping the record and its
    /// attempts: the next claim takes it over. Returns whether the claim was still held.
    pub(crate) async fn hand_on(
        &self,
        conn: &impl ConnectionTrait,
        key: &InboxKey,
        token: i64,
    ) -> Result<bool, DbErr> {
        self.on_claim(conn, &self.sql.hand_on, key, token).await
    }

    /// Runs `sql`, which binds a key and a claim token, on the claim `token` holds on `key`;
    /// returns whether it met the claim.
    async fn on_claim(
        &self,
        conn: &impl ConnectionTrait,
        sql: &str,
        key: &InboxKey,
        token: i64,
    ) -> Result<bool, DbErr> {
        let mut values = Self::key_values(key).to_vec();
        values.push(Value::from(token));
        let result = conn.execute_raw(self.statement(sql, values)).await?;
        Ok(result.rows_affected() == 1)
    }

    /// Deletes a record whatever its state (an operator's reset).
    pub(crate) async fn delete(
        &self,
        conn: &impl ConnectionTrait,
        key: &InboxKey,
    ) -> Result<bool, DbErr> {
        let result = conn
            .execute_raw(self.statement(&self.sql.delete, Self::key_values(key).into()))
            .await?;
        Ok(result.rows_affected() == 1)
    }

    /// The database's clock, in milliseconds since the Unix epoch.
    pub(crate) async fn now(&self, conn: &impl ConnectionTrait) -> Result<i64, DbErr> {
        let row = conn
            .query_one_raw(self.statement(&self.sql.now, Vec::new()))
            .await?
            .ok_or_else(|| DbErr::Custom("the database did not tell its time".to_owned()))?;
        row.try_get_by_index(0)
    }

    /// Deletes at most `limit` records that expired before `before`, leaving those another
    /// transaction holds for a later run; returns how many.
    pub(crate) async fn delete_expired(
        &self,
        db: &DatabaseConnection,
        before: i64,
        limit: u32,
    ) -> Result<u64, DbErr> {
        let values = vec![Value::from(before), Value::from(i64::from(limit))];
        let statement = self.statement(&self.sql.delete_expired, values);
        if self.backend() == DbBackend::MySql {
            return self.delete_unheld(db, statement).await;
        }
        Ok(db.execute_raw(statement).await?.rows_affected())
    }

    /// Tries to take the cleaner lock for this table, held until the transaction `conn` ends
    /// (PostgreSQL) or until [`Store::unlock_cleaner`] (MySQL/MariaDB).
    pub(crate) async fn try_lock_cleaner(
        &self,
        conn: &impl ConnectionTrait,
    ) -> Result<bool, DbErr> {
        let (sql, values) = self.dialect.try_lock("cleaner", self.table.as_str());
        let row = conn.query_one_raw(self.statement(&sql, values)).await?;
        let Some(row) = row else { return Ok(false) };
        Ok(match self.backend() {
            DbBackend::Postgres => row.try_get_by_index::<bool>(0)?,
            _ => row.try_get_by_index::<Option<i64>>(0)? == Some(1),
        })
    }

    /// The file of a SQLite connection's main database, as SQLite resolved it; `None` for an
    /// in-memory or temporary database.
    pub(crate) async fn sqlite_file(
        &self,
        conn: &impl ConnectionTrait,
    ) -> Result<Option<String>, DbErr> {
        let sql = "SELECT file FROM pragma_database_list WHERE name = 'main'";
        let row = conn.query_one_raw(self.statement(sql, Vec::new())).await?;
        let file = match row {
            Some(row) => row.try_get_by_index::<Option<String>>(0)?,
            None => None,
        };
        Ok(file.filter(|file| !file.is_empty()))
    }

    /// Releases a MySQL/MariaDB cleaner lock (PostgreSQL's goes with its transaction).
    pub(crate) async fn unlock_cleaner(&self, conn: &impl ConnectionTrait) -> Result<(), DbErr> {
        if let Some((sql, values)) = self.dialect.unlock("cleaner", self.table.as_str()) {
            conn.query_one_raw(self.statement(&sql, values)).await?;
        }
        Ok(())
    }
}

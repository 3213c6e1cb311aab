//! The inbox table on one backend: its statements, and those that act on one record.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DbBackend, DbErr, QueryResult, Statement, Value};

use super::dialect::Dialect;
use super::sql::InboxTable;
use super::statements::Statements;
use super::table::TableName;
use super::values::{ClaimValues, LiveClaim, Row, opt_text, text};
use crate::clock::duration_ms;
use crate::key::{ConsumerName, InboxKey, MessageKey};

/// The most messages one batch transaction carries: its statements bind a few values per
/// message, and every backend limits how many one statement may have. Larger batches are split.
pub const MAX_BATCH: usize = 1000;

/// The inbox table on one backend.
#[derive(Debug)]
pub(crate) struct Store {
    pub(super) dialect: Dialect,
    pub(super) table: TableName,
    /// The table's name quoted for the backend, for statements made elsewhere.
    pub(super) quoted: String,
    pub(super) sql: Statements,
    /// PostgreSQL's `lock_timeout` as configured, restored after each claim.
    pub(super) lock_timeout: String,
    /// How long a claim waits for another transaction holding its key.
    pub(super) claim_wait: Duration,
    /// On MySQL/MariaDB, the hint naming the table's unique index on `(consumer, message_key)`
    /// (see `Setup::read_key_index`).
    pub(super) key_index: Option<String>,
    /// On MySQL/MariaDB, the largest packet the server takes (`max_allowed_packet`, see
    /// `Setup::read_packet_limit`).
    pub(super) packet_limit: Option<usize>,
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

    /// This store, its claims waiting at most `claim_wait` for another transaction holding
    /// their key.
    pub(crate) fn with_claim_wait(&self, claim_wait: Duration) -> Self {
        Self {
            dialect: self.dialect,
            table: self.table.clone(),
            quoted: self.quoted.clone(),
            sql: Statements::new(self.dialect, &self.table, claim_wait),
            lock_timeout: self.lock_timeout.clone(),
            claim_wait,
            key_index: self.key_index.clone(),
            packet_limit: self.packet_limit,
        }
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

    pub(crate) fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// How long a claim waits for another transaction holding its key, and PostgreSQL's
    /// `lock_timeout` as configured, to restore after a bounded wait.
    pub(crate) fn claim_wait(&self) -> (Duration, &str) {
        (self.claim_wait, &self.lock_timeout)
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

    /// The table `<table>_<suffix>` beside the inbox, quoted.
    pub(crate) fn companion(&self, suffix: &str) -> String {
        (self.dialect).quote(&format!("{}_{suffix}", self.table.as_str()))
    }

    pub(crate) fn statement(&self, sql: &str, values: Vec<Value>) -> Statement {
        Statement::from_sql_and_values(self.backend(), sql, values)
    }

    pub(super) fn key_values(key: &InboxKey) -> [Value; 2] {
        [text(key.consumer.as_str()), text(key.message_key.as_str())]
    }

    /// What [`Store::insert_claim`] binds, PostgreSQL's `lock_timeout` aside.
    pub(super) fn claim_values(&self, key: &InboxKey, claim: &ClaimValues<'_>) -> Vec<Value> {
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
        // Where the claim bounds its wait for the transaction, it binds the bound to restore
        // and returns a row when it inserted.
        if self.dialect.set_lock_timeout().is_some() {
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
        let Some(sql) = self.dialect.transaction_id() else {
            return Ok(None);
        };
        self.first_column(conn, sql, Vec::new()).await
    }

    /// The first column of the one row `sql` returns.
    pub(super) async fn first_column<T: sea_orm::TryGetable>(
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

    /// The record of `key` as committed, read without taking a lock or waiting for one (a claim
    /// in a transaction still running is not seen): what an operator looks at.
    pub(crate) async fn peek(
        &self,
        conn: &impl ConnectionTrait,
        key: &InboxKey,
    ) -> Result<Option<Row>, DbErr> {
        let values = Self::key_values(key).into();
        let row = conn
            .query_one_raw(self.statement(&self.sql.peek, values))
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

    /// Ends the lease of the claim `token` holds on `key` at once and replaces its token with
    /// `new_token`, keeping the record and its attempts: the next claim takes it over, and the
    /// worker that held it can neither renew nor complete it. Returns whether the claim was
    /// still held.
    pub(crate) async fn revoke(
        &self,
        conn: &impl ConnectionTrait,
        key: &InboxKey,
        token: i64,
        new_token: i64,
        live: LiveClaim,
    ) -> Result<bool, DbErr> {
        let mut values = vec![Value::from(new_token)];
        values.extend(Self::key_values(key));
        values.push(Value::from(token));
        let sql = match live {
            LiveClaim::Refuse => &self.sql.revoke_expired,
            LiveClaim::Override => &self.sql.revoke,
        };
        let result = conn.execute_raw(self.statement(sql, values)).await?;
        Ok(result.rows_affected() == 1)
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

    /// Deletes a record (an operator's reset), a live claim only when `live` overrides it;
    /// returns whether it was deleted.
    pub(crate) async fn delete(
        &self,
        conn: &impl ConnectionTrait,
        key: &InboxKey,
        live: LiveClaim,
    ) -> Result<bool, DbErr> {
        let sql = match live {
            LiveClaim::Refuse => &self.sql.delete_unless_live,
            LiveClaim::Override => &self.sql.delete,
        };
        let result = conn
            .execute_raw(self.statement(sql, Self::key_values(key).into()))
            .await?;
        Ok(result.rows_affected() == 1)
    }

    /// The table as the statements over many keys see it.
    pub(super) fn inbox_table(&self) -> InboxTable<'_> {
        InboxTable {
            quoted: &self.quoted,
            key_index: self.key_index.as_deref(),
            claim_wait: self.claim_wait,
            lock_timeout: &self.lock_timeout,
        }
    }

    /// A message key read back from column `index`: MySQL/MariaDB store keys as bytes.
    pub(crate) fn read_key(&self, row: &QueryResult, index: usize) -> Result<String, DbErr> {
        if !self.dialect.binary_keys() {
            return row.try_get_by_index(index);
        }
        let bytes: Vec<u8> = row.try_get_by_index(index)?;
        String::from_utf8(bytes)
            .map_err(|_| DbErr::Custom("a message key that is not UTF-8".to_owned()))
    }
}

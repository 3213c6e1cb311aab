//! SQL access to the inbox table: statements prepared once per inbox, run on any connection or
//! transaction.

mod statements;
pub(crate) mod table;

use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, TransactionTrait, Value,
};

use crate::key::{ConsumerName, InboxKey, MessageKey};
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

    fn parse(text: &str) -> Result<Self, DbErr> {
        match text {
            "in_progress" => Ok(Status::InProgress),
            "completed" => Ok(Status::Completed),
            other => Err(DbErr::Custom(format!("unknown inbox status {other:?}"))),
        }
    }
}

/// An inbox row as read back.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) status: Status,
    pub(crate) fingerprint: Option<Vec<u8>>,
    pub(crate) output: Option<String>,
    pub(crate) attempts: i64,
    pub(crate) claim_token: i64,
    pub(crate) created_at: i64,
    pub(crate) claimed_at: i64,
    pub(crate) lease_until: Option<i64>,
    pub(crate) completed_at: Option<i64>,
    pub(crate) expires_at: i64,
}

/// The values a claim writes, by insert or by takeover.
#[derive(Debug, Clone)]
pub(crate) struct ClaimValues<'a> {
    pub(crate) status: Status,
    pub(crate) fingerprint: Option<&'a [u8; 32]>,
    pub(crate) attempts: i64,
    pub(crate) claim_token: i64,
    pub(crate) created_at: i64,
    pub(crate) claimed_at: i64,
    pub(crate) lease_until: Option<i64>,
    pub(crate) completed_at: Option<i64>,
    pub(crate) expires_at: i64,
}

/// The inbox table on one backend.
#[derive(Debug)]
pub(crate) struct Store {
    backend: DbBackend,
    table: TableName,
    sql: Statements,
}

fn text(value: &str) -> Value {
    Value::from(value.to_owned())
}

fn opt_text(value: Option<&str>) -> Value {
    Value::from(value.map(str::to_owned))
}

impl Store {
    pub(crate) fn new(backend: DbBackend, table: TableName) -> Self {
        let sql = Statements::new(backend, &table);
        Self {
            backend,
            table,
            sql,
        }
    }

    pub(crate) fn backend(&self) -> DbBackend {
        self.backend
    }

    pub(crate) fn table(&self) -> &TableName {
        &self.table
    }

    fn statement(&self, sql: &str, values: Vec<Value>) -> Statement {
        Statement::from_sql_and_values(self.backend, sql, values)
    }

    fn key_values(key: &InboxKey) -> [Value; 2] {
        [text(key.consumer.as_str()), text(key.message_key.as_str())]
    }

    /// Creates the table and its index if they do not exist.
    pub(crate) async fn create_table(&self, conn: &impl ConnectionTrait) -> Result<(), DbErr> {
        for sql in table::create_table_statements(self.backend, &self.table) {
            conn.execute_unprepared(&sql).await?;
        }
        Ok(())
    }

    /// Checks that the table has the schema this version writes and reads: inserts a record with
    /// the widest values a claim can have and reads it back, in a transaction that is rolled
    /// back. A table created by another version fails here, at start-up, instead of failing
    /// every message.
    pub(crate) async fn check_schema(&self, db: &DatabaseConnection) -> Result<(), DbErr> {
        let tx = db.begin().await?;
        let key = InboxKey {
            consumer: ConsumerName::new("c".repeat(ConsumerName::MAX_LEN)).expect("valid"),
            message_key: MessageKey::new("k".repeat(MessageKey::MAX_LEN)).expect("valid"),
        };
        let fingerprint = [0xab; 32];
        let claim = ClaimValues {
            status: Status::InProgress,
            fingerprint: Some(&fingerprint),
            attempts: i64::from(u32::MAX),
            claim_token: i64::MIN,
            created_at: i64::MAX,
            claimed_at: i64::MAX,
            lease_until: Some(i64::MAX),
            completed_at: Some(i64::MAX),
            expires_at: i64::MAX,
        };
        let [consumer, message_key] = Self::key_values(&key);
        let mut values = vec![consumer, message_key];
        values.extend(claim_values(&claim));
        tx.execute_raw(self.statement(&self.sql.insert_probe, values))
            .await?;
        self.set_output(&tx, &key, "{}").await?;
        let row = self.find(&tx, &key).await?;
        tx.rollback().await?;
        match row {
            Some(row)
                if row.fingerprint.as_deref() == Some(&fingerprint[..])
                    && row.claim_token == i64::MIN
                    && row.output.as_deref() == Some("{}") =>
            {
                Ok(())
            }
            other => Err(DbErr::Custom(format!(
                "a probe record did not read back as written: {other:?}"
            ))),
        }
    }

    /// Inserts a claim unless a record exists; `true` when this call inserted it. The
    /// database's primary key decides between concurrent claims.
    pub(crate) async fn insert_claim(
        &self,
        conn: &impl ConnectionTrait,
        key: &InboxKey,
        claim: &ClaimValues<'_>,
    ) -> Result<bool, DbErr> {
        let [consumer, message_key] = Self::key_values(key);
        let mut values = vec![consumer, message_key];
        values.extend(claim_values(claim));
        let result = conn
            .execute_raw(self.statement(&self.sql.insert_claim, values))
            .await?;
        Ok(result.rows_affected() == 1)
    }

    /// Reads a record.
    pub(crate) async fn find(
        &self,
        conn: &impl ConnectionTrait,
        key: &InboxKey,
    ) -> Result<Option<Row>, DbErr> {
        let row = conn
            .query_one_raw(self.statement(&self.sql.select, Self::key_values(key).into()))
            .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(Row {
            status: Status::parse(&row.try_get_by_index::<String>(0)?)?,
            fingerprint: row.try_get_by_index(1)?,
            output: row.try_get_by_index(2)?,
            attempts: row.try_get_by_index(3)?,
            claim_token: row.try_get_by_index(4)?,
            created_at: row.try_get_by_index(5)?,
            claimed_at: row.try_get_by_index(6)?,
            lease_until: row.try_get_by_index(7)?,
            completed_at: row.try_get_by_index(8)?,
            expires_at: row.try_get_by_index(9)?,
        }))
    }

    /// Replaces a record with a new claim, only if it still carries `previous_token`: of two
    /// workers taking over the same record, one wins.
    pub(crate) async fn take_over(
        &self,
        conn: &impl ConnectionTrait,
        key: &InboxKey,
        previous_token: i64,
        claim: &ClaimValues<'_>,
    ) -> Result<bool, DbErr> {
        let mut values = claim_values(claim);
        values.extend(Self::key_values(key));
        values.push(Value::from(previous_token));
        let result = conn
            .execute_raw(self.statement(&self.sql.take_over, values))
            .await?;
        Ok(result.rows_affected() == 1)
    }

    /// Stores the output of a transactional handler, inside its transaction.
    pub(crate) async fn set_output(
        &self,
        conn: &impl ConnectionTrait,
        key: &InboxKey,
        output: &str,
    ) -> Result<(), DbErr> {
        let mut values = vec![text(output)];
        values.extend(Self::key_values(key));
        conn.execute_raw(self.statement(&self.sql.set_output, values))
            .await?;
        Ok(())
    }

    /// Completes a two-phase claim, only if `token` still holds it; `false` when the claim was
    /// taken over (fencing).
    pub(crate) async fn complete(
        &self,
        conn: &impl ConnectionTrait,
        key: &InboxKey,
        token: i64,
        output: Option<&str>,
        completed_at: i64,
        expires_at: i64,
    ) -> Result<bool, DbErr> {
        let mut values = vec![
            opt_text(output),
            Value::from(completed_at),
            Value::from(expires_at),
        ];
        values.extend(Self::key_values(key));
        values.push(Value::from(token));
        let result = conn
            .execute_raw(self.statement(&self.sql.complete, values))
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
        let mut values = Self::key_values(key).to_vec();
        values.push(Value::from(token));
        let result = conn
            .execute_raw(self.statement(&self.sql.release, values))
            .await?;
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

    /// Deletes at most `limit` records that expired before `now`; returns how many.
    pub(crate) async fn delete_expired(
        &self,
        conn: &impl ConnectionTrait,
        now: i64,
        limit: u32,
    ) -> Result<u64, DbErr> {
        let values = vec![Value::from(now), Value::from(i64::from(limit))];
        let result = conn
            .execute_raw(self.statement(&self.sql.delete_expired, values))
            .await?;
        Ok(result.rows_affected())
    }

    /// Tries to take the cleaner lock for this table, held until the transaction `conn` ends
    /// (PostgreSQL) or until [`Store::unlock_cleaner`] (MySQL/MariaDB).
    pub(crate) async fn try_lock_cleaner(
        &self,
        conn: &impl ConnectionTrait,
    ) -> Result<bool, DbErr> {
        let (sql, values) = self.sql.cleaner_lock(&self.table);
        let row = conn.query_one_raw(self.statement(sql, values)).await?;
        let Some(row) = row else { return Ok(false) };
        Ok(match self.backend {
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
        if let Some((sql, values)) = self.sql.cleaner_unlock(&self.table) {
            conn.query_one_raw(self.statement(sql, values)).await?;
        }
        Ok(())
    }
}

fn claim_values(claim: &ClaimValues<'_>) -> Vec<Value> {
    vec![
        text(claim.status.as_str()),
        Value::from(claim.fingerprint.map(|bytes| bytes.to_vec())),
        Value::from(claim.attempts),
        Value::from(claim.claim_token),
        Value::from(claim.created_at),
        Value::from(claim.claimed_at),
        Value::from(claim.lease_until),
        Value::from(claim.completed_at),
        Value::from(claim.expires_at),
    ]
}

//! What an operator reads of the inbox table as a whole: its records counted per consumer and
//! status.

use sea_orm::{ConnectionTrait, DbErr, QueryResult, Statement, Value};

use super::access::Store;
use super::values::{Status, text};

/// The records of one consumer in one status, as one row of [`Census::count`] reads them.
#[derive(Debug, Clone)]
pub(crate) struct StatusCount {
    pub(crate) consumer: String,
    pub(crate) status: Option<Status>,
    pub(crate) records: u64,
    /// Of them, past their expiry (awaiting the cleaner).
    pub(crate) expired: u64,
    pub(crate) max_attempts: i64,
    pub(crate) oldest_created_at: i64,
    pub(crate) newest_created_at: i64,
    pub(crate) oldest_claimed_at: i64,
    /// The database's clock.
    pub(crate) now: i64,
    /// The longest retention of its completed records (expiry less completion), in ms.
    pub(crate) retention_ms: Option<i64>,
}

/// The records counted per consumer and status, on an inbox's [`Store`].
pub(crate) struct Census<'s>(&'s Store);

impl<'s> Census<'s> {
    /// The room of `store`.
    pub(crate) fn of(store: &'s Store) -> Self {
        Self(store)
    }

    /// Counts the records per consumer and status, of `consumer` only when given, in the
    /// order of consumers.
    pub(crate) async fn count(
        &self,
        conn: &impl ConnectionTrait,
        consumer: Option<&str>,
    ) -> Result<Vec<StatusCount>, DbErr> {
        let now = self.0.dialect().now_ms();
        let filter = if consumer.is_some() {
            " WHERE consumer = ?"
        } else {
            ""
        };
        let sql = self.0.dialect().placeholders(&format!(
            "SELECT consumer, status, COUNT(*), COUNT(CASE WHEN expires_at <= {now} THEN 1 END), \
             MAX(attempts), MIN(created_at), MAX(created_at), MIN(claimed_at), {now}, \
             MAX(CASE WHEN completed_at IS NOT NULL THEN expires_at - completed_at END) \
             FROM {}{filter} GROUP BY consumer, status ORDER BY consumer, status",
            self.0.quoted_table()
        ));
        let values: Vec<Value> = consumer.into_iter().map(text).collect();
        let rows = conn
            .query_all_raw(Statement::from_sql_and_values(
                self.0.backend(),
                sql,
                values,
            ))
            .await?;
        rows.iter().map(read).collect()
    }
}

fn read(row: &QueryResult) -> Result<StatusCount, DbErr> {
    let count = |at: usize| -> Result<u64, DbErr> {
        Ok(u64::try_from(row.try_get_by_index::<i64>(at)?).unwrap_or(0))
    };
    let status: String = row.try_get_by_index(1)?;
    Ok(StatusCount {
        consumer: row.try_get_by_index(0)?,
        status: Status::parse(&status),
        records: count(2)?,
        expired: count(3)?,
        max_attempts: row.try_get_by_index(4)?,
        oldest_created_at: row.try_get_by_index(5)?,
        newest_created_at: row.try_get_by_index(6)?,
        oldest_claimed_at: row.try_get_by_index(7)?,
        now: row.try_get_by_index(8)?,
        retention_ms: row.try_get_by_index(9)?,
    })
}

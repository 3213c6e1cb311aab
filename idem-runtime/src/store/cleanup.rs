//! The cleaner's statements: the database's clock, expired records deleted in bounded batches,
//! and the lock that lets one cleaner run at a time.

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, QueryResult, TransactionOptions, Value};

use super::access::MAX_BATCH;
use super::access::Store;
use super::dialect::begin_detached;
use super::dialect::lock_name;
use super::sql::{ExpiredDelete, InboxTable};
use super::values::{Deleted, Status, text};

/// The cleaner's statements, on an inbox's [`Store`].
pub(crate) struct Cleaning<'s>(&'s Store);

impl<'s> Cleaning<'s> {
    /// The room of `store`.
    pub(crate) fn of(store: &'s Store) -> Self {
        Self(store)
    }

    /// The database's clock, in milliseconds since the Unix epoch.
    pub(crate) async fn now(&self, conn: &impl ConnectionTrait) -> Result<i64, DbErr> {
        let row = conn
            .query_one_raw(self.0.statement(&self.0.sql.now, Vec::new()))
            .await?
            .ok_or_else(|| DbErr::Custom("the database did not tell its time".to_owned()))?;
        row.try_get_by_index(0)
    }

    /// Deletes at most `limit` records that expired before `before`, leaving those another
    /// transaction holds for a later run; returns the records deleted.
    pub(crate) async fn delete_expired(
        &self,
        db: &DatabaseConnection,
        before: i64,
        limit: u32,
    ) -> Result<Vec<Deleted>, DbErr> {
        let values = vec![Value::from(before), Value::from(i64::from(limit))];
        match &self.0.sql.delete_expired {
            ExpiredDelete::Returning(sql) => {
                let rows = db.query_all_raw(self.0.statement(sql, values)).await?;
                rows.iter().map(|row| self.read_deleted(row)).collect()
            }
            ExpiredDelete::SelectThenDelete { select, delete } => {
                let select = self.0.statement(select, values);
                self.delete_unheld(db, select, *delete).await
            }
        }
    }

    /// A deleted record, from its `consumer, message_key, status, completed_at` columns.
    pub(crate) fn read_deleted(&self, row: &QueryResult) -> Result<Deleted, DbErr> {
        let status: String = row.try_get_by_index(2)?;
        Ok(Deleted {
            consumer: self.0.read_key(row, 0)?,
            key: self.0.read_key(row, 1)?,
            completed: Status::parse(&status) == Some(Status::Completed),
            completed_at: row.try_get_by_index(3)?,
        })
    }

    /// Tries to take the cleaner lock for this table, held until the transaction `conn` ends
    /// (PostgreSQL) or until [`Cleaning::unlock_cleaner`] (MySQL/MariaDB).
    pub(crate) async fn try_lock_cleaner(
        &self,
        conn: &impl ConnectionTrait,
    ) -> Result<bool, DbErr> {
        let (sql, values) = (self.0.dialect).try_lock(&lock_name("cleaner", self.0.table.as_str()));
        let row = conn.query_one_raw(self.0.statement(&sql, values)).await?;
        let Some(row) = row else { return Ok(false) };
        self.0.dialect.lock_taken(&row)
    }

    /// The file of the connection's main database, as the database resolved it, where one
    /// process owns it (SQLite); `None` for an in-memory or temporary database, or elsewhere.
    pub(crate) async fn database_file(
        &self,
        conn: &impl ConnectionTrait,
    ) -> Result<Option<String>, DbErr> {
        let Some(sql) = self.0.dialect.database_file() else {
            return Ok(None);
        };
        let row = conn
            .query_one_raw(self.0.statement(sql, Vec::new()))
            .await?;
        let file = match row {
            Some(row) => row.try_get_by_index::<Option<String>>(0)?,
            None => None,
        };
        Ok(file.filter(|file| !file.is_empty()))
    }

    /// Releases a MySQL/MariaDB cleaner lock (PostgreSQL's goes with its transaction).
    pub(crate) async fn unlock_cleaner(&self, conn: &impl ConnectionTrait) -> Result<(), DbErr> {
        if let Some((sql, values)) =
            (self.0.dialect).unlock(&lock_name("cleaner", self.0.table.as_str()))
        {
            conn.query_one_raw(self.0.statement(&sql, values)).await?;
        }
        Ok(())
    }

    /// In one short transaction, takes the keys `select` gives (expired records no other
    /// transaction holds, locked), then deletes their records by key with `delete`'s statement
    /// (MySQL/MariaDB).
    pub(crate) async fn delete_unheld(
        &self,
        db: &DatabaseConnection,
        select: sea_orm::Statement,
        delete: fn(&InboxTable<'_>, usize) -> String,
    ) -> Result<Vec<Deleted>, DbErr> {
        let tx = begin_detached(db, TransactionOptions::default()).await?;
        let rows = tx.query_all_raw(select).await?;
        // A statement binds at most 65 535 values.
        for rows in rows.chunks(MAX_BATCH) {
            let padded = rows.len().max(1).next_power_of_two();
            let mut values = Vec::with_capacity(padded * 2);
            for row in rows {
                values.push(text(&self.0.read_key(row, 0)?));
                values.push(text(&self.0.read_key(row, 1)?));
            }
            // Padded with the last key again, which deletes nothing more.
            let last = values[values.len() - 2..].to_vec();
            for _ in rows.len()..padded {
                values.extend(last.iter().cloned());
            }
            let sql = delete(&self.0.inbox_table(), padded);
            tx.execute_raw(self.0.statement(&sql, values)).await?;
        }
        tx.commit().await?;
        // Every row read is locked by this transaction: each is deleted.
        rows.iter().map(|row| self.read_deleted(row)).collect()
    }
}

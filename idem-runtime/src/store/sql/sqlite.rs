//! SQLite's SQL.
//!
//! One process owns a SQLite file: its writers take the write lock as their transaction begins,
//! its relays, batches and cleaners take turns in that process, and no row is locked.

use std::time::Duration;

use sea_orm::{DbBackend, DbErr, QueryResult, SqliteTransactionMode, TransactionOptions};

use super::inbox::{ClaimsReturn, Completion, ExpiredDelete, InboxSql, InboxTable};
use super::lists;
use super::outbox::{self, Bound, OutboxSql, RunBounds, Staging};
use super::schema::{self, InboxTypes, OutboxTypes, SchemaSql};
use super::syntax::{Syntax, WithValues};
use crate::key::{ConsumerName, MessageKey};
use crate::store::values::{BatchClaim, CLAIM_COLUMNS};

/// SQLite.
#[derive(Debug)]
pub(crate) struct Sqlite;

impl Syntax for Sqlite {
    fn backend(&self) -> DbBackend {
        DbBackend::Sqlite
    }

    fn quote(&self, name: &str) -> String {
        format!("\"{name}\"")
    }

    fn now_ms(&self) -> &'static str {
        "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
    }

    fn placeholders(&self, sql: &str) -> String {
        sql.to_owned()
    }

    /// The connection's busy timeout bounds it.
    fn with_lock_wait(&self, statement: &str, _: Duration) -> String {
        statement.to_owned()
    }

    fn set_lock_timeout(&self) -> Option<&'static str> {
        None
    }

    fn read_lock_timeout(&self) -> Option<&'static str> {
        None
    }

    fn skip_locked(&self) -> &'static str {
        ""
    }

    fn locking_read(&self) -> &'static str {
        ""
    }

    fn force_index(&self, _: &[String]) -> String {
        String::new()
    }

    fn transaction_options(&self) -> TransactionOptions {
        TransactionOptions {
            sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
            ..TransactionOptions::default()
        }
    }

    fn one_process(&self) -> bool {
        true
    }

    /// The setting is stored in the database file; an in-memory database keeps its own
    /// journal.
    fn database_file(&self) -> Option<&'static str> {
        Some("SELECT file FROM pragma_database_list WHERE name = 'main'")
    }

    fn on_open(&self) -> Option<&'static str> {
        Some("PRAGMA journal_mode = WAL")
    }

    fn aborts_on_error(&self) -> bool {
        false
    }

    fn open_transaction(&self) -> Option<&'static str> {
        None
    }

    fn still_open(&self) -> &'static str {
        "SELECT 1"
    }

    fn transaction_id(&self) -> Option<&'static str> {
        None
    }

    fn conflicts_as_errors(&self) -> bool {
        false
    }

    fn collations_merge_keys(&self) -> bool {
        false
    }

    fn binary_keys(&self) -> bool {
        false
    }

    /// Its processes serialize in process instead: a statement that always takes it.
    fn try_lock(&self, _: &str) -> WithValues {
        ("SELECT 1".to_owned(), Vec::new())
    }

    fn lock_taken(&self, row: &QueryResult) -> Result<bool, DbErr> {
        Ok(row.try_get_by_index::<Option<i64>>(0)? == Some(1))
    }

    fn unlock(&self, _: &str) -> Option<WithValues> {
        None
    }

    fn schema_lock(&self, _: &str) -> Option<WithValues> {
        None
    }
}

impl InboxSql for Sqlite {
    fn insert_claim(&self, t: &str, values: &str, _: Duration) -> String {
        format!(
            "INSERT INTO {t} ({CLAIM_COLUMNS}) VALUES ({values}) \
             ON CONFLICT (consumer, message_key) DO NOTHING"
        )
    }

    fn counting_probe(&self, _: &str) -> Option<String> {
        None
    }

    fn delete_expired(&self, t: &str) -> ExpiredDelete {
        ExpiredDelete::Returning(format!(
            "DELETE FROM {t} WHERE rowid IN (SELECT rowid FROM {t} WHERE expires_at < ? LIMIT ?) \
             RETURNING consumer, message_key, status, completed_at"
        ))
    }

    fn key_index_query(&self) -> Option<&'static str> {
        None
    }

    fn key_index_hint(&self, _: &str) -> String {
        String::new()
    }

    fn packet_limit_query(&self) -> Option<&'static str> {
        None
    }

    fn claims_return(&self) -> ClaimsReturn {
        ClaimsReturn::Keys
    }

    fn insert_claims(
        &self,
        at: &InboxTable<'_>,
        consumer: &ConsumerName,
        claims: &[BatchClaim<'_>],
        token: i64,
        retention: Duration,
    ) -> WithValues {
        lists::insert_claims(at, self.now_ms(), consumer, claims, token, retention)
    }

    fn find_many(
        &self,
        at: &InboxTable<'_>,
        consumer: &ConsumerName,
        keys: &[&MessageKey],
    ) -> WithValues {
        lists::find_many(at, self.now_ms(), at.hint(), consumer, keys)
    }

    fn completion_bytes(&self, _: &InboxTable<'_>, limit: usize) -> usize {
        limit
    }

    fn complete_many(&self, at: &InboxTable<'_>, completion: &Completion<'_>) -> WithValues {
        lists::case_completion(at, self.now_ms(), at.hint(), completion)
    }

    fn release_many(
        &self,
        at: &InboxTable<'_>,
        consumer: &ConsumerName,
        token: i64,
        keys: &[&MessageKey],
    ) -> WithValues {
        lists::release_many(at, consumer, token, keys)
    }
}

impl OutboxSql for Sqlite {
    fn staging(&self, t: &str, guard: &str) -> Staging {
        Staging {
            plain: outbox::insert_or_nothing(t, self.now_ms(), guard),
            announced: None,
            returns_rows: false,
        }
    }

    fn origin_bytes(&self) -> &'static str {
        "origin"
    }

    fn same_run(&self) -> &'static str {
        "origin = ?"
    }

    fn unsent_of_runs(&self, t: &str, hint: &str, runs: &[RunBounds<'_>]) -> WithValues {
        lists::unsent_of_runs(t, self.now_ms(), (self.origin_bytes(), hint), runs)
    }

    fn hold_exchange(&self, t: &str) -> Vec<(String, &'static [Bound])> {
        let sql = outbox::hold_exchange_at_once(t, self.now_ms());
        vec![(sql, &[Bound::Pause, Bound::Exchange, Bound::Exchange])]
    }

    fn mark_sent(&self, t: &str, seqs: &[i64]) -> WithValues {
        lists::mark_sent(t, self.now_ms(), seqs)
    }

    fn delete_sent(&self, t: &str) -> String {
        outbox::delete_sent_by_seq(t, self.now_ms())
    }

    fn release_holds(&self, t: &str, limit: u64) -> String {
        outbox::release_by_seq(t, self.now_ms(), limit)
    }

    fn relay_transaction(&self) -> Option<TransactionOptions> {
        None
    }

    fn notify(&self) -> Option<&'static str> {
        None
    }

    fn column_exists(&self, column: &str) -> String {
        format!("SELECT 1 FROM pragma_table_info(?) WHERE name = '{column}'")
    }
}

impl SchemaSql for Sqlite {
    fn inbox_tables(&self, table: &str) -> Vec<String> {
        let types = InboxTypes {
            key: "VARCHAR(255)",
            consumer: "VARCHAR(128)",
            output: "TEXT",
            hash: "BLOB",
            blob: "BLOB",
            double: "REAL",
        };
        schema::inbox_tables(self, table, &types)
    }

    fn outbox_table(&self, table: &str) -> Vec<String> {
        let types = OutboxTypes {
            seq: "INTEGER PRIMARY KEY AUTOINCREMENT",
            id: "VARCHAR(255)",
            payload: "BLOB",
            text: "TEXT",
        };
        schema::outbox_table(self, table, &types)
    }

    /// SQLite adds a column only once: the caller checks that it is missing first.
    fn outbox_upgrade(&self, table: &str) -> Vec<String> {
        let mut statements = vec![format!(
            "ALTER TABLE {} ADD COLUMN held_until BIGINT NULL",
            self.quote(table)
        )];
        statements.extend(schema::create_outbox_indexes(self, table));
        statements
    }
}

/// The primary result code of an extended SQLite code, whatever the extension.
#[cfg(feature = "sqlite")]
fn primary(code: i32) -> i32 {
    code & 0xff
}

/// What a SQLite result code means: SQLITE_BUSY (5) and SQLITE_LOCKED (6) are contention; out
/// of memory (7), an I/O error (10), a full disk (13) and a file that cannot be opened (14) are
/// the database's own trouble, not the message's (as is a read-only database).
#[cfg(feature = "sqlite")]
pub(crate) fn failure(code: Option<i32>) -> crate::store::failure::Failure {
    use crate::store::failure::Failure;
    match code.map(primary) {
        Some(5 | 6) => Failure::LockTimeout,
        Some(7 | 10 | 13 | 14) => Failure::Unreachable,
        _ => Failure::Refused,
    }
}

/// Whether a result code says the database takes no writes: SQLITE_READONLY (8).
#[cfg(feature = "sqlite")]
pub(crate) fn takes_no_writes(code: Option<i32>) -> bool {
    code.map(primary) == Some(8)
}

/// Whether a result code refuses a value: SQLITE_TOOBIG (18), SQLITE_CONSTRAINT (19), but not a
/// trigger's `RAISE` (SQLITE_CONSTRAINT_TRIGGER, 1811): a rule of the database's own, which
/// another try may pass, as PostgreSQL's `RAISE EXCEPTION` and MySQL/MariaDB's `SIGNAL` are.
#[cfg(feature = "sqlite")]
pub(crate) fn refuses_value(code: Option<i32>) -> bool {
    code.is_some_and(|code| code != 1811 && matches!(primary(code), 18 | 19))
}

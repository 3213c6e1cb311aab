//! What every part of an outbox shares: its connection, table and statements, and the signals
//! between its stagings and its relays in this process.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use sea_orm::{DatabaseConnection, DbBackend, DbErr, QueryResult, Statement, Value};
use tokio::sync::Notify;

use super::run_order::SentThrough;
use super::statements::Statements;
use crate::store::dialect::Dialect;
use crate::store::table::TableName;

/// An outbox's state, shared by its clones, its batches and its stagings.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) db: DatabaseConnection,
    pub(super) dialect: Dialect,
    pub(super) table: TableName,
    pub(super) statements: Statements,
    /// How long sent rows are kept before the cleaner deletes them.
    pub(super) retention: Duration,
    /// Wakes relays in this process after a commit that staged messages.
    pub(super) staged: Notify,
    /// Relays of this outbox running in this process (`Relaying::local_relay`).
    pub(super) local_relays: AtomicUsize,
    /// On SQLite, held by the relay of this process that has a batch in hand.
    pub(super) relay_turn: Arc<tokio::sync::Mutex<()>>,
    /// How far each run is known to be sent, from this process's relays.
    pub(super) sent_through: SentThrough,
}

impl Shared {
    pub(super) fn backend(&self) -> DbBackend {
        self.dialect.backend()
    }

    /// A statement of the outbox's, whose text is in the backend's placeholders already.
    pub(super) fn statement(&self, sql: &str, values: Vec<Value>) -> Statement {
        Statement::from_sql_and_values(self.backend(), sql, values)
    }

    /// The PostgreSQL channel on which committed stagings are announced.
    pub(super) fn channel(&self) -> String {
        format!("idem_outbox_{}", self.table.as_str())
    }

    /// A text column, which MySQL/MariaDB hands over as bytes when it is binary.
    pub(super) fn read_text(
        &self,
        row: &QueryResult,
        index: usize,
        what: &str,
    ) -> Result<String, DbErr> {
        if !self.dialect.binary_keys() {
            return row.try_get_by_index(index);
        }
        let bytes: Vec<u8> = row.try_get_by_index(index)?;
        String::from_utf8(bytes).map_err(|_| DbErr::Custom(format!("a {what} that is not UTF-8")))
    }
}

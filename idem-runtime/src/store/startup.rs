//! Starting up on a database: which dialect it speaks, and start-up steps that replicas
//! starting together all get through.

use std::future::Future;
use std::time::Duration;

use sea_orm::{DatabaseConnection, DbBackend, DbErr};

use super::dialect::Dialect;
use crate::delivery::Backoff;
use crate::error::{ConfigError, Error, Result};

/// Runs a start-up step, trying again when it meets other replicas starting at the same time
/// (a deadlock, a lock wait): replicas starting together all start.
pub(crate) async fn starting<F, Fut>(step: F) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), DbErr>>,
{
    let mut tries = 1;
    loop {
        match step().await.map_err(Error::from) {
            Err(Error::Contention(error)) if tries < STARTUP_TRIES => {
                tracing::debug!(%error, tries, "inbox start-up met another replica; trying again");
                tokio::time::sleep(STARTUP_BACKOFF.after(tries)).await;
                tries += 1;
            }
            result => return result,
        }
    }
}

/// How many times a start-up step is tried.
const STARTUP_TRIES: u32 = 10;

/// The waits between those tries.
const STARTUP_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(20), Duration::from_millis(500));

/// The dialect of `db`'s backend, telling MariaDB from MySQL.
pub(crate) async fn dialect_of(db: &DatabaseConnection) -> Result<Dialect> {
    use sea_orm::ConnectionTrait;
    let backend = db.get_database_backend();
    let dialect = Dialect::new(backend);
    match backend {
        DbBackend::Sqlite | DbBackend::Postgres => Ok(dialect),
        DbBackend::MySql => {
            let sql = sea_orm::Statement::from_string(backend, "SELECT VERSION()");
            let version: String = match db.query_one_raw(sql).await? {
                Some(row) => row.try_get_by_index(0)?,
                None => String::new(),
            };
            Ok(if version.contains("MariaDB") {
                dialect
            } else {
                dialect.mysql_proper()
            })
        }
        other => Err(ConfigError::UnsupportedBackend(format!("{other:?}")).into()),
    }
}

/// Switches a SQLite database to write-ahead logging, so readers do not block the writer. The
/// setting is stored in the database file; an in-memory database keeps its own journal.
pub(crate) async fn enable_wal(db: &DatabaseConnection) {
    use sea_orm::ConnectionTrait;
    if let Err(error) = db.execute_unprepared("PRAGMA journal_mode = WAL").await {
        tracing::warn!(%error, "could not switch SQLite to WAL; concurrent claims will wait longer");
    }
}

//! Starting up on a database: which dialect it speaks, and start-up steps that replicas
//! starting together all get through.

use std::future::Future;
use std::time::Duration;

use sea_orm::{DatabaseConnection, DbErr};

use super::dialect::Dialect;
use super::sql;
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
    let unsupported = || ConfigError::UnsupportedBackend(format!("{backend:?}")).into();
    let Some(query) = sql::version_query(backend) else {
        return Dialect::of(backend).ok_or_else(unsupported);
    };
    let statement = sea_orm::Statement::from_string(backend, query);
    let version: String = match db.query_one_raw(statement).await? {
        Some(row) => row.try_get_by_index(0)?,
        None => String::new(),
    };
    Dialect::of_server(backend, &version).ok_or_else(unsupported)
}

/// Runs what the backend runs once on opening the database: on SQLite, write-ahead logging, so
/// readers do not block the writer (the setting is stored in the database file; an in-memory
/// database keeps its own journal).
pub(crate) async fn on_open(dialect: Dialect, db: &DatabaseConnection) {
    use sea_orm::ConnectionTrait;
    let Some(sql) = dialect.on_open() else {
        return;
    };
    if let Err(error) = db.execute_unprepared(sql).await {
        tracing::warn!(%error, "could not switch SQLite to WAL; concurrent claims will wait longer");
    }
}

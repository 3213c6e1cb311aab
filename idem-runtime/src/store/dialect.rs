//! What differs between the backends, in one place: the dialect, a handle on the backend's room
//! of SQL (`sql/`), how a transaction begins, and what a driver error means (each room says
//! what its driver's codes mean).

use std::ops::Deref;

use sea_orm::{
    DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, TransactionOptions, TransactionTrait,
};

pub(crate) use super::failure::Failure;
use super::sql::{self, Sql};

/// Classifies `error` by the driver's error kind, SQLSTATE or error number, never by its text.
pub(crate) fn classify(error: &DbErr) -> Failure {
    match error {
        DbErr::Conn(_) | DbErr::ConnectionAcquire(_) => Failure::Unreachable,
        #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
        DbErr::Exec(sea_orm::RuntimeErr::SqlxError(error))
        | DbErr::Query(sea_orm::RuntimeErr::SqlxError(error)) => classify_sqlx(error),
        _ => Failure::Refused,
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
fn classify_sqlx(error: &sea_orm::sqlx::Error) -> Failure {
    use sea_orm::sqlx::Error as Sqlx;
    match error {
        Sqlx::Io(_)
        | Sqlx::Tls(_)
        | Sqlx::Protocol(_)
        | Sqlx::PoolTimedOut
        | Sqlx::PoolClosed
        | Sqlx::WorkerCrashed => Failure::Unreachable,
        Sqlx::Database(_) if takes_no_writes_sqlx(error) => Failure::Unreachable,
        Sqlx::Database(error) => classify_database(error.as_ref()),
        _ => Failure::Refused,
    }
}

/// What the database's own error means, by the room of its driver.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
fn classify_database(error: &dyn sea_orm::sqlx::error::DatabaseError) -> Failure {
    #[cfg(feature = "mysql")]
    if let Some(error) = error.try_downcast_ref::<sea_orm::sqlx::mysql::MySqlDatabaseError>() {
        return sql::codes::mysql_failure(error.number());
    }
    #[cfg(feature = "sqlite")]
    if error
        .try_downcast_ref::<sea_orm::sqlx::sqlite::SqliteError>()
        .is_some()
    {
        return sql::codes::sqlite_failure(sqlite_code(error));
    }
    match error.code() {
        Some(code) => sql::codes::sqlstate_failure(&code),
        None => Failure::Refused,
    }
}

/// A SQLite error's extended result code.
#[cfg(feature = "sqlite")]
fn sqlite_code(error: &dyn sea_orm::sqlx::error::DatabaseError) -> Option<i32> {
    error.code().and_then(|code| code.parse::<i32>().ok())
}

/// The database error in `error`'s chain of sources, the nearest first: a [`DbErr`] itself, or
/// what a wrapper that forwards its sources left of one (`#[error(transparent)]` shows the
/// `DbErr`'s own source in its place: the driver's error, or a pool's).
pub(crate) fn database_error_in(error: &(dyn std::error::Error + 'static)) -> Option<DbErr> {
    let mut cause = Some(error);
    while let Some(current) = cause {
        if let Some(error) = current.downcast_ref::<DbErr>() {
            return Some(error.clone());
        }
        if let Some(error) = current.downcast_ref::<sea_orm::error::ConnAcquireErr>() {
            return Some(DbErr::ConnectionAcquire(*error));
        }
        #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
        if let Some(sea_orm::RuntimeErr::SqlxError(error)) =
            current.downcast_ref::<sea_orm::RuntimeErr>()
        {
            return Some(DbErr::Exec(sea_orm::RuntimeErr::SqlxError(error.clone())));
        }
        cause = current.source();
    }
    None
}

/// Whether the server takes no writes for now, whatever the message: a read-only server or
/// transaction (a standby, a failover's demoted primary, MySQL's `read_only`), no connection
/// slot left. An outage no message causes, even while other connections reach the database
/// (unlike a full disk, which one message's large write may meet while smaller ones pass).
pub(crate) fn takes_no_writes(error: &DbErr) -> bool {
    match error {
        #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
        DbErr::Exec(sea_orm::RuntimeErr::SqlxError(error))
        | DbErr::Query(sea_orm::RuntimeErr::SqlxError(error)) => takes_no_writes_sqlx(error),
        _ => false,
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
fn takes_no_writes_sqlx(error: &sea_orm::sqlx::Error) -> bool {
    let sea_orm::sqlx::Error::Database(error) = error else {
        return false;
    };
    #[cfg(feature = "mysql")]
    if let Some(error) = error.try_downcast_ref::<sea_orm::sqlx::mysql::MySqlDatabaseError>() {
        return sql::codes::mysql_takes_no_writes(error.number());
    }
    #[cfg(feature = "sqlite")]
    if error
        .try_downcast_ref::<sea_orm::sqlx::sqlite::SqliteError>()
        .is_some()
    {
        return sql::codes::sqlite_takes_no_writes(sqlite_code(error.as_ref()));
    }
    sql::codes::sqlstate_takes_no_writes(error.code().as_deref())
}

/// Whether the database refused a statement for a value it was given (too long, not valid in
/// the column's encoding, larger than a row or a packet may be, against a constraint such as a
/// `CHECK` on the column): what an output that cannot be stored gets, as opposed to a statement
/// refused for a reason of the database's own (a statement timeout, a trigger's exception),
/// which another try may pass.
pub(crate) fn refuses_value(error: &DbErr) -> bool {
    match error {
        #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
        DbErr::Exec(sea_orm::RuntimeErr::SqlxError(error))
        | DbErr::Query(sea_orm::RuntimeErr::SqlxError(error)) => sqlx_refuses_value(error),
        _ => false,
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
fn sqlx_refuses_value(error: &sea_orm::sqlx::Error) -> bool {
    let sea_orm::sqlx::Error::Database(error) = error else {
        return false;
    };
    #[cfg(feature = "mysql")]
    if let Some(error) = error.try_downcast_ref::<sea_orm::sqlx::mysql::MySqlDatabaseError>() {
        return sql::codes::mysql_refuses_value(error.number());
    }
    #[cfg(feature = "sqlite")]
    if error
        .try_downcast_ref::<sea_orm::sqlx::sqlite::SqliteError>()
        .is_some()
    {
        return sql::codes::sqlite_refuses_value(sqlite_code(error.as_ref()));
    }
    error
        .code()
        .is_some_and(|code| sql::codes::sqlstate_refuses_value(&code))
}

/// The SQL of one backend: a handle on its room (see `store/sql/`), whose every kind of
/// statement it offers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dialect(&'static dyn Sql);

impl Deref for Dialect {
    type Target = dyn Sql;

    fn deref(&self) -> &(dyn Sql + 'static) {
        self.0
    }
}

impl Dialect {
    /// The dialect of `backend` (MariaDB's for MySQL's family); one idem does not support is
    /// spoken to as SQLite is, which start-up refuses ([`Dialect::of`]).
    pub(crate) fn new(backend: DbBackend) -> Self {
        Self(sql::room_or_sqlite(backend))
    }

    /// The dialect of `backend`, if idem supports it.
    pub(crate) fn of(backend: DbBackend) -> Option<Self> {
        sql::room(backend).map(Self)
    }

    /// The dialect of a server of `backend` whose answer to the backend's version query was
    /// `version`: MariaDB or MySQL proper, whose claims wait for the server's
    /// `innodb_lock_wait_timeout`.
    pub(crate) fn of_server(backend: DbBackend, version: &str) -> Option<Self> {
        sql::server_room(backend, version).map(Self)
    }

    /// The dialect of the backend named `name` (`postgres`, `mariadb`, `mysql`, `sqlite`).
    #[cfg(test)]
    pub(crate) fn named(name: &str) -> Self {
        Self(sql::by_name(name))
    }

    /// Whether a statement can tell that it runs inside a transaction (MariaDB).
    pub(crate) fn tells_open_transaction(self) -> bool {
        self.open_transaction().is_some()
    }

    /// Begins a transaction as the backend begins one ([`Syntax::transaction_options`](sql::Syntax::transaction_options)).
    pub(crate) async fn begin(self, db: &DatabaseConnection) -> Result<DatabaseTransaction, DbErr> {
        begin_detached(db, self.transaction_options()).await
    }
}

/// The name of the cross-process lock serving `purpose` for `table`.
pub(crate) fn lock_name(purpose: &str, table: &str) -> String {
    format!("idem-{purpose}:{table}")
}

/// Begins a transaction in a task of its own, which runs to its end whatever becomes of the
/// caller. A caller dropped while `BEGIN` is under way (a consumer stopping, an HTTP client
/// hanging up) must not leave the transaction open on the pooled connection: sqlx 0.9 queues no
/// rollback for a transaction whose `BEGIN` it has not heard back from, and the connection's next
/// borrower would run inside it, uncommitted. Here the task keeps the transaction until it is
/// begun; dropped with the unclaimed result, it rolls back.
pub(crate) async fn begin_detached(
    db: &DatabaseConnection,
    options: TransactionOptions,
) -> Result<DatabaseTransaction, DbErr> {
    use tracing::Instrument;
    let db = db.clone();
    let begin = async move { db.begin_with_options(options).await };
    match tokio::spawn(begin.instrument(tracing::Span::current())).await {
        Ok(begun) => begun,
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        // The runtime is shutting down: no database to reach from here.
        Err(join) => Err(DbErr::Conn(sea_orm::RuntimeErr::Internal(format!(
            "beginning a transaction: {join}"
        )))),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn postgres_numbers_placeholders() {
        let pg = Dialect::named("postgres");
        assert_eq!(pg.placeholders("a = ? AND b = ?"), "a = $1 AND b = $2");
        let my = Dialect::named("mariadb");
        assert_eq!(my.placeholders("a = ?"), "a = ?");
    }

    #[test]
    fn mariadb_bounds_lock_waits_per_statement() {
        let my = Dialect::named("mariadb");
        assert_eq!(
            my.with_lock_wait("UPDATE t SET a = 1", Duration::from_millis(1500)),
            "SET STATEMENT innodb_lock_wait_timeout = 2 FOR UPDATE t SET a = 1"
        );
        let pg = Dialect::named("postgres");
        assert_eq!(
            pg.with_lock_wait("UPDATE t", Duration::from_secs(1)),
            "UPDATE t"
        );
        let mysql = Dialect::named("mysql");
        assert_eq!(
            mysql.with_lock_wait("UPDATE t", Duration::from_secs(1)),
            "UPDATE t"
        );
    }

    #[test]
    fn errors_without_a_driver_are_refusals_or_unreachable() {
        assert_eq!(classify(&DbErr::Custom("x".into())), Failure::Refused);
        assert_eq!(
            classify(&DbErr::Conn(sea_orm::RuntimeErr::Internal("x".into()))),
            Failure::Unreachable
        );
    }
}

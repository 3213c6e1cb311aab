//! What differs between the backends, in one place: quoting, placeholders, the database's clock,
//! bounded lock waits, the cleaner's lock, how a transaction begins, and what a driver error
//! means.

use std::time::Duration;

use sea_orm::{
    DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, SqliteTransactionMode,
    TransactionOptions, TransactionTrait, Value,
};

/// What a database error means for the message being processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
// Without a driver compiled in, only the driver-independent kinds can occur.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) enum Failure {
    /// The database could not be reached: no connection, a connection lost, no pooled
    /// connection free in time, the server shutting down.
    Unreachable,
    /// A deadlock or a serialization failure: the database rolled the transaction back, and
    /// trying it again can succeed.
    Deadlock,
    /// A lock was not granted in time (a lock wait timeout, a busy SQLite file).
    LockTimeout,
    /// The transaction had already failed: PostgreSQL ignores every statement after a failed one.
    Aborted,
    /// The database refused the statement itself.
    Refused,
}

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
        Sqlx::Database(error) => {
            // MySQL/MariaDB share SQLSTATEs between connection and statement errors (08S01 is
            // also a packet too large, 70100 also a killed query): their error numbers tell.
            #[cfg(feature = "mysql")]
            if let Some(error) =
                error.try_downcast_ref::<sea_orm::sqlx::mysql::MySqlDatabaseError>()
            {
                return match error.number() {
                    // Server shutdown, connection killed; a Galera node outside the cluster's
                    // quorum (1047) answers every statement so; out of disk.
                    1053 | 1927 | 1047 | 1021 => Failure::Unreachable,
                    1213 => Failure::Deadlock,
                    1205 => Failure::LockTimeout,
                    _ => Failure::Refused,
                };
            }
            #[cfg(feature = "sqlite")]
            if let Some(error) = error.try_downcast_ref::<sea_orm::sqlx::sqlite::SqliteError>() {
                // The primary result code, whatever the extended one: SQLITE_BUSY (5) and
                // SQLITE_LOCKED (6) are contention; out of memory (7), an I/O error (10), a
                // full disk (13) and a file that cannot be opened (14) are the database's own
                // trouble, not the message's (as is a read-only database, above).
                use sea_orm::sqlx::error::DatabaseError;
                let primary = error
                    .code()
                    .and_then(|code| code.parse::<i32>().ok())
                    .map(|code| code & 0xff);
                return match primary {
                    Some(5 | 6) => Failure::LockTimeout,
                    Some(7 | 10 | 13 | 14) => Failure::Unreachable,
                    _ => Failure::Refused,
                };
            }
            let Some(code) = error.code() else {
                return Failure::Refused;
            };
            match &*code {
                // Serialization failure, deadlock.
                "40001" | "40P01" => Failure::Deadlock,
                // lock_not_available: `lock_timeout` ran out.
                "55P03" => Failure::LockTimeout,
                // in_failed_sql_transaction.
                "25P02" => Failure::Aborted,
                // Connection exceptions (class 08), shutdown, crash shutdown, cannot connect now,
                // the session ended for idling in its transaction.
                code if code.starts_with("08") => Failure::Unreachable,
                "57P01" | "57P02" | "57P03" | "25P03" => Failure::Unreachable,
                // A full disk.
                "53100" => Failure::Unreachable,
                _ => Failure::Refused,
            }
        }
        _ => Failure::Refused,
    }
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
        // `read_only`, a read-only transaction, read-only server mode; every statement the
        // server may prepare prepared already (`max_prepared_stmt_count`, across its clients).
        return matches!(error.number(), 1290 | 1792 | 1836 | 1461);
    }
    #[cfg(feature = "sqlite")]
    if error
        .try_downcast_ref::<sea_orm::sqlx::sqlite::SqliteError>()
        .is_some()
    {
        // SQLITE_READONLY (8), whatever the extended code.
        let primary = error.code().and_then(|code| code.parse::<i32>().ok());
        return primary.map(|code| code & 0xff) == Some(8);
    }
    // A read-only transaction, no connection slot left. (Other insufficient resources, such as
    // too many locks, come from the statement itself.)
    matches!(error.code().as_deref(), Some("25006" | "53300"))
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
    if let sea_orm::sqlx::Error::Database(error) = error {
        #[cfg(feature = "mysql")]
        if let Some(error) = error.try_downcast_ref::<sea_orm::sqlx::mysql::MySqlDatabaseError>() {
            // Data too long, incorrect string value, packet too large, row size too large, a
            // `CHECK` constraint (MariaDB, MySQL), a column that cannot be null.
            return matches!(
                error.number(),
                1406 | 1366 | 1153 | 1301 | 1118 | 4025 | 3819 | 1048
            );
        }
        #[cfg(feature = "sqlite")]
        if error
            .try_downcast_ref::<sea_orm::sqlx::sqlite::SqliteError>()
            .is_some()
        {
            // The primary result code: SQLITE_TOOBIG (18), SQLITE_CONSTRAINT (19), but not a
            // trigger's `RAISE` (SQLITE_CONSTRAINT_TRIGGER, 1811): a rule of the database's
            // own, which another try may pass, as PostgreSQL's `RAISE EXCEPTION` and
            // MySQL/MariaDB's `SIGNAL` are.
            return error
                .code()
                .and_then(|code| code.parse::<i32>().ok())
                .is_some_and(|code| code != 1811 && matches!(code & 0xff, 18 | 19));
        }
        // Data exceptions (class 22: too long, invalid or untranslatable characters), integrity
        // constraints (23), program limits (54: a row or a value too large).
        return error.code().is_some_and(|code| {
            code.starts_with("22") || code.starts_with("23") || code.starts_with("54")
        });
    }
    false
}

/// The SQL of one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dialect {
    backend: DbBackend,
    /// MariaDB rather than MySQL: it has `SET STATEMENT ... FOR`.
    mariadb: bool,
}

impl Dialect {
    pub(crate) fn new(backend: DbBackend) -> Self {
        Self {
            backend,
            mariadb: backend == DbBackend::MySql,
        }
    }

    /// The dialect of a MySQL server that is not MariaDB: no per-statement lock wait, so claims
    /// wait for the server's `innodb_lock_wait_timeout`.
    pub(crate) fn mysql_proper(mut self) -> Self {
        self.mariadb = false;
        self
    }

    pub(crate) fn backend(self) -> DbBackend {
        self.backend
    }

    /// `name` quoted as an identifier. Callers pass validated names only.
    pub(crate) fn quote(self, name: &str) -> String {
        match self.backend {
            DbBackend::MySql => format!("`{name}`"),
            _ => format!("\"{name}\""),
        }
    }

    /// The database's clock in milliseconds since the Unix epoch, as an SQL expression: one clock
    /// for every process sharing the inbox, whatever their hosts' clocks say. It is the
    /// statement's time, the same wherever it appears in one statement.
    pub(crate) fn now_ms(self) -> &'static str {
        match self.backend {
            DbBackend::Postgres => {
                "FLOOR(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT"
            }
            // sqlx sets the session's time zone to UTC, so the conversion is exact.
            DbBackend::MySql => "CAST(FLOOR(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED)",
            _ => "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
        }
    }

    /// Whether a failed statement aborts the whole transaction until it is rolled back
    /// (PostgreSQL): nothing past a failure a handler swallowed can commit. MySQL/MariaDB and
    /// SQLite undo the failed statement only, and may end the transaction under a handler (a
    /// deadlock), its later statements then committing on their own.
    pub(crate) fn aborts_on_error(self) -> bool {
        self.backend == DbBackend::Postgres
    }

    /// Whether a statement can tell that it runs inside a transaction (`@@in_transaction`):
    /// MariaDB.
    pub(crate) fn tells_open_transaction(self) -> bool {
        self.backend == DbBackend::MySql && self.mariadb
    }

    /// Whether `INSERT ... RETURNING` reports the rows a conditional insert wrote: PostgreSQL,
    /// SQLite and MariaDB; not MySQL.
    pub(crate) fn has_insert_returning(self) -> bool {
        self.backend != DbBackend::MySql || self.mariadb
    }

    /// `sql`, written with `?` placeholders, in the backend's placeholder syntax (PostgreSQL
    /// numbers them: `$1`, `$2`, ...). Statements are built from the crate's own text, which has
    /// no `?` inside literals.
    pub(crate) fn placeholders(self, sql: &str) -> String {
        if self.backend != DbBackend::Postgres {
            return sql.to_owned();
        }
        let mut out = String::with_capacity(sql.len() + 16);
        let mut n = 0;
        for c in sql.chars() {
            if c == '?' {
                n += 1;
                out.push('$');
                out.push_str(&n.to_string());
            } else {
                out.push(c);
            }
        }
        out
    }

    /// `statement` (a single statement that may wait for row locks) made to wait at most `wait`
    /// for them, on MariaDB (zero: not at all). PostgreSQL's bound is set by the claim's insert
    /// for the rest of the claim (see `Statements`); SQLite's is the connection's busy timeout.
    pub(crate) fn with_lock_wait(self, statement: &str, wait: Duration) -> String {
        match self.backend {
            // MariaDB's per-statement variable, in whole seconds: a wait is rounded up to one,
            // and zero fails at once when the lock is held.
            DbBackend::MySql if self.mariadb => format!(
                "SET STATEMENT innodb_lock_wait_timeout = {} FOR {statement}",
                wait.as_secs_f64().ceil() as u64
            ),
            _ => statement.to_owned(),
        }
    }

    /// Begins a transaction. SQLite's takes the write lock at once: a deferred transaction that
    /// reads and then writes fails under concurrency whatever the busy timeout.
    pub(crate) async fn begin(self, db: &DatabaseConnection) -> Result<DatabaseTransaction, DbErr> {
        let options = match self.backend {
            DbBackend::Sqlite => TransactionOptions {
                sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
                ..TransactionOptions::default()
            },
            _ => TransactionOptions::default(),
        };
        begin_detached(db, options).await
    }

    /// The statement that tries, without waiting, to take the cross-process lock named `name`
    /// for `table`, and the values it binds; it returns one row whose first column says whether
    /// the lock was taken. PostgreSQL's is held until the transaction ends; MySQL/MariaDB's until
    /// [`Dialect::unlock`]. Names are qualified by the schema (the database on MySQL/MariaDB), so
    /// same-named tables in two schemas do not share a lock.
    pub(crate) fn try_lock(self, name: &str, table: &str) -> (String, Vec<Value>) {
        let name = format!("idem-{name}:{table}");
        match self.backend {
            DbBackend::Postgres => (
                "SELECT pg_try_advisory_xact_lock(hashtextextended(current_schema() || '.' || $1, 0))"
                    .to_owned(),
                vec![Value::from(name)],
            ),
            DbBackend::MySql => (
                format!("SELECT GET_LOCK({}, 0)", mysql_lock_name()),
                vec![Value::from(name)],
            ),
            // One process owns a SQLite file; it serializes in-process instead.
            _ => ("SELECT 1".to_owned(), Vec::new()),
        }
    }

    /// The statement that releases a MySQL/MariaDB lock taken by [`Dialect::try_lock`].
    pub(crate) fn unlock(self, name: &str, table: &str) -> Option<(String, Vec<Value>)> {
        (self.backend == DbBackend::MySql).then(|| {
            (
                format!("SELECT RELEASE_LOCK({})", mysql_lock_name()),
                vec![Value::from(format!("idem-{name}:{table}"))],
            )
        })
    }

    /// The statement that waits for the lock serializing schema changes of `table` across
    /// processes, held until the transaction ends (PostgreSQL, whose `CREATE ... IF NOT EXISTS`
    /// races); `None` where the database serializes them itself.
    pub(crate) fn schema_lock(self, table: &str) -> Option<(String, Vec<Value>)> {
        (self.backend == DbBackend::Postgres).then(|| {
            (
                "SELECT pg_advisory_xact_lock(hashtextextended(current_schema() || '.' || $1, 0))"
                    .to_owned(),
                vec![Value::from(format!("idem-schema:{table}"))],
            )
        })
    }
}

/// A MySQL/MariaDB lock name for the bound name: at most 64 characters, qualified by the
/// database.
fn mysql_lock_name() -> &'static str {
    "CONCAT('idem:', LEFT(SHA2(CONCAT(DATABASE(), '.', ?), 256), 40))"
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
    use super::*;

    #[test]
    fn postgres_numbers_placeholders() {
        let pg = Dialect::new(DbBackend::Postgres);
        assert_eq!(pg.placeholders("a = ? AND b = ?"), "a = $1 AND b = $2");
        let my = Dialect::new(DbBackend::MySql);
        assert_eq!(my.placeholders("a = ?"), "a = ?");
    }

    #[test]
    fn mariadb_bounds_lock_waits_per_statement() {
        let my = Dialect::new(DbBackend::MySql);
        assert_eq!(
            my.with_lock_wait("UPDATE t SET a = 1", Duration::from_millis(1500)),
            "SET STATEMENT innodb_lock_wait_timeout = 2 FOR UPDATE t SET a = 1"
        );
        let pg = Dialect::new(DbBackend::Postgres);
        assert_eq!(
            pg.with_lock_wait("UPDATE t", Duration::from_secs(1)),
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

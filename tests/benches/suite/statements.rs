//! Statements and round trips per message, counted where the database keeps the count:
//! `pg_stat_statements` on PostgreSQL (when the server loads it), the global status counters
//! on MariaDB, and on SQLite, which has no server, the statements sqlx runs on the suite's
//! connections, counted from its statement log: transaction boundaries (`BEGIN`, `COMMIT`),
//! which sqlx runs itself, are left out, as many on each side for the modes compared here (one
//! transaction per message or per batch). The counts are exact: they do not move with the
//! machine's noise. The servers count every client's
//! statements: the suite must be the database's only client while it runs.
//!
//! Round trips: MariaDB counts the commands that are not statements apart (prepares, closes);
//! on PostgreSQL sqlx sends each statement in one round trip of its own (no pipelining), so
//! they are the statements.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_tests::{Backend, TestDb};
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection, Statement};
use tracing::{Event, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// What a database's count of statements is read from; see the module's comment.
pub(crate) enum StatementCounter {
    PgStatStatements,
    MariaDbStatus,
    /// Statements in sqlx's log ([`SQLX_STATEMENTS`]), where the database does not count them.
    StatementLog(&'static str),
}

/// The statements sqlx logged (on the connections made by [`connect_logging`]).
static SQLX_STATEMENTS: AtomicU64 = AtomicU64::new(0);

/// The target of sqlx's statement log.
const STATEMENT_LOG: &str = "sqlx::query";

/// A tracing layer that counts sqlx's statement log in [`SQLX_STATEMENTS`], printing nothing.
pub(crate) fn statement_log<S>() -> impl Layer<S>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
{
    CountStatements.with_filter(filter_fn(|metadata| metadata.target() == STATEMENT_LOG))
}

struct CountStatements;

impl<S: Subscriber> Layer<S> for CountStatements {
    fn on_event(&self, _: &Event<'_>, _: Context<'_, S>) {
        SQLX_STATEMENTS.fetch_add(1, Ordering::Relaxed);
    }
}

/// The statements (and round trips, where counted) a database had run at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) statements: u64,
    pub(crate) round_trips: Option<u64>,
}

/// The status counters MariaDB reads statements and round trips from: `Questions` counts the
/// statements clients sent (prepared ones at each execution); prepares, closes and resets of
/// prepared statements are round trips of their own that it leaves out.
const MARIADB_STATUS: &str = "SHOW GLOBAL STATUS WHERE Variable_name IN \
     ('Questions', 'Com_stmt_prepare', 'Com_stmt_close', 'Com_stmt_reset')";

/// The statements run on the current database, as `pg_stat_statements` counts them.
const PG_STATEMENTS: &str = "SELECT COALESCE(sum(calls), 0)::BIGINT AS calls \
     FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database \
     WHERE datname = current_database())";

impl StatementCounter {
    /// Sets up counting on `db`, before any clone of its connection is made (where sqlx's log
    /// counts, `db` is given a pool that logs).
    pub(crate) async fn attach(db: &mut TestDb) -> Self {
        match db.backend {
            Backend::MySql => Self::MariaDbStatus,
            Backend::Postgres if pg_stat_statements(db).await => Self::PgStatStatements,
            Backend::Postgres => {
                db.db = connect_logging(db.url()).await;
                Self::StatementLog(
                    "sqlx's statement log, BEGIN and COMMIT left out (the server does not load \
                     pg_stat_statements)",
                )
            }
            Backend::Sqlite => {
                db.db = connect_logging(db.url()).await;
                Self::StatementLog("sqlx's statement log, BEGIN and COMMIT left out")
            }
        }
    }

    /// Where the counts come from, as the report shows it.
    pub(crate) fn source(&self) -> &'static str {
        match self {
            Self::PgStatStatements => "pg_stat_statements",
            Self::MariaDbStatus => "the server's status counters (Questions)",
            Self::StatementLog(source) => source,
        }
    }

    /// The counts now.
    pub(crate) async fn read(&self, db: &TestDb) -> Counts {
        match self {
            Self::StatementLog(_) => Counts {
                statements: SQLX_STATEMENTS.load(Ordering::Relaxed),
                round_trips: None,
            },
            Self::PgStatStatements => {
                let statements = query_i64(db, PG_STATEMENTS, "calls").await;
                Counts {
                    statements,
                    round_trips: Some(statements),
                }
            }
            Self::MariaDbStatus => {
                let rows = (db.db)
                    .query_all_raw(Statement::from_string(
                        db.db.get_database_backend(),
                        MARIADB_STATUS,
                    ))
                    .await
                    .expect("the server's status counters");
                let value = |name: &str| -> u64 {
                    rows.iter()
                        .find(|row| {
                            row.try_get::<String>("", "Variable_name").ok().as_deref() == Some(name)
                        })
                        .and_then(|row| row.try_get::<String>("", "Value").ok())
                        .and_then(|value| value.parse().ok())
                        .unwrap_or_else(|| panic!("no status counter {name}"))
                };
                let statements = value("Questions");
                let others =
                    value("Com_stmt_prepare") + value("Com_stmt_close") + value("Com_stmt_reset");
                Counts {
                    statements,
                    round_trips: Some(statements + others),
                }
            }
        }
    }

    /// The counts a round starts from. On PostgreSQL the statistics are reset first: once
    /// `pg_stat_statements` holds its maximum of distinct statements (a test run makes
    /// thousands, one set per table), it evicts entries, and a sum over them could fall.
    pub(crate) async fn start(&self, db: &TestDb) -> Counts {
        if let Self::PgStatStatements = self {
            db.exec("SELECT pg_stat_statements_reset()").await;
        }
        self.read(db).await
    }

    /// What was run since `before` was read, the readings' own statements left out.
    pub(crate) async fn since(&self, db: &TestDb, before: Counts) -> Counts {
        let after = self.read(db).await;
        // A server counts one statement of the readings between them: the reading before (on
        // PostgreSQL the reset, then the reading, of which the reset is cleared), once it has
        // run, or the one after, as it runs (MariaDB).
        let readings = match self {
            Self::StatementLog(_) => 0,
            Self::PgStatStatements | Self::MariaDbStatus => 1,
        };
        let between =
            |after: u64, before: u64| after.saturating_sub(before).saturating_sub(readings);
        Counts {
            statements: between(after.statements, before.statements),
            round_trips: (after.round_trips.zip(before.round_trips))
                .map(|(after, before)| between(after, before)),
        }
    }
}

/// Whether the server loads `pg_stat_statements`; its view created if it does.
async fn pg_stat_statements(db: &TestDb) -> bool {
    let loaded = "SELECT COUNT(*) AS loaded FROM pg_settings \
         WHERE name = 'shared_preload_libraries' AND setting LIKE '%pg_stat_statements%'";
    if query_i64(db, loaded, "loaded").await == 0 {
        eprintln!(
            "PostgreSQL does not load pg_stat_statements: statements are counted from sqlx's log. \
             For the server's count: ALTER SYSTEM SET shared_preload_libraries = \
             'pg_stat_statements', then restart the server."
        );
        return false;
    }
    db.exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await;
    true
}

async fn query_i64(db: &TestDb, sql: &str, column: &str) -> u64 {
    let row = (db.db)
        .query_one_raw(Statement::from_string(db.db.get_database_backend(), sql))
        .await
        .expect("a count")
        .expect("a row");
    let value: i64 = row.try_get("", column).expect("a number");
    u64::try_from(value).expect("a count")
}

/// A pool on the database at `url` whose statements sqlx logs (and [`statement_log`] counts).
async fn connect_logging(url: &str) -> DatabaseConnection {
    let mut options = ConnectOptions::new(url);
    options
        .max_connections(crate::POOL)
        .connect_timeout(Duration::from_secs(5))
        .acquire_timeout(Duration::from_secs(30))
        .sqlx_logging(true);
    Database::connect(options).await.expect("the database")
}

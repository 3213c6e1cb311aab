//! Databases for tests: a real SQLite file, PostgreSQL or MariaDB per test, with tables of its
//! own that are dropped when the test ends.

use std::sync::Mutex;
use std::time::Duration;

use sea_orm::sea_query::{Alias, Query};
use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DatabaseTransaction, Statement,
    TransactionTrait,
};

/// The backends every behaviour is tested on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file in the temporary directory, with a pool of several connections.
    Sqlite,
    /// The PostgreSQL server at `IDEM_TEST_POSTGRES_URL` (default `127.0.0.1:5432/test`).
    Postgres,
    /// The MariaDB/MySQL server at `IDEM_TEST_MYSQL_URL` (default `127.0.0.1:3306/test`).
    MySql,
}

impl Backend {
    /// The URL tests connect to.
    pub fn url(self, sqlite_path: &str) -> String {
        match self {
            Backend::Sqlite => format!("sqlite://{sqlite_path}?mode=rwc"),
            Backend::Postgres => std::env::var("IDEM_TEST_POSTGRES_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned()),
            Backend::MySql => std::env::var("IDEM_TEST_MYSQL_URL")
                .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned()),
        }
    }

    /// The statement that makes a session take no writes (as a standby or a failover's demoted
    /// primary takes none), and the one that ends it.
    pub fn read_only_session(self) -> (&'static str, &'static str) {
        match self {
            Backend::Postgres => (
                "SET SESSION default_transaction_read_only = on",
                "SET SESSION default_transaction_read_only = off",
            ),
            Backend::MySql => (
                "SET SESSION tx_read_only = 1",
                "SET SESSION tx_read_only = 0",
            ),
            Backend::Sqlite => ("PRAGMA query_only = 1", "PRAGMA query_only = 0"),
        }
    }

    /// The backend a child process was given by name (its `Debug` form), as tests pass it to
    /// the processes they start; panics on another name.
    pub fn of_child(name: &str) -> Self {
        match name {
            "Sqlite" => Backend::Sqlite,
            "Postgres" => Backend::Postgres,
            "MySql" => Backend::MySql,
            other => panic!("no backend named {other}"),
        }
    }
}

/// A short random suffix for names of tables, queues and consumers.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// A test's database: its connection and the tables it made, dropped with it.
#[derive(Debug)]
pub struct TestDb {
    /// The backend.
    pub backend: Backend,
    /// The connection pool.
    pub db: DatabaseConnection,
    url: String,
    sqlite_path: Option<String>,
    tables: Mutex<Vec<String>>,
}

impl TestDb {
    /// Connects to `backend`. A server that does not answer fails the test: these tests never
    /// pass without the real database.
    pub async fn connect(backend: Backend) -> Self {
        Self::connect_with_pool(backend, 16).await
    }

    /// Connects with a pool of `max_connections`.
    pub async fn connect_with_pool(backend: Backend, max_connections: u32) -> Self {
        crate::watchdog::start();
        let sqlite_path = (backend == Backend::Sqlite).then(|| {
            std::env::temp_dir()
                .join(format!("{}.db", unique("idem_test")))
                .display()
                .to_string()
        });
        let url = backend.url(sqlite_path.as_deref().unwrap_or_default());
        let db = connect(&url, max_connections).await.unwrap_or_else(|error| {
            panic!(
                "{backend:?} is not reachable at {url}: {error}. The tests need the real server: \
                 start it (see README) or point IDEM_TEST_POSTGRES_URL / IDEM_TEST_MYSQL_URL at one."
            )
        });
        Self {
            backend,
            db,
            url,
            sqlite_path,
            tables: Mutex::new(Vec::new()),
        }
    }

    /// Connects to `backend` at `url` (a proxy in front of the server, another schema); tables
    /// it makes are dropped through the same URL.
    pub async fn connect_url(backend: Backend, url: String, max_connections: u32) -> Self {
        crate::watchdog::start();
        let db = connect(&url, max_connections)
            .await
            .unwrap_or_else(|error| panic!("{backend:?} is not reachable at {url}: {error}"));
        Self {
            backend,
            db,
            url,
            sqlite_path: None,
            tables: Mutex::new(Vec::new()),
        }
    }

    /// The URL the pool was connected with: another process connects to the same database with
    /// it.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Another pool on the same database, as another process would have.
    pub async fn another_pool(&self, max_connections: u32) -> DatabaseConnection {
        connect(&self.url, max_connections)
            .await
            .unwrap_or_else(|error| panic!("{} is not reachable: {error}", self.url))
    }

    /// Another pool on the same database whose connections are given up on after
    /// `acquire_timeout` when every one is busy.
    pub async fn pool_waiting_at_most(
        &self,
        max_connections: u32,
        acquire_timeout: Duration,
    ) -> DatabaseConnection {
        connect_with(&self.url, max_connections, acquire_timeout)
            .await
            .unwrap_or_else(|error| panic!("{} is not reachable: {error}", self.url))
    }

    /// A fresh table name, dropped when this `TestDb` is.
    pub fn table(&self, prefix: &str) -> String {
        let name = unique(prefix);
        self.tables.lock().unwrap().push(name.clone());
        name
    }

    /// Creates a table `(consumer, message_key, body)` for handlers' effects and returns its
    /// name.
    pub async fn effects_table(&self) -> String {
        let name = self.table("effects");
        self.exec(&format!(
            "CREATE TABLE {name} (consumer VARCHAR(128) NOT NULL, message_key VARCHAR(255) NOT NULL, body VARCHAR(255) NOT NULL)"
        ))
        .await;
        name
    }

    /// Runs a statement without parameters.
    pub async fn exec(&self, sql: &str) {
        self.db
            .execute_unprepared(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Holds the record of `consumer` and `key` in the inbox `table` locked, as a long
    /// transaction elsewhere would (a takeover whose handler runs on), until the returned
    /// transaction ends.
    pub async fn hold_record(&self, table: &str, consumer: &str, key: &str) -> DatabaseTransaction {
        let holder = self.db.begin().await.unwrap();
        holder
            .execute_unprepared(&format!(
                "UPDATE {table} SET attempts = attempts + 1 \
                 WHERE consumer = '{consumer}' AND message_key = '{key}'"
            ))
            .await
            .unwrap();
        holder
    }

    /// Makes the inbox `table` refuse outputs of `length` characters or more, as a column too
    /// small for them would: a check constraint (on SQLite, which adds none to a table, the
    /// table is made again with it).
    pub async fn refuse_outputs_from(&self, table: &str, length: usize) {
        let check = format!("CHECK (output IS NULL OR LENGTH(output) < {length})");
        if self.backend != Backend::Sqlite {
            self.exec(&format!(
                "ALTER TABLE {table} ADD CONSTRAINT {table}_small {check}"
            ))
            .await;
            return;
        }
        let row = self
            .db
            .query_one_raw(Statement::from_string(
                self.db.get_database_backend(),
                format!("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = '{table}'"),
            ))
            .await
            .unwrap()
            .expect("the table exists");
        let create: String = row.try_get_by_index(0).unwrap();
        let end = create.rfind(')').expect("a table's columns");
        let checked = format!("{}, {check})", &create[..end]);
        let table_name = idem_runtime::schema::TableName::new(table).expect("a valid table name");
        self.exec(&format!("ALTER TABLE {table} RENAME TO {table}_old"))
            .await;
        self.exec(&checked).await;
        self.exec(&format!("INSERT INTO {table} SELECT * FROM {table}_old"))
            .await;
        self.exec(&format!("DROP TABLE {table}_old")).await;
        for sql in idem_runtime::schema::create_table_statements(
            self.db.get_database_backend(),
            &table_name,
        ) {
            self.exec(&sql).await;
        }
    }

    /// Counts the rows of `table` matching `filter` (a SQL condition, `1=1` for all).
    pub async fn count(&self, table: &str, filter: &str) -> i64 {
        count_on(&self.db, table, filter).await
    }
}

/// Credentials that can only read some tables and their companions (an operator's read-only
/// user): a user of its own granted `SELECT` (PostgreSQL, MariaDB), or the file opened
/// read-only (SQLite). [`Reader::revoke`] drops the user.
#[derive(Debug)]
pub struct Reader {
    name: String,
    /// The URL that connects as the reader.
    pub url: String,
}

impl Reader {
    /// A reader of `tables` (inbox tables: their companion tables too, where they exist) on
    /// `db`'s database.
    pub async fn grant(db: &TestDb, tables: &[&str]) -> Self {
        let name = unique("reader");
        let url = db.url();
        if db.backend == Backend::Sqlite {
            let url = url.replace("mode=rwc", "mode=ro");
            return Self { name, url };
        }
        let (scheme, rest) = url.split_once("://").expect("a URL");
        let host = rest.split_once('@').map_or(rest, |(_, host)| host);
        let user = match db.backend {
            Backend::MySql => format!("'{name}'@'%'"),
            _ => name.clone(),
        };
        match db.backend {
            Backend::MySql => db.exec(&format!("CREATE USER {user}")).await,
            _ => db.exec(&format!("CREATE ROLE {user} LOGIN")).await,
        }
        for table in tables {
            db.exec(&format!("GRANT SELECT ON {table} TO {user}")).await;
            for companion in ["_dup_daily", "_key_digest"] {
                let grant = format!("GRANT SELECT ON {table}{companion} TO {user}");
                // A table that is not an inbox has no companions.
                let _ = db.db.execute_unprepared(&grant).await;
            }
        }
        let url = format!("{scheme}://{name}@{host}");
        Self { name, url }
    }

    /// Drops the reader's user.
    pub async fn revoke(self, db: &TestDb) {
        match db.backend {
            Backend::Sqlite => {}
            Backend::MySql => db.exec(&format!("DROP USER '{}'@'%'", self.name)).await,
            Backend::Postgres => {
                db.exec(&format!("DROP OWNED BY {}", self.name)).await;
                db.exec(&format!("DROP ROLE {}", self.name)).await;
            }
        }
    }
}

/// Counts the rows of `table` matching `filter` through `db`.
pub async fn count_on(db: &DatabaseConnection, table: &str, filter: &str) -> i64 {
    let sql = format!("SELECT COUNT(*) FROM {table} WHERE {filter}");
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await
        .unwrap()
        .unwrap();
    row.try_get_by_index::<i64>(0).unwrap()
}

/// Writes one effect row `(consumer, message_key, body)` into `table` through `conn`, the SQL
/// written for its backend by sea-query.
pub async fn insert_effect(
    conn: &impl ConnectionTrait,
    table: &str,
    consumer: &str,
    key: &str,
    body: &str,
) -> Result<(), sea_orm::DbErr> {
    let insert = Query::insert()
        .into_table(Alias::new(table))
        .columns(["consumer", "message_key", "body"])
        .values_panic([consumer.into(), key.into(), body.into()])
        .to_owned();
    conn.execute(&insert).await?;
    Ok(())
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(path) = &self.sqlite_path {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{path}{suffix}"));
            }
            return;
        }
        let tables = std::mem::take(&mut *self.tables.lock().unwrap());
        if tables.is_empty() {
            return;
        }
        let url = self.url.clone();
        crate::clean_up(async move {
            if let Ok(db) = connect(&url, 1).await {
                // An inbox table's companions (its duplicates' summaries and digests) too.
                for table in tables {
                    for suffix in ["", "_dup_daily", "_key_digest", "_duplicates", "_digest"] {
                        let drop = format!("DROP TABLE IF EXISTS {table}{suffix}");
                        let _ = db.execute_unprepared(&drop).await;
                    }
                }
                let _ = db.close().await;
            }
        });
    }
}

// Not an `async fn` of its own: each layer of futures deepens the tests' own, which the
// compiler lays out only so deep.
fn connect(
    url: &str,
    max_connections: u32,
) -> impl Future<Output = Result<DatabaseConnection, sea_orm::DbErr>> + '_ {
    connect_with(url, max_connections, Duration::from_secs(30))
}

/// Connects a pool of at most `max_connections` to `url`.
pub async fn connect_with(
    url: &str,
    max_connections: u32,
    acquire_timeout: Duration,
) -> Result<DatabaseConnection, sea_orm::DbErr> {
    let mut options = ConnectOptions::new(url);
    options
        .max_connections(max_connections)
        .connect_timeout(Duration::from_secs(5))
        .acquire_timeout(acquire_timeout)
        .sqlx_logging(false);
    Database::connect(options).await
}

/// Defines one test per backend for each listed async function taking a [`Backend`]:
/// `on_each_backend!(fresh_then_duplicate)` gives `sqlite::fresh_then_duplicate`,
/// `postgres::fresh_then_duplicate` and `mysql::fresh_then_duplicate`;
/// `on_each_backend!([postgres, mysql]: failover)` gives the listed backends' tests only.
#[macro_export]
macro_rules! on_each_backend {
    ([$($backend:ident),+ $(,)?]: $($name:ident),* $(,)?) => {
        $crate::__tests_on_backend!(@each [$($backend),+] [$($name),*]);
    };
    ($($name:ident),* $(,)?) => {
        $crate::on_each_backend!([sqlite, postgres, mysql]: $($name),*);
    };
}

/// One module of [`on_each_backend!`]: the tests of one backend.
#[doc(hidden)]
#[macro_export]
macro_rules! __tests_on_backend {
    (@each [] $names:tt) => {};
    (@each [$first:ident $(, $rest:ident)*] $names:tt) => {
        $crate::__tests_on_backend!($first: $names);
        $crate::__tests_on_backend!(@each [$($rest),*] $names);
    };
    (sqlite: [$($name:ident),*]) => {
        $crate::__tests_on_backend!(@module sqlite, Sqlite: $($name),*);
    };
    (postgres: [$($name:ident),*]) => {
        $crate::__tests_on_backend!(@module postgres, Postgres: $($name),*);
    };
    (mysql: [$($name:ident),*]) => {
        $crate::__tests_on_backend!(@module mysql, MySql: $($name),*);
    };
    (@module $module:ident, $variant:ident: $($name:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::db::Backend::$variant).await
                }
            )*
        }
    };
}

//! How a backend speaks and behaves whatever the table: quoting, placeholders, its clock, lock
//! waits and cross-process locks, transactions, and what it can tell about them.

use std::time::Duration;

use sea_orm::{DbBackend, DbErr, QueryResult, TransactionOptions, Value};

/// A statement and the values it binds.
pub(crate) type WithValues = (String, Vec<Value>);

/// What every backend says of itself and of its transactions.
pub(crate) trait Syntax: std::fmt::Debug + Send + Sync {
    /// The sea-orm backend that runs the statements.
    fn backend(&self) -> DbBackend;

    /// `name` quoted as an identifier. Callers pass validated names only.
    fn quote(&self, name: &str) -> String;

    /// The database's clock in milliseconds since the Unix epoch, as an SQL expression: one clock
    /// for every process sharing the inbox, whatever their hosts' clocks say. It is the
    /// statement's time, the same wherever it appears in one statement.
    fn now_ms(&self) -> &'static str;

    /// `sql`, written with `?` placeholders, in the backend's placeholder syntax. Statements are
    /// built from the crate's own text, which has no `?` inside literals.
    fn placeholders(&self, sql: &str) -> String;

    /// `statement` (a single statement that may wait for row locks) made to wait at most `wait`
    /// for them where the backend bounds a wait per statement (MariaDB; zero: not at all).
    fn with_lock_wait(&self, statement: &str, wait: Duration) -> String;

    /// The statement that bounds lock waits for the rest of the transaction, binding the bound,
    /// where the backend bounds them so (PostgreSQL's `lock_timeout`) rather than per statement.
    fn set_lock_timeout(&self) -> Option<&'static str>;

    /// The statement that reads a session's bound on lock waits, which a claim restores after
    /// bounding its own ([`Syntax::set_lock_timeout`]).
    fn read_lock_timeout(&self) -> Option<&'static str>;

    /// The clause that locks the rows a statement reads, skipping those other transactions
    /// hold; empty where rows do not lock (SQLite, whose writers take turns).
    fn skip_locked(&self) -> &'static str;

    /// The clause that makes a read see the latest committed row even inside a `REPEATABLE
    /// READ` transaction (MySQL/MariaDB's shared locking read); empty where reads see it anyway.
    fn locking_read(&self) -> &'static str;

    /// A hint naming the indexes (quoted) a statement must read through, where the planner needs
    /// one (MySQL/MariaDB); empty elsewhere.
    fn force_index(&self, indexes: &[String]) -> String;

    /// How a transaction begins. SQLite's takes the write lock at once: a deferred transaction
    /// that reads and then writes fails under concurrency whatever the busy timeout.
    fn transaction_options(&self) -> TransactionOptions;

    /// Whether one process owns the database (SQLite's file): its writers, cleaners and relays
    /// take turns in that process rather than lock rows or take cross-process locks.
    fn one_process(&self) -> bool;

    /// The query that reads the file of the connection's main database (empty or NULL for one
    /// in memory), where one process owns it ([`Syntax::one_process`]): what names the turns
    /// its processes take.
    fn database_file(&self) -> Option<&'static str>;

    /// The statement a process runs once on opening the database (SQLite's write-ahead log, so
    /// readers do not block the writer), if any.
    fn on_open(&self) -> Option<&'static str>;

    /// Whether a failed statement aborts the whole transaction until it is rolled back
    /// (PostgreSQL): nothing past a failure a handler swallowed can commit. MySQL/MariaDB and
    /// SQLite undo the failed statement only, and may end the transaction under a handler (a
    /// deadlock), its later statements then committing on their own.
    fn aborts_on_error(&self) -> bool;

    /// The condition that holds while a transaction is open, where a statement can tell
    /// (MariaDB's `@@in_transaction`).
    fn open_transaction(&self) -> Option<&'static str>;

    /// The statement that returns a row in a transaction still open: where the backend tells
    /// ([`Syntax::open_transaction`]), none once a deadlock rolled it back; elsewhere any row
    /// (PostgreSQL refuses it in a transaction it aborted).
    fn still_open(&self) -> &'static str;

    /// The statement that reads the id of the transaction it runs in, if that has written
    /// (PostgreSQL): one that ended under a handler is told from the batch's own.
    fn transaction_id(&self) -> Option<&'static str>;

    /// Whether an insert meets a taken key with the duplicate-key error, which leaves the
    /// transaction usable (MySQL/MariaDB, whose `ON DUPLICATE KEY UPDATE` no-op counts as a
    /// found row under `CLIENT_FOUND_ROWS`), rather than with `ON CONFLICT DO NOTHING`.
    fn conflicts_as_errors(&self) -> bool;

    /// Whether a column's collation may take two keys for one (MySQL/MariaDB's default
    /// collations ignore case and trailing spaces).
    fn collations_merge_keys(&self) -> bool;

    /// Whether text the inbox compares byte for byte comes back as bytes (MySQL/MariaDB store
    /// keys as `VARBINARY`).
    fn binary_keys(&self) -> bool;

    /// The statement that tries, without waiting, to take the cross-process lock `name`, and
    /// the values it binds; it returns one row whose first column [`Syntax::lock_taken`] reads.
    /// PostgreSQL's is held until the transaction ends; MySQL/MariaDB's until
    /// [`Syntax::unlock`]; SQLite's processes take turns in process instead. Names are
    /// qualified by the schema (the database on MySQL/MariaDB), so same-named tables in two
    /// schemas do not share a lock.
    fn try_lock(&self, name: &str) -> WithValues;

    /// Whether the row [`Syntax::try_lock`] returned says the lock was taken.
    fn lock_taken(&self, row: &QueryResult) -> Result<bool, DbErr>;

    /// The statement that releases a lock [`Syntax::try_lock`] took, where it outlives its
    /// transaction (MySQL/MariaDB).
    fn unlock(&self, name: &str) -> Option<WithValues>;

    /// The statement that waits for the lock `name`, held until the transaction ends, that
    /// serializes schema changes where the database does not (PostgreSQL, whose
    /// `CREATE ... IF NOT EXISTS` races between sessions).
    fn schema_lock(&self, name: &str) -> Option<WithValues>;
}

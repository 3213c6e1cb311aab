//! The transactional outbox: messages a handler stages in its own transaction, committed with
//! its effects and its inbox record or not at all, and published afterwards by a relay (the
//! RabbitMQ adapter's `Relay`) with ids that every re-execution derives identically.
//!
//! Handler authors need [`Outbox`], [`OutboxMessage`] and [`Outbound`] (also at the crate's
//! root). A relay of another broker takes committed messages in batches
//! ([`Outbox::take_pending`], a [`PendingBatch`] of [`PendingMessage`]s, locked while it holds
//! them), publishes them, holds back what the broker did not take ([`PendingBatch::hold`],
//! [`PendingBatch::hold_exchange`], released by [`Outbox::release_holds`]) and marks the rest
//! sent ([`PendingBatch::mark_sent`]); it keeps each run's order ([`PendingMessage::run`]) and
//! is woken by commits ([`Outbox::staged`], [`Outbox::local_relay`]).

mod error;
mod holds;
mod message;
mod outbound;
mod pending;
mod run_order;
mod statements;
mod stats;
mod table;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, Value};
use tokio::sync::Notify;

use crate::clock::duration_ms;
use crate::error::{ConfigError, Error, Result};
use crate::key::InboxKey;
use crate::store::dialect::Dialect;
use crate::store::startup::{dialect_of, starting};
use crate::store::table::TableName;
use statements::{Guard, Statements};

pub use error::StagingError;
pub use holds::{HeldRun, HeldSubject, PendingRow};
pub use message::{OutboxMessage, derived_id};
pub(crate) use message::{handler_run, named_run};
pub use outbound::Outbound;
pub(crate) use outbound::RunClaim;
pub use pending::{PendingBatch, PendingMessage};
pub(crate) use statements::RunStatements;
pub use stats::{HeldExchange, OutboxStats, Pending};
#[cfg(feature = "migration")]
pub(crate) use table::drop_outbox_statement;
pub use table::{create_outbox_statements, upgrade_outbox_statements};

/// The outbox table, kept in the application's database beside the inbox.
///
/// Give it to the inbox ([`InboxBuilder::outbox`](crate::InboxBuilder::outbox)) so that handlers
/// stage through [`Context::stage`](crate::Context::stage) or an `&Outbound` parameter, and to a
/// relay that publishes what was committed. Code outside handlers (an HTTP endpoint) stages in
/// its own transaction with [`Outbox::stage`]. Cloning is cheap; clones share the table and the
/// wake-up signal.
#[derive(Debug, Clone)]
pub struct Outbox {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    db: DatabaseConnection,
    dialect: Dialect,
    table: TableName,
    statements: Statements,
    /// How long sent rows are kept before the cleaner deletes them.
    retention: Duration,
    /// Wakes relays in this process after a commit that staged messages.
    staged: Notify,
    /// Relays of this outbox running in this process ([`Outbox::local_relay`]).
    local_relays: AtomicUsize,
    /// On SQLite, held by the relay of this process that has a batch in hand.
    relay_turn: Arc<tokio::sync::Mutex<()>>,
    /// How far each run is known to be sent, from this process's relays.
    sent_through: run_order::SentThrough,
}

/// A relay of an [`Outbox`] running in this process, until dropped: see
/// [`Outbox::local_relay`].
#[derive(Debug)]
#[must_use = "the relay counts as running only while the guard lives"]
pub struct LocalRelay {
    outbox: Outbox,
}

impl Drop for LocalRelay {
    fn drop(&mut self) {
        self.outbox
            .inner
            .local_relays
            .fetch_sub(1, Ordering::SeqCst);
    }
}

/// Configures an [`Outbox`].
#[derive(Debug)]
pub struct OutboxBuilder {
    db: DatabaseConnection,
    table: String,
    create_table: bool,
    retention: Duration,
}

impl Outbox {
    /// The table name used when none is configured.
    pub const DEFAULT_TABLE: &'static str = "idem_outbox";

    /// Starts configuring the outbox on `db` (SQLite, PostgreSQL or MySQL/MariaDB).
    pub fn builder(db: DatabaseConnection) -> OutboxBuilder {
        OutboxBuilder {
            db,
            table: Self::DEFAULT_TABLE.to_owned(),
            create_table: true,
            retention: Duration::from_secs(24 * 3600),
        }
    }

    /// Stages `message` in the transaction `conn` (or on a connection, committing at once), for
    /// code outside handlers: an HTTP endpoint that writes and publishes in one transaction.
    /// Returns its message id: the one [`OutboxMessage::message_id`] or
    /// [`OutboxMessage::keyed`] gave, else a random one. A message whose id is already staged is
    /// not staged again. Call [`Outbox::notify_staged`] after the commit to wake the relays of
    /// this process at once; on PostgreSQL, relays in other processes are told by the same
    /// statement.
    ///
    /// Outside a transaction the staging is one statement, which commits or not: an error means
    /// nothing was staged, except when the database's answer never came, when it may have
    /// been. A message with a key of the caller's ([`OutboxMessage::keyed`]) can be staged again
    /// then, without a second copy. Messages staged outside handlers are ordered only within a
    /// run ([`OutboxMessage::in_run`]).
    ///
    /// # Errors
    ///
    /// The message cannot be published as it is ([`StagingError::Invalid`]), or the database
    /// failed ([`StagingError::Database`]).
    pub async fn stage(
        &self,
        conn: &impl ConnectionTrait,
        message: OutboxMessage,
    ) -> Result<String, StagingError> {
        let message = message.with_current_trace();
        let id = message
            .message_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().hyphenated().to_string());
        let run = message.run.as_deref().map(named_run);
        let staging = Staging {
            id: &id,
            run: run.as_deref(),
            announce: true,
        };
        self.insert(
            conn,
            self.inner.statements.stage(),
            staging,
            &message,
            Vec::new(),
        )
        .await?;
        Ok(id)
    }

    /// Stages `message` as `id` for the handler run of `key`, unless a message with that id is
    /// staged already, and, under the run's `claim` (the inbox's runs have one), only while the
    /// run's transaction still holds it; on PostgreSQL, with `announce`, also announces the
    /// commit to listening relays (once per transaction is enough).
    pub(crate) async fn stage_for_run(
        &self,
        conn: &impl ConnectionTrait,
        id: &str,
        message: &OutboxMessage,
        announce: bool,
        key: &InboxKey,
        claim: Option<RunClaim<'_>>,
    ) -> Result<(), StagingError> {
        let run = handler_run(key);
        let staging = Staging {
            id,
            run: Some(&run),
            announce,
        };
        let Some((claim, statements)) = claim.and_then(|c| Some((c, c.statements?))) else {
            // A context made by hand (a unit test's), or a run without an inbox record (entity
            // and natural modes) off MariaDB: no claim to check.
            let statement = self.inner.statements.stage();
            self.insert(conn, statement, staging, message, Vec::new())
                .await?;
            return Ok(());
        };
        let guard_values = match statements.guard {
            Guard::Claim => claim.values(key),
            _ => Vec::new(),
        };
        let staged = self
            .insert(conn, &statements.stage, staging, message, guard_values)
            .await?;
        // Nothing written: a message of this id staged already (a repeat of the run; MariaDB
        // counts it as written), or the claim gone with the transaction.
        if staged == 0 {
            let held = match statements.guard {
                Guard::InTransaction => false,
                _ => {
                    let check = self.statement(&statements.claim_held, claim.values(key));
                    conn.query_one_raw(check).await?.is_some()
                }
            };
            if !held {
                return Err(StagingError::ClaimLost);
            }
        }
        Ok(())
    }

    /// Runs one staging statement for `message`, binding `guard` after its values; returns
    /// how many rows it wrote.
    async fn insert(
        &self,
        conn: &impl ConnectionTrait,
        statement: &statements::Staging,
        staging: Staging<'_>,
        message: &OutboxMessage,
        guard: Vec<Value>,
    ) -> Result<u64, StagingError> {
        if let Some(problem) = message.problem() {
            return Err(StagingError::Invalid(problem));
        }
        let headers = (!message.headers.is_empty())
            .then(|| serde_json::to_string(&message.headers).expect("string maps serialize"));
        let mut values = vec![
            Value::from(staging.id.to_owned()),
            Value::from(message.exchange.clone()),
            Value::from(message.routing_key.clone()),
            Value::from(message.content_type.clone()),
            Value::from(headers),
            Value::from(message.payload.clone()),
            Value::from(staging.run.map(str::to_owned)),
        ];
        values.extend(guard);
        let announce = staging.announce && self.backend() == DbBackend::Postgres;
        if announce {
            values.push(Value::from(self.channel()));
        }
        let sql = statement.sql(announce);
        if self.backend() == DbBackend::Postgres {
            let rows = conn.query_all_raw(self.statement(sql, values)).await?;
            return Ok(rows.len() as u64);
        }
        let result = conn.execute_raw(self.statement(sql, values)).await?;
        Ok(result.rows_affected())
    }

    /// The statements of the handler runs of the inbox whose table is `inbox` (quoted).
    pub(crate) fn statements_for_inbox(&self, inbox: &str) -> RunStatements {
        self.inner.statements.for_inbox(inbox)
    }

    /// Wakes the relays of this process: call it after committing a transaction that staged
    /// messages through [`Outbox::stage`] (the inbox does it for handlers).
    pub fn notify_staged(&self) {
        self.inner.staged.notify_waiters();
        self.inner.staged.notify_one();
    }

    /// Resolves at the next [`Outbox::notify_staged`] in this process.
    pub async fn staged(&self) {
        self.inner.staged.notified().await;
    }

    /// Says that a relay of this outbox (this value or a clone) runs in this process, until the
    /// returned guard is dropped; a relay calls it when it starts.
    ///
    /// Meanwhile handler runs in this process do not announce their stagings on PostgreSQL
    /// (`pg_notify` on [`Outbox::channel`]): the inbox wakes the local relay after each commit,
    /// and an announcement would only send relays in other processes after the same rows, at a
    /// price every handler pays: PostgreSQL serializes the commits of transactions that notify,
    /// one flush after another. Relays elsewhere still find these rows when they poll, should
    /// this process's relay fail. [`Outbox::stage`] announces whatever runs here (the wake-up
    /// in this process is up to its caller).
    pub fn local_relay(&self) -> LocalRelay {
        self.inner.local_relays.fetch_add(1, Ordering::SeqCst);
        LocalRelay {
            outbox: self.clone(),
        }
    }

    /// Whether a relay of this outbox runs in this process.
    pub(crate) fn has_local_relay(&self) -> bool {
        self.inner.local_relays.load(Ordering::SeqCst) > 0
    }

    /// The PostgreSQL channel on which committed stagings are announced (`LISTEN` on it to wake
    /// a relay in another process).
    pub fn channel(&self) -> String {
        format!("idem_outbox_{}", self.inner.table.as_str())
    }

    /// The table's name.
    pub fn table(&self) -> &TableName {
        &self.inner.table
    }

    /// The database connection the outbox uses.
    pub fn connection(&self) -> &DatabaseConnection {
        &self.inner.db
    }

    /// How long sent rows are kept before the cleaner deletes them.
    pub fn retention(&self) -> Duration {
        self.inner.retention
    }

    /// Deletes at most `limit` messages sent longer than the [retention](Outbox::retention)
    /// ago; returns how many. An inbox's cleaner does it for its outbox; a service that stages
    /// without an inbox calls it now and then (until it deletes fewer than `limit`).
    ///
    /// # Errors
    ///
    /// The database failed.
    pub async fn delete_sent(&self, limit: u32) -> Result<u64, DbErr> {
        let values = vec![
            Value::from(duration_ms(self.inner.retention)),
            Value::from(i64::from(limit)),
        ];
        let sql = &self.inner.statements.delete_sent;
        let result = self
            .inner
            .db
            .execute_raw(self.statement(sql, values))
            .await?;
        Ok(result.rows_affected())
    }

    fn backend(&self) -> DbBackend {
        self.inner.dialect.backend()
    }

    /// A statement of the outbox's, whose text is in the backend's placeholders already.
    fn statement(&self, sql: &str, values: Vec<Value>) -> Statement {
        Statement::from_sql_and_values(self.backend(), sql, values)
    }
}

/// What one staging writes besides the message: its id, its run, and whether it announces
/// itself (PostgreSQL).
#[derive(Debug, Clone, Copy)]
struct Staging<'a> {
    id: &'a str,
    run: Option<&'a str>,
    announce: bool,
}

impl OutboxBuilder {
    /// The outbox table's name (default `idem_outbox`); see [`TableName`] for what is accepted.
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// Whether [`OutboxBuilder::build`] creates the table if it is missing (default `true`).
    pub fn create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }

    /// How long sent rows are kept before the inbox's cleaner deletes them (default a day).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Validates the configuration, creates the table if asked, and checks that it has the
    /// columns this version writes.
    pub async fn build(self) -> Result<Outbox> {
        let table = TableName::new(self.table)?;
        if self.retention.is_zero() {
            return Err(ConfigError::Zero("the outbox retention").into());
        }
        let dialect = dialect_of(&self.db).await?;
        let outbox = Outbox {
            inner: Arc::new(Inner {
                db: self.db,
                dialect,
                statements: Statements::new(dialect, &table),
                table,
                retention: self.retention,
                staged: Notify::new(),
                local_relays: AtomicUsize::new(0),
                relay_turn: Arc::default(),
                sent_through: run_order::SentThrough::default(),
            }),
        };
        if self.create_table {
            starting(|| outbox.create_table()).await?;
        }
        outbox.check_schema().await.map_err(|error| {
            Error::from(ConfigError::SchemaMismatch {
                table: outbox.table().to_string(),
                detail: error.to_string(),
            })
        })?;
        Ok(outbox)
    }
}

impl Outbox {
    async fn create_table(&self) -> Result<(), DbErr> {
        use crate::store::dialect::begin_detached;
        use sea_orm::TransactionOptions;
        let tx = begin_detached(&self.inner.db, TransactionOptions::default()).await?;
        if let Some((sql, values)) = self.inner.dialect.schema_lock(self.table().as_str()) {
            tx.query_one_raw(Statement::from_sql_and_values(self.backend(), sql, values))
                .await?;
        }
        // The table, a table of an earlier version brought to this one, then the indexes
        // (some of which read columns an earlier version's table lacks).
        let statements = create_outbox_statements(self.backend(), self.table());
        let (table, indexes) = statements.split_first().expect("a table statement");
        tx.execute_unprepared(table).await?;
        self.upgrade_table(&tx).await?;
        for sql in indexes {
            tx.execute_unprepared(sql).await?;
        }
        tx.commit().await
    }

    /// Brings a table an earlier version created to this version's schema: the `held_until`
    /// column and the indexes of ready rows, runs and holds.
    async fn upgrade_table(&self, db: &impl ConnectionTrait) -> Result<(), DbErr> {
        let column = match self.backend() {
            DbBackend::Postgres => {
                "SELECT 1 FROM information_schema.columns WHERE \
                 table_schema = current_schema() AND table_name = $1 AND column_name = 'held_until'"
            }
            DbBackend::MySql => {
                "SELECT 1 FROM information_schema.columns WHERE \
                 table_schema = DATABASE() AND table_name = ? AND column_name = 'held_until'"
            }
            _ => "SELECT 1 FROM pragma_table_info(?) WHERE name = 'held_until'",
        };
        let table = Value::from(self.table().as_str().to_owned());
        let upgraded = || async {
            let check = self.statement(column, vec![table.clone()]);
            db.query_one_raw(check).await.map(|row| row.is_some())
        };
        if upgraded().await? {
            return Ok(());
        }
        tracing::info!(table = self.table().as_str(), "upgrading the outbox table");
        for sql in upgrade_outbox_statements(self.backend(), self.table()) {
            if let Err(error) = db.execute_unprepared(&sql).await {
                // Another process starting at the same time upgraded it first.
                if self.backend() != DbBackend::Postgres && upgraded().await? {
                    return Ok(());
                }
                return Err(error);
            }
        }
        Ok(())
    }

    /// Reads every column this version uses, from no row: a table of another shape fails here.
    async fn check_schema(&self) -> Result<(), DbErr> {
        let sql = &self.inner.statements.check_schema;
        self.inner
            .db
            .query_all_raw(self.statement(sql, Vec::new()))
            .await?;
        Ok(())
    }
}

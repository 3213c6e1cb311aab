//! The outbox as its users hold it: built once, cloned freely; every public method is here,
//! each handing the work to the room that does it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Value};
use tokio::sync::Notify;

use super::error::StagingError;
use super::message::OutboxMessage;
use super::run_order::SentThrough;
use super::setup;
use super::shared::Shared;
use super::staging::{self, RunClaim};
use super::statements::{RunStatements, Statements};
use crate::clock::duration_ms;
use crate::error::{ConfigError, Error, Result};
use crate::key::InboxKey;
use crate::store::startup::{dialect_of, starting};
use crate::store::table::TableName;

/// The outbox table, kept in the application's database beside the inbox.
///
/// Give it to the inbox ([`InboxBuilder::outbox`](crate::InboxBuilder::outbox)) so that handlers
/// stage through [`Context::stage`](crate::Context::stage) or an `&Outbound` parameter, and to a
/// relay that publishes what was committed. Code outside handlers (an HTTP endpoint) stages in
/// its own transaction with [`Outbox::stage`]. Cloning is cheap; clones share the table and the
/// wake-up signal.
#[derive(Debug, Clone)]
pub struct Outbox {
    shared: Arc<Shared>,
}

/// A relay of an [`Outbox`] running in this process, until dropped: see
/// [`Relaying::local_relay`](crate::outbox::Relaying::local_relay).
#[derive(Debug)]
#[must_use = "the relay counts as running only while the guard lives"]
pub struct LocalRelay {
    shared: Arc<Shared>,
}

impl LocalRelay {
    /// Counts a relay of `shared` running in this process until the guard is dropped.
    pub(super) fn start(shared: Arc<Shared>) -> Self {
        shared.local_relays.fetch_add(1, Ordering::SeqCst);
        Self { shared }
    }
}

impl Drop for LocalRelay {
    fn drop(&mut self) {
        self.shared.local_relays.fetch_sub(1, Ordering::SeqCst);
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
    /// The state of this outbox, for the traits of other audiences (`admin`, relays).
    pub(super) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The table name used when none is configured.
    pub const DEFAULT_TABLE: &'static str = "idem_outbox";

    /// Starts configuring the outbox on `db` (SQLite, PostgreSQL or MySQL/MariaDB).
    pub fn builder(db: DatabaseConnection) -> OutboxBuilder {
        OutboxBuilder {
            db,
            table: Self::DEFAULT_TABLE.to_owned(),
            create_table: true,
            // A day: sent rows serve nothing but an operator's look back.
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
        staging::stage(&self.shared, conn, message).await
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
        let shared = &self.shared;
        staging::stage_for_run(shared, conn, id, message, announce, key, claim).await
    }

    /// The statements of the handler runs of the inbox whose table is `inbox` (quoted).
    pub(crate) fn statements_for_inbox(&self, inbox: &str) -> RunStatements {
        self.shared.statements.for_inbox(inbox)
    }

    /// Wakes the relays of this process: call it after committing a transaction that staged
    /// messages through [`Outbox::stage`] (the inbox does it for handlers).
    pub fn notify_staged(&self) {
        self.shared.staged.notify_waiters();
        self.shared.staged.notify_one();
    }

    /// Whether a relay of this outbox runs in this process.
    pub(crate) fn has_local_relay(&self) -> bool {
        self.shared.local_relays.load(Ordering::SeqCst) > 0
    }

    /// The table's name.
    pub fn table(&self) -> &TableName {
        &self.shared.table
    }

    /// The database connection the outbox uses.
    pub fn connection(&self) -> &DatabaseConnection {
        &self.shared.db
    }

    /// How long sent rows are kept before the cleaner deletes them.
    pub fn retention(&self) -> Duration {
        self.shared.retention
    }

    /// Deletes at most `limit` messages sent longer than the [retention](Outbox::retention)
    /// ago; returns how many. An inbox's cleaner does it for its outbox; a service that stages
    /// without an inbox calls it now and then (until it deletes fewer than `limit`).
    ///
    /// # Errors
    ///
    /// The database failed.
    pub async fn delete_sent(&self, limit: u32) -> Result<u64, DbErr> {
        let shared = &self.shared;
        let values = vec![
            Value::from(duration_ms(shared.retention)),
            Value::from(i64::from(limit)),
        ];
        let delete = shared.statement(&shared.statements.delete_sent, values);
        Ok(shared.db.execute_raw(delete).await?.rows_affected())
    }
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
        let shared = Arc::new(Shared {
            db: self.db,
            dialect,
            statements: Statements::new(dialect, &table),
            table,
            retention: self.retention,
            staged: Notify::new(),
            local_relays: AtomicUsize::new(0),
            relay_turn: Arc::default(),
            sent_through: SentThrough::default(),
        });
        if self.create_table {
            starting(|| setup::create_table(&shared)).await?;
        }
        setup::check_schema(&shared).await.map_err(|error| {
            Error::from(ConfigError::SchemaMismatch {
                table: shared.table.to_string(),
                detail: error.to_string(),
            })
        })?;
        Ok(Outbox { shared })
    }
}

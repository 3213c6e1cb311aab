//! Configuring an inbox.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sea_orm::DatabaseConnection;

use super::inner::{DEFAULT_MAX_ATTEMPTS, Inner};
use crate::error::{ConfigError, Error, Result};
use crate::outbox::Outbox;
use crate::retention::{RedeliveryWindow, RetentionPolicy};
use crate::store::startup::{dialect_of, on_open, starting};
use crate::store::table::TableName;
use crate::store::{Setup, Store};
use crate::telemetry::Telemetry;

/// Configures an [`Inbox`](crate::Inbox); [`InboxBuilder::build`] validates everything and creates the table.
///
/// ```no_run
/// # async fn demo(db: sea_orm::DatabaseConnection) -> Result<(), idem_runtime::Error> {
/// use std::time::Duration;
/// use idem_runtime::{Inbox, RetentionPolicy};
/// use idem_runtime::retention::RedeliveryWindow;
///
/// let inbox = Inbox::builder(db)
///     .table("billing_inbox")
///     .retention(RetentionPolicy::new(Duration::from_secs(14 * 24 * 3600)))
///     .redelivery_window(RedeliveryWindow::new(10, Duration::from_secs(1800)))
///     .max_attempts(3)
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct InboxBuilder {
    db: DatabaseConnection,
    table: String,
    retention: RetentionPolicy,
    window: Option<RedeliveryWindow>,
    max_attempts: u32,
    create_table: bool,
    read_only: bool,
    claim_wait: Duration,
    leases: HashMap<String, Duration>,
    outbox: Option<Outbox>,
}

impl InboxBuilder {
    pub(super) fn new(db: DatabaseConnection) -> Self {
        Self {
            db,
            table: TableName::DEFAULT.to_owned(),
            retention: RetentionPolicy::default(),
            window: None,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            create_table: true,
            read_only: false,
            // Long enough to ride out a short transaction holding the key, short enough that a
            // copy of a message whose handler runs long gives its connection back soon.
            claim_wait: Duration::from_secs(5),
            leases: HashMap::new(),
            outbox: None,
        }
    }

    /// The outbox handlers stage their outgoing messages in ([`Context::stage`](crate::Context::stage)),
    /// committed with their effects and inbox records. Its sent rows are deleted by the inbox's
    /// cleaner after the outbox's retention.
    pub fn outbox(mut self, outbox: Outbox) -> Self {
        self.outbox = Some(outbox);
        self
    }

    /// The inbox table's name (default `idem_inbox`); see [`TableName`] for what is accepted.
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// How long records are kept and how they are cleaned up.
    pub fn retention(mut self, policy: RetentionPolicy) -> Self {
        self.retention = policy;
        self
    }

    /// The broker's redelivery window: every retention must cover it, checked by
    /// [`InboxBuilder::build`] and [`Processing::check_handler`](crate::transport::Processing::check_handler).
    pub fn redelivery_window(mut self, window: RedeliveryWindow) -> Self {
        self.window = Some(window);
        self
    }

    /// How many claims a two-phase key may have (the first and its takeovers after expired
    /// leases) before it needs intervention (default 5).
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// How long a transactional claim waits for another transaction that holds the same key
    /// (default 5 s): a copy of a message whose handler is still running. Past it, the copy is
    /// reported as [`Error::InProgressElsewhere`] (requeued without counting, its connection
    /// given back) instead of waiting for the database's own lock timeout. PostgreSQL bounds it
    /// with `lock_timeout` and MariaDB with `innodb_lock_wait_timeout`, in whole seconds; on
    /// SQLite, which locks the whole file, the connection's busy timeout bounds every wait
    /// (sqlx's default is 5 s); on MySQL, the server's `innodb_lock_wait_timeout`.
    pub fn claim_wait(mut self, wait: Duration) -> Self {
        self.claim_wait = wait;
        self
    }

    /// The lease of `consumer`'s two-phase claims, whatever its handler says: a value from the
    /// application's configuration or environment. A handler's lease (the macro's `lease = ...`)
    /// applies where none is set here, and [`Mode::DEFAULT_LEASE`](crate::Mode::DEFAULT_LEASE)
    /// where the handler gives none. Retention is overridden the same way, with
    /// [`RetentionPolicy::with_consumer`].
    pub fn lease(mut self, consumer: impl Into<String>, lease: Duration) -> Self {
        self.leases.insert(consumer.into(), lease);
        self
    }

    /// Whether [`InboxBuilder::build`] creates the table if it is missing (default `true`).
    /// Turn it off when the application's migrations create it (feature `migration`).
    pub fn create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }

    /// Whether the inbox is only read through (default `false`): [`InboxBuilder::build`] then
    /// creates nothing and checks the table's columns with a query that writes nothing, so that
    /// a user that may only read, or a hot standby, can open it. For operators' tools that
    /// count and look records up ([`InboxAdmin::stats`](crate::admin::InboxAdmin::stats), [`InboxAdmin::lookup`](crate::admin::InboxAdmin::lookup),
    /// [`InboxAdmin::duplicate_summaries`](crate::admin::InboxAdmin::duplicate_summaries)); its cleaner must not be run, and processing through it
    /// fails where the database refuses the writes.
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// What [`InboxBuilder::build`] builds: the configuration validated, the table created if
    /// asked and checked.
    pub(super) async fn open(self) -> Result<Inner> {
        crate::metrics::describe();
        let table = TableName::new(self.table)?;
        match &self.window {
            Some(window) => self.retention.validate(window)?,
            None => self.retention.validate_settings()?,
        }
        if self.max_attempts == 0 {
            return Err(ConfigError::Zero("max attempts").into());
        }
        if self.leases.values().any(Duration::is_zero) {
            return Err(ConfigError::Zero("lease").into());
        }
        if self.claim_wait.is_zero() {
            return Err(ConfigError::Zero("claim wait").into());
        }
        let dialect = dialect_of(&self.db).await?;
        let mut store = Store::new(dialect, table, self.claim_wait);
        if !self.read_only {
            on_open(dialect, &self.db).await;
        }
        let setup = Setup::of(&mut store);
        if self.create_table && !self.read_only {
            starting(|| setup.create_table(&self.db)).await?;
        }
        let checked = if self.read_only {
            starting(|| setup.check_columns(&self.db)).await
        } else {
            starting(|| setup.check_schema(&self.db)).await
        };
        checked.map_err(|error| match error {
            Error::Database(error) => ConfigError::SchemaMismatch {
                table: store.table().to_string(),
                detail: error.to_string(),
            }
            .into(),
            error => error,
        })?;
        let mut setup = Setup::of(&mut store);
        setup.read_lock_timeout(&self.db).await?;
        setup.read_key_index(&self.db).await?;
        setup.read_packet_limit(&self.db).await?;
        let run_statements =
            (self.outbox.as_ref()).map(|outbox| outbox.statements_for_inbox(store.quoted_table()));
        Ok(Inner {
            run_statements,
            db: self.db,
            store: Arc::new(store),
            // Deletions are remembered for three retentions: a copy later than that is
            // not recognised.
            telemetry: Arc::new(Telemetry::new(
                self.retention.default_retention().saturating_mul(3),
                self.window.as_ref().map(RedeliveryWindow::duration),
            )),
            retention: self.retention,
            window: self.window,
            max_attempts: self.max_attempts,
            claim_wait: self.claim_wait,
            leases: self.leases,
            outbox: self.outbox,
            sqlite_batches: Arc::new(tokio::sync::Mutex::new(())),
        })
    }
}

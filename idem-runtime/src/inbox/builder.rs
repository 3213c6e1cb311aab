//! Configuring an inbox.

use std::sync::Arc;

use sea_orm::{DatabaseConnection, DbBackend};

use super::{DEFAULT_MAX_ATTEMPTS, Inbox, Inner};
use crate::error::{ConfigError, Error, Result};
use crate::retention::{RedeliveryWindow, RetentionPolicy};
use crate::store::Store;
use crate::store::table::TableName;

/// Configures an [`Inbox`]; [`InboxBuilder::build`] validates everything and creates the table.
///
/// ```no_run
/// # async fn demo(db: sea_orm::DatabaseConnection) -> Result<(), idem_runtime::Error> {
/// use std::time::Duration;
/// use idem_runtime::{Inbox, RedeliveryWindow, RetentionPolicy};
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
        }
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
    /// [`InboxBuilder::build`] and [`Inbox::check_handler`].
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

    /// Whether [`InboxBuilder::build`] creates the table if it is missing (default `true`).
    /// Turn it off when the application's migrations create it (feature `migration`).
    pub fn create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }

    /// Validates the configuration, creates the table if asked, checks that the table has the
    /// schema this version uses, and returns the inbox.
    pub async fn build(self) -> Result<Inbox> {
        let table = TableName::new(self.table)?;
        match &self.window {
            Some(window) => self.retention.validate(window)?,
            None => self.retention.validate_settings()?,
        }
        if self.max_attempts == 0 {
            return Err(ConfigError::Zero("max attempts").into());
        }
        let backend = self.db.get_database_backend();
        if !matches!(
            backend,
            DbBackend::Sqlite | DbBackend::Postgres | DbBackend::MySql
        ) {
            return Err(ConfigError::UnsupportedBackend(format!("{backend:?}")).into());
        }
        let store = Store::new(backend, table);
        if backend == DbBackend::Sqlite {
            enable_wal(&self.db).await;
        }
        if self.create_table {
            store
                .create_table(&self.db)
                .await
                .map_err(Error::Database)?;
        }
        store
            .check_schema(&self.db)
            .await
            .map_err(|error| match error {
                error if crate::error::is_unreachable(&error) => Error::Database(error),
                _ => ConfigError::SchemaMismatch {
                    table: store.table().to_string(),
                    detail: error.to_string(),
                }
                .into(),
            })?;
        Ok(Inbox {
            inner: Arc::new(Inner {
                db: self.db,
                store,
                retention: self.retention,
                window: self.window,
                max_attempts: self.max_attempts,
            }),
        })
    }
}

/// Switches a SQLite database to write-ahead logging, so readers do not block the writer. The
/// setting is stored in the database file; an in-memory database keeps its own journal.
async fn enable_wal(db: &DatabaseConnection) {
    use sea_orm::ConnectionTrait;
    if let Err(error) = db.execute_unprepared("PRAGMA journal_mode = WAL").await {
        tracing::warn!(%error, "could not switch SQLite to WAL; concurrent claims will wait longer");
    }
}

//! The transactional outbox: messages a handler stages in its own transaction, committed with
//! its effects and its inbox record or not at all, and published afterwards by a relay (the
//! RabbitMQ adapter's `Relay`) with ids that every re-execution derives identically.

mod message;
mod outbound;
mod pending;
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
use crate::store::table::TableName;

pub use message::{OutboxMessage, derived_id};
pub use outbound::Outbound;
pub(crate) use outbound::RunClaim;
pub use pending::{HeldBack, PendingBatch, PendingMessage};
pub use table::create_outbox_statements;
#[cfg(feature = "migration")]
pub(crate) use table::drop_outbox_statement;

/// The counter of messages staged in committed transactions, by table.
pub const OUTBOX_STAGED_TOTAL: &str = "idem_outbox_staged_total";

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
    /// How long sent rows are kept before the cleaner deletes them.
    retention: Duration,
    /// Wakes relays in this process after a commit that staged messages.
    staged: Notify,
    /// Relays of this outbox running in this process ([`Outbox::local_relay`]).
    local_relays: AtomicUsize,
    /// On SQLite, held by the relay of this process that has a batch in hand.
    relay_turn: Arc<tokio::sync::Mutex<()>>,
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
    /// Returns its message id: the one [`OutboxMessage::message_id`] gave, else a random one. A
    /// message whose id is already staged is not staged again. Call
    /// [`Outbox::notify_staged`] after the commit to wake the relays of this process at once.
    ///
    /// # Errors
    ///
    /// The message cannot be published as it is (a name longer than AMQP allows), or the
    /// database failed.
    pub async fn stage(
        &self,
        conn: &impl ConnectionTrait,
        message: OutboxMessage,
    ) -> Result<String, DbErr> {
        let id = message
            .message_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().hyphenated().to_string());
        self.stage_as(conn, &id, None, &message, true, None).await?;
        Ok(id)
    }

    /// Stages `message` as `id`, from the handler run of `origin` (which orders the relay's
    /// publishes), unless a message with that id is staged already; on PostgreSQL, with
    /// `notify`, also announces the commit to listening relays (once per transaction is enough).
    pub(crate) async fn stage_as(
        &self,
        conn: &impl ConnectionTrait,
        id: &str,
        origin: Option<&str>,
        message: &OutboxMessage,
        notify: bool,
        claim: Option<(RunClaim<'_>, &InboxKey)>,
    ) -> Result<(), DbErr> {
        if let Some(problem) = message.problem() {
            return Err(DbErr::Custom(format!(
                "cannot stage this message: {problem}"
            )));
        }
        let headers = (!message.headers.is_empty())
            .then(|| serde_json::to_string(&message.headers).expect("string maps serialize"));
        let t = self.quoted();
        let now = self.inner.dialect.now_ms();
        let columns =
            "message_id, exchange, routing_key, content_type, headers, payload, origin, staged_at";
        let values = format!("?, ?, ?, ?, ?, ?, ?, {now}");
        // A handler run stages only while its transaction still holds its inbox claim: one the
        // database rolled back under the handler (a MySQL/MariaDB deadlock, a SQLite error the
        // handler ignored) or that the handler ended itself no longer does, and the event would
        // commit on its own, of an effect that never was.
        // MariaDB tells it cheaper: a transaction is open only until it is rolled back.
        let in_transaction = self.inner.dialect.tells_open_transaction();
        let held = claim.map(|(claim, _)| {
            if in_transaction {
                " WHERE @@in_transaction = 1".to_owned()
            } else {
                format!(
                    " WHERE EXISTS (SELECT 1 FROM {} WHERE consumer = ? AND message_key = ? \
                     AND claim_token = ?)",
                    claim.inbox_table
                )
            }
        });
        let sql = match (self.backend(), held) {
            (DbBackend::MySql, Some(held)) => format!(
                "INSERT INTO {t} ({columns}) SELECT {values} FROM DUAL{held} \
                 ON DUPLICATE KEY UPDATE seq = seq"
            ),
            (_, Some(held)) => format!(
                "INSERT INTO {t} ({columns}) SELECT {values}{held} \
                 ON CONFLICT (message_id) DO NOTHING"
            ),
            // Not `INSERT IGNORE`, which would also store a value too long for its column
            // truncated, with a warning.
            (DbBackend::MySql, None) => format!(
                "INSERT INTO {t} ({columns}) VALUES ({values}) ON DUPLICATE KEY UPDATE seq = seq"
            ),
            (_, None) => format!(
                "INSERT INTO {t} ({columns}) VALUES ({values}) ON CONFLICT (message_id) DO NOTHING"
            ),
        };
        let mut values = vec![
            Value::from(id.to_owned()),
            Value::from(message.exchange.clone()),
            Value::from(message.routing_key.clone()),
            Value::from(message.content_type.clone()),
            Value::from(headers),
            Value::from(message.payload.clone()),
            Value::from(origin.map(str::to_owned)),
        ];
        if let (Some((claim, key)), false) = (claim, in_transaction) {
            values.extend(claim.values(key));
        }
        let staged = conn.execute_raw(self.statement(&sql, values)).await?;
        // Nothing written: a message of this id staged already (a repeat of the run; MariaDB
        // counts it as written), or the claim gone with the transaction.
        if let Some((claim, key)) = claim
            && staged.rows_affected() == 0
            && (in_transaction || !self.claim_held(conn, claim, key).await?)
        {
            return Err(DbErr::Custom(
                "nothing staged: the handler's transaction is no longer open (the database \
                 rolled it back, or the handler ended it)"
                    .to_owned(),
            ));
        }
        if notify && self.backend() == DbBackend::Postgres {
            // Delivered to listening relays when the transaction commits; never if it rolls back.
            let notify = "SELECT pg_notify(?, '')";
            conn.query_one_raw(self.statement(notify, vec![Value::from(self.channel())]))
                .await?;
        }
        Ok(())
    }

    /// Whether `conn`'s transaction still holds the run's inbox claim.
    async fn claim_held(
        &self,
        conn: &impl ConnectionTrait,
        claim: RunClaim<'_>,
        key: &InboxKey,
    ) -> Result<bool, DbErr> {
        let sql = format!(
            "SELECT 1 FROM {} WHERE consumer = ? AND message_key = ? AND claim_token = ?",
            claim.inbox_table
        );
        let row = conn
            .query_one_raw(self.statement(&sql, claim.values(key)))
            .await?;
        Ok(row.is_some())
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
        let t = self.quoted();
        let now = self.inner.dialect.now_ms();
        let sql = match self.backend() {
            DbBackend::MySql => {
                format!("DELETE FROM {t} WHERE sent_at < {now} - ? ORDER BY sent_at LIMIT ?")
            }
            _ => format!(
                "DELETE FROM {t} WHERE seq IN (SELECT seq FROM {t} WHERE sent_at < {now} - ? LIMIT ?)"
            ),
        };
        let values = vec![
            Value::from(duration_ms(self.inner.retention)),
            Value::from(i64::from(limit)),
        ];
        let result = self
            .inner
            .db
            .execute_raw(self.statement(&sql, values))
            .await?;
        Ok(result.rows_affected())
    }

    fn backend(&self) -> DbBackend {
        self.inner.dialect.backend()
    }

    fn quoted(&self) -> String {
        self.inner.table.quoted(self.backend())
    }

    fn statement(&self, sql: &str, values: Vec<Value>) -> Statement {
        Statement::from_sql_and_values(self.backend(), self.inner.dialect.placeholders(sql), values)
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
        let dialect = crate::inbox::dialect_of(&self.db).await?;
        let outbox = Outbox {
            inner: Arc::new(Inner {
                db: self.db,
                dialect,
                table,
                retention: self.retention,
                staged: Notify::new(),
                local_relays: AtomicUsize::new(0),
                relay_turn: Arc::default(),
            }),
        };
        if self.create_table {
            crate::inbox::starting(|| outbox.create_table()).await?;
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
        use sea_orm::TransactionTrait;
        let tx = self.inner.db.begin().await?;
        if let Some((sql, values)) = self.inner.dialect.schema_lock(self.table().as_str()) {
            tx.query_one_raw(Statement::from_sql_and_values(self.backend(), sql, values))
                .await?;
        }
        for sql in create_outbox_statements(self.backend(), self.table()) {
            tx.execute_unprepared(&sql).await?;
        }
        tx.commit().await
    }

    /// Reads every column this version uses, from no row: a table of another shape fails here.
    async fn check_schema(&self) -> Result<(), DbErr> {
        let sql = format!(
            "SELECT seq, message_id, exchange, routing_key, content_type, headers, payload, origin, \
             staged_at, sent_at FROM {} WHERE 1 = 0",
            self.quoted()
        );
        self.inner
            .db
            .query_all_raw(Statement::from_string(self.backend(), sql))
            .await?;
        Ok(())
    }
}

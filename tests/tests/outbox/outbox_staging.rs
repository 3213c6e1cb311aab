//! Staging in the outbox, on each backend it concerns: a staging outside handlers that reports a
//! failure committed nothing, and a key of the caller's makes its retries one message; a
//! staging that failed uses up no position, so a replay derives the same ids; runs order what
//! they stage, and messages outside runs hold back nothing; a table of an earlier version is
//! upgraded in place.
//!
//! Run: `cargo test -p idem-tests --test outbox outbox_staging::` with PostgreSQL and MariaDB up (see
//! README).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_runtime::admin::Forgotten;
use idem_runtime::admin::InboxAdmin;
use idem_runtime::admin::LiveClaim;
use idem_runtime::fingerprint::{Fingerprint, FingerprintError};
use idem_runtime::outbox::Relaying;
use idem_runtime::outbox::derived_id;
use idem_runtime::outbox::{Outbox, StagingError};
use idem_runtime::sea_orm::{
    ConnAcquireErr, ConnectionTrait, DatabaseConnection, DbBackend, DbErr, ExecResult, QueryResult,
    Statement, TransactionTrait,
};
use idem_runtime::{Context, Handler, Inbox, KeyError, MessageKey, Metadata, OutboxMessage};
use idem_tests::{Backend, Msg, TestDb, inbox_key, on_each_backend};

on_each_backend!(
    a_staging_that_failed_uses_up_no_position,
    a_keyed_staging_retried_is_one_message,
    a_named_run_goes_out_in_order_and_a_held_message_holds_back_the_rest,
    messages_outside_runs_hold_back_nothing,
    processes_starting_at_once_upgrade_an_earlier_versions_table,
);

/// Faults of PostgreSQL's own: its wake-up of other relays.
mod servers {
    use super::*;
    on_each_backend!([postgres]: a_staging_that_reports_a_failure_committed_nothing);
}

/// An outbox on a fresh table of `db`, and an inbox staging in it.
async fn outbox_and_inbox(db: &TestDb) -> (Outbox, Inbox) {
    let outbox = Outbox::builder(db.db.clone())
        .table(db.table("outbox"))
        .build()
        .await
        .expect("outbox builds");
    let inbox = Inbox::builder(db.db.clone())
        .table(db.table("inbox"))
        .outbox(outbox.clone())
        .build()
        .await
        .expect("inbox builds");
    (outbox, inbox)
}

/// The ids of the pending messages, in the order the relay takes them.
async fn pending_ids(outbox: &Outbox) -> Vec<String> {
    let batch = outbox.take_pending(1000).await.unwrap();
    let ids = batch
        .messages()
        .iter()
        .map(|m| m.message_id.clone())
        .collect();
    batch.mark_sent(&[]).await.unwrap();
    ids
}

/// A connection whose statements after the first fail, as a pooled connection with none free
/// in time would: the wake-up a staging sends after its insert, say.
struct FailsAfterFirst<'a> {
    inner: &'a DatabaseConnection,
    calls: AtomicU32,
}

impl FailsAfterFirst<'_> {
    fn next(&self) -> Result<(), DbErr> {
        match self.calls.fetch_add(1, Ordering::SeqCst) {
            0 => Ok(()),
            _ => Err(DbErr::ConnectionAcquire(ConnAcquireErr::Timeout)),
        }
    }
}

#[async_trait::async_trait]
impl ConnectionTrait for FailsAfterFirst<'_> {
    fn get_database_backend(&self) -> DbBackend {
        self.inner.get_database_backend()
    }
    async fn execute_raw(&self, stmt: Statement) -> Result<ExecResult, DbErr> {
        self.next()?;
        self.inner.execute_raw(stmt).await
    }
    async fn execute_unprepared(&self, sql: &str) -> Result<ExecResult, DbErr> {
        self.next()?;
        self.inner.execute_unprepared(sql).await
    }
    async fn query_one_raw(&self, stmt: Statement) -> Result<Option<QueryResult>, DbErr> {
        self.next()?;
        self.inner.query_one_raw(stmt).await
    }
    async fn query_all_raw(&self, stmt: Statement) -> Result<Vec<QueryResult>, DbErr> {
        self.next()?;
        self.inner.query_all_raw(stmt).await
    }
}

/// Outside handlers, on a plain connection, a staging commits on its own: a failure reported
/// must mean nothing was committed (the caller retries), and a success that it was.
async fn a_staging_that_reports_a_failure_committed_nothing(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let (outbox, _) = outbox_and_inbox(&db).await;
    let failing = FailsAfterFirst {
        inner: &db.db,
        calls: AtomicU32::new(0),
    };
    let staged = outbox
        .stage(
            &failing,
            OutboxMessage::new("orders", "order.placed", b"{}".to_vec()),
        )
        .await;
    let rows = db.count(outbox.table().as_str(), "1=1").await;
    match staged {
        Ok(_) => assert_eq!(rows, 1, "a success with nothing committed"),
        Err(error) => assert_eq!(rows, 0, "a failure reported with a row committed: {error}"),
    }
}

/// A message keyed by the caller gets an id derived from the key: staged again (a retry after
/// an answer that never came), it is one message.
async fn a_keyed_staging_retried_is_one_message(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let (outbox, _) = outbox_and_inbox(&db).await;
    let message = || OutboxMessage::new("orders", "order.placed", b"{}".to_vec()).keyed("order-42");
    let first = outbox.stage(&db.db, message()).await.unwrap();
    let again = outbox.stage(&db.db, message()).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(first, OutboxMessage::keyed_id("order-42"));
    assert_ne!(first, OutboxMessage::keyed_id("order-43"));
    assert_eq!(pending_ids(&outbox).await, vec![first]);
    // An empty key is no key.
    let error = outbox
        .stage(
            &db.db,
            OutboxMessage::new("orders", "x", b"{}".to_vec()).keyed(""),
        )
        .await
        .unwrap_err();
    assert!(matches!(error, StagingError::Invalid(_)), "{error:?}");
}

/// Refuses stagings to the exchange `refused`, as a constraint of the table's operators would.
async fn refuse_the_exchange(db: &TestDb, table: &str) {
    let sql = match db.backend {
        Backend::Sqlite => format!(
            "CREATE TRIGGER {table}_refused BEFORE INSERT ON {table} \
             WHEN NEW.exchange = 'refused' BEGIN SELECT RAISE(ABORT, 'refused'); END"
        ),
        _ => format!(
            "ALTER TABLE {table} ADD CONSTRAINT {table}_refused CHECK (exchange <> 'refused')"
        ),
    };
    db.exec(&sql).await;
}

/// Stages a message to `refused` inside a savepoint first when the body says `retry`, rolls the
/// savepoint back, then stages the real event; returns its id.
#[derive(Debug, Clone)]
struct Restager;

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct RestageError(#[from] DbErr);

impl From<StagingError> for RestageError {
    fn from(error: StagingError) -> Self {
        Self(error.into())
    }
}

impl Handler for Restager {
    type Message = Msg;
    type Output = String;
    type Error = RestageError;

    fn consumer(&self) -> &str {
        "restager"
    }
    fn key(&self, msg: &Msg, _: &Metadata) -> Result<MessageKey, KeyError> {
        MessageKey::new(msg.id.as_str())
    }
    fn fingerprint(&self, _: &Msg, _: &Metadata) -> Result<Option<Fingerprint>, FingerprintError> {
        Ok(None)
    }
    async fn handle(&self, cx: &Context<'_>, msg: Msg) -> Result<String, RestageError> {
        let tx = cx.transaction().expect("transactional");
        if msg.body == "retry" {
            let savepoint = tx.begin().await?;
            let refused = cx
                .stage(OutboxMessage::new("refused", "event", b"{}".to_vec()))
                .await;
            assert!(refused.is_err(), "the refused staging is refused");
            savepoint.rollback().await?;
        }
        Ok(cx
            .stage(OutboxMessage::new("events", "event", b"{}".to_vec()))
            .await?)
    }
}

/// Only a kept staging takes its position: a handler that retried a refused staging stages
/// its event under the id a clean run derives, and a replay after `forget` adds nothing.
async fn a_staging_that_failed_uses_up_no_position(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let (outbox, inbox) = outbox_and_inbox(&db).await;
    refuse_the_exchange(&db, outbox.table().as_str()).await;
    let key = inbox_key("restager", "o-1");
    let first = inbox
        .process(&Restager, Msg::new("o-1", "retry"), &Metadata::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first, derived_id(&key, 0));
    let forgotten = inbox.forget(&key, LiveClaim::Refuse).await.unwrap();
    assert_eq!(forgotten, Forgotten::Deleted);
    let replayed = inbox
        .process(&Restager, Msg::new("o-1", "clean"), &Metadata::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replayed, first);
    assert_eq!(pending_ids(&outbox).await, vec![first]);
}

/// Stages `message` outside handlers in a transaction of its own, committed before it returns.
async fn stage_alone(db: &TestDb, outbox: &Outbox, message: OutboxMessage) -> String {
    let tx = db.db.begin().await.unwrap();
    let id = outbox.stage(&tx, message).await.unwrap();
    tx.commit().await.unwrap();
    id
}

/// Messages a caller stages in one named run, one transaction after the other, go out in that
/// order; a held one holds back the rest of its run, and nothing else.
async fn a_named_run_goes_out_in_order_and_a_held_message_holds_back_the_rest(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let (outbox, _) = outbox_and_inbox(&db).await;
    let event = |n: u8| OutboxMessage::new("orders", "order.placed", vec![n]);
    let first = stage_alone(&db, &outbox, event(1).in_run("order-7")).await;
    let alone = stage_alone(&db, &outbox, event(2)).await;
    let second = stage_alone(&db, &outbox, event(3).in_run("order-7")).await;
    let other = stage_alone(&db, &outbox, event(4).in_run("order-8")).await;
    assert_eq!(
        pending_ids(&outbox).await,
        vec![first.clone(), alone.clone(), second, other.clone()]
    );
    let batch = outbox.take_pending(10).await.unwrap();
    let held = (batch.messages().iter())
        .find(|m| m.message_id == first)
        .expect("the first message");
    assert!(held.run.is_some(), "a named run is a run");
    batch.hold(held, Duration::from_secs(60)).await.unwrap();
    batch.mark_sent(&[]).await.unwrap();
    // Messages the run stages later are held back with it.
    let later = stage_alone(&db, &outbox, event(5).in_run("order-7")).await;
    assert_eq!(pending_ids(&outbox).await, vec![alone, other]);
    assert_eq!(
        outbox.release_holds().await.unwrap(),
        0,
        "the hold still runs"
    );
    let _ = later;
}

/// Messages staged outside handlers and outside any run are not ordered with each other: one
/// held back holds back no other.
async fn messages_outside_runs_hold_back_nothing(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let (outbox, _) = outbox_and_inbox(&db).await;
    let event = |n: u8| OutboxMessage::new("orders", "order.placed", vec![n]);
    let a = stage_alone(&db, &outbox, event(1)).await;
    let b = stage_alone(&db, &outbox, event(2)).await;
    let batch = outbox.take_pending(10).await.unwrap();
    let held = (batch.messages().iter())
        .find(|m| m.message_id == a)
        .expect("the first message");
    assert_eq!(held.run, None);
    batch.hold(held, Duration::from_secs(60)).await.unwrap();
    batch.mark_sent(&[]).await.unwrap();
    assert_eq!(pending_ids(&outbox).await, vec![b]);
}

/// The outbox table as the version before `held_until` created it, with one pending message.
async fn earlier_versions_table(db: &TestDb) -> String {
    let table = db.table("outbox_v0");
    let (seq, id, payload) = match db.backend {
        Backend::MySql => (
            "BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY",
            "VARBINARY(255)",
            "LONGBLOB",
        ),
        Backend::Postgres => ("BIGSERIAL PRIMARY KEY", "VARCHAR(255)", "BYTEA"),
        Backend::Sqlite => ("INTEGER PRIMARY KEY AUTOINCREMENT", "VARCHAR(255)", "BLOB"),
    };
    db.exec(&format!(
        "CREATE TABLE {table} (seq {seq}, message_id {id} NOT NULL, \
         exchange VARCHAR(255) NOT NULL, routing_key VARCHAR(255) NOT NULL, \
         content_type VARCHAR(255) NULL, headers TEXT NULL, payload {payload} NOT NULL, \
         origin VARCHAR(512) NULL, staged_at BIGINT NOT NULL, sent_at BIGINT NULL, \
         CONSTRAINT {table}_message_id UNIQUE (message_id))"
    ))
    .await;
    db.exec(&format!(
        "CREATE INDEX {table}_pending ON {table} (sent_at, seq)"
    ))
    .await;
    db.exec(&format!(
        "INSERT INTO {table} (message_id, exchange, routing_key, payload, origin, staged_at) \
         VALUES ('before', 'events', 'old', 'x', 'billing/o-1', 0)"
    ))
    .await;
    table
}

/// Two processes of this version start at once on a table an earlier version created: both
/// start, the table gains what this version needs, and the message staged before is taken
/// with the ones staged after.
async fn processes_starting_at_once_upgrade_an_earlier_versions_table(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let table = earlier_versions_table(&db).await;
    let build = || Outbox::builder(db.db.clone()).table(table.clone()).build();
    let (first, second) = tokio::join!(build(), build());
    let (outbox, _) = (first.expect("one upgrades"), second.expect("the other too"));
    assert_eq!(db.count(&table, "held_until IS NULL").await, 1);
    let id = outbox
        .stage(
            &db.db,
            OutboxMessage::new("events", "new", b"y".to_vec()).keyed("after"),
        )
        .await
        .unwrap();
    assert_eq!(pending_ids(&outbox).await, ["before".to_owned(), id]);
    // Started again: nothing left to upgrade.
    build().await.expect("an upgraded table builds");
}

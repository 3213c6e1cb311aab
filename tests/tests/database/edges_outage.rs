//! The inbox's database lost, or taking no writes, under a handler: an outage inside the handler,
//! a database that takes no writes (a failover's demoted primary, a SQLite file that is read-only
//! or full). Each is an outage, requeued uncounted, and the message is processed once the
//! database is back.
//!
//! Run: `cargo test -p idem-tests --test database edges_outage::` with PostgreSQL and MariaDB up (see
//! README).

use std::time::Duration;

use idem_runtime::sea_orm::ConnectionTrait;
use idem_runtime::transport::{Backoff, Decision, DeliveryPolicy, Retry, RetryMemory};
use idem_runtime::{Inbox, Metadata, Outcome, transport::Settle};
use idem_tests::inbox_and_effects as setup;
use idem_tests::proxy::behind_proxy;
use idem_tests::{Backend, Msg, Recorder, TestDb, meta, on_each_backend};

/// Faults of the database servers': one that goes away.
mod servers {
    use super::*;
    on_each_backend!([postgres, mysql]: an_outage_inside_the_handler_is_an_outage);
}

async fn an_outage_inside_the_handler_is_an_outage(backend: Backend) {
    let (db, proxy) = behind_proxy(backend).await;
    let inbox = Inbox::builder(db.db.clone())
        .table(db.table("inbox"))
        .build()
        .await
        .unwrap();
    let effects = db.effects_table().await;
    let handler = Recorder::new(&db, &effects, "billing").slow(Duration::from_millis(600));
    let msg = Msg::new("o-1", "a");
    let run = {
        let (inbox, handler, msg) = (inbox.clone(), handler.clone(), msg.clone());
        tokio::spawn(async move { inbox.process(&handler, msg, &Metadata::default()).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.cut().await;
    let error = run.await.unwrap().unwrap_err();
    assert!(error.is_store_unavailable(), "{error:?}");
    assert!(!error.counts_as_attempt());
    assert_eq!(error.code(), "database-unavailable");

    proxy.restore();
    let mut result = inbox.process(&handler, msg.clone(), &meta()).await;
    for _ in 0..20 {
        if result.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        result = inbox.process(&handler, msg.clone(), &meta()).await;
    }
    assert_eq!(result.unwrap(), Outcome::Processed("run:a".into()));
    assert_eq!(db.count(&effects, "1=1").await, 1);
}

/// A database that takes no writes (a primary demoted by a failover, a standby the pool reached)
/// is an outage: requeued uncounted until writes come back, not a failure of the message. On
/// PostgreSQL, through a pool of one connection whose session opens read-only transactions once
/// the inbox is built.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_that_takes_no_writes_is_an_outage() {
    let (db, inbox, effects) = setup(Backend::Postgres).await;
    let one = db.another_pool(1).await;
    let demoted = Inbox::builder(one.clone())
        .table(inbox.table().as_str())
        .create_table(false)
        .build()
        .await
        .unwrap();
    one.execute_unprepared("SET default_transaction_read_only = on")
        .await
        .unwrap();
    let msg = Msg::new("read-only-1", "x");
    for handler in [
        Recorder::new(&db, &effects, "read-only"),
        Recorder::new(&db, &effects, "read-only").two_phase(Duration::from_secs(5)),
    ] {
        let error = demoted
            .process(&handler, msg.clone(), &meta())
            .await
            .unwrap_err();
        assert!(error.is_store_unavailable(), "{error:?}");
        assert_eq!(error.settle(), Settle::Requeue);
        // Never counted, even while other deliveries reach the database (the new primary):
        // counted, a failover's stale pooled connections dead-lettered healthy messages.
        let retry = Retry::of(&error);
        assert_eq!(retry, Retry::NoWrites, "{error:?}");
        let memory = RetryMemory::default();
        memory.store_reached();
        let policy = DeliveryPolicy::new(
            1,
            Backoff::new(Duration::from_millis(10), Duration::from_secs(1)),
        );
        let decision = policy.decide(&memory, "m", retry, 5, error.code(), "d");
        assert!(
            matches!(decision, Decision::Requeue { counted: false, .. }),
            "{decision:?}"
        );
    }
    assert_eq!(db.count(&effects, "1=1").await, 0);
    let handler = Recorder::new(&db, &effects, "read-only");
    let processed = inbox.process(&handler, msg, &meta()).await.unwrap();
    assert!(!processed.is_duplicate());
    assert_eq!(db.count(&effects, "1=1").await, 1);
}

/// A SQLite database that takes no writes (read-only here; a full disk or an I/O error alike) is
/// an outage: the message is requeued uncounted, and processed once the database takes writes
/// again. Counted, a full disk dead-lettered every message.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sqlite_database_that_takes_no_writes_is_an_outage() {
    let db = TestDb::connect_with_pool(Backend::Sqlite, 1).await;
    let inbox = Inbox::builder(db.db.clone())
        .table(db.table("inbox"))
        .build()
        .await
        .unwrap();
    let effects = db.effects_table().await;
    let handler = Recorder::new(&db, &effects, "billing");
    db.exec("PRAGMA query_only = ON").await;
    let error = inbox
        .process(&handler, Msg::new("o-1", "a"), &meta())
        .await
        .unwrap_err();
    assert!(error.is_store_unavailable(), "{error:?}");
    assert!(!error.counts_as_attempt());
    db.exec("PRAGMA query_only = OFF").await;
    let outcome = inbox.process(&handler, Msg::new("o-1", "a"), &meta()).await;
    assert_eq!(outcome.unwrap(), Outcome::Processed("run:a".into()));
    assert_eq!(db.count(&effects, "1=1").await, 1);
}

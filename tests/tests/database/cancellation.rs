//! Runs cancelled at any moment (a consumer stopping, an HTTP client hanging up, which drops the
//! request's future): the pooled connection goes back outside any transaction.
//!
//! Run: `cargo test -p idem-tests --test database cancellation::` with PostgreSQL up (see README).

use std::time::{Duration, Instant};

use idem_runtime::{Inbox, Metadata};
use idem_tests::cancel::cancelled_after;
use idem_tests::db::{connect_with, count_on, insert_effect};
use idem_tests::proxy::Proxy;
use idem_tests::recorder::{Msg, Recorder};
use idem_tests::{Backend, inbox_and_effects, on_each_backend};
use sea_orm::DatabaseConnection;

// MySQL/MariaDB are left out: sqlx's MySQL connection cancelled in the middle of a statement can
// hang in the pool's release ping and never come back (the pool then runs out), which no begin
// can prevent; idem-http runs each request in a task of its own for that reason.
on_each_backend!([sqlite]: a_run_cancelled_at_any_moment_leaves_its_connection_outside_any_transaction);

/// A run whose future is dropped while its transaction begins must not leave the transaction
/// open on the connection it returns to the pool: the next borrower's statements would run
/// inside it, uncommitted, holding its locks (sqlx 0.9 raises its transaction depth only after
/// `BEGIN`'s answer, and a drop before that queues no `ROLLBACK`).
async fn a_run_cancelled_at_any_moment_leaves_its_connection_outside_any_transaction(
    backend: Backend,
) {
    let (db, inbox, effects) = inbox_and_effects(backend).await;
    // One connection, so that the next statement gets the one the cancelled run returned.
    let pool = db.pool_waiting_at_most(1, Duration::from_secs(10)).await;
    let delays = (0..400u64).map(|i| Duration::from_micros((i * 37) % 2500));
    let other = db.another_pool(1).await;
    cancel_runs(&db, &inbox, &effects, pool, other, delays).await;
}

/// PostgreSQL behind a proxy that delays each answer by 20 ms: the cancellations, 2 ms apart,
/// land inside `BEGIN`'s round trip whatever the machine's speed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_run_cancelled_while_it_begins_leaves_no_transaction_open() {
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let proxy = Proxy::start_with_delay("127.0.0.1:5432", Duration::from_millis(20)).await;
    let url = format!("postgres://postgres@127.0.0.1:{}/test", proxy.port());
    let pool = connect_with(&url, 1, Duration::from_secs(10))
        .await
        .expect("PostgreSQL through the proxy");
    let delays = (0..40u64).map(|i| Duration::from_millis(i * 2));
    let other = db.another_pool(1).await;
    cancel_runs(&db, &inbox, &effects, pool, other, delays).await;
}

/// Cancels one run after each of `delays` on `pool` (one connection), and checks after each
/// that a statement on that connection commits at once: `other` sees it.
async fn cancel_runs(
    db: &idem_tests::TestDb,
    inbox: &Inbox,
    effects: &str,
    pool: DatabaseConnection,
    other: DatabaseConnection,
    delays: impl Iterator<Item = Duration>,
) {
    let one = Inbox::builder(pool.clone())
        .table(inbox.table().as_str())
        .create_table(false)
        .build()
        .await
        .expect("the inbox builds");
    let recorder = Recorder::new(db, effects, "cancelled");
    let probes = db.effects_table().await;
    let meta = Metadata::default();
    for (i, delay) in delays.enumerate() {
        let message = Msg::new(format!("m-{i}"), "body");
        cancelled_after(delay, one.process(&recorder, message, &meta)).await;
        // Outside a transaction this insert commits at once and another connection sees it.
        let probe = format!("p-{i}");
        let probing = Instant::now();
        insert_effect(&pool, &probes, "probe", &probe, "x")
            .await
            .unwrap_or_else(|error| {
                panic!("no probe after a run cancelled after {delay:?}: {error}")
            });
        if probing.elapsed() > Duration::from_millis(500) {
            eprintln!("probe {i} after {delay:?} took {:?}", probing.elapsed());
        }
        let seen = count_on(&other, &probes, &format!("message_key = '{probe}'")).await;
        assert_eq!(
            seen, 1,
            "a run cancelled after {delay:?} left its connection inside a transaction"
        );
    }
}

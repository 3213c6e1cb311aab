//! Runs cancelled at any moment (a consumer stopping, an HTTP client hanging up, which drops the
//! request's future) on each backend: the pooled connection goes back outside any transaction.
//!
//! Run: `cargo test -p idem-tests --test cancellation` with PostgreSQL and MariaDB up (see README).

use std::time::{Duration, Instant};

use idem_runtime::{Inbox, Metadata};
use idem_tests::cancel::cancelled_after;
use idem_tests::db::insert_effect;
use idem_tests::recorder::{Msg, Recorder};
use idem_tests::{Backend, inbox_and_effects, on_each_backend};

// MySQL/MariaDB are left out: sqlx's MySQL connection cancelled in the middle of a statement can
// hang in the pool's release ping and never come back (the pool then runs out), which no begin
// can prevent; idem-http runs each request in a task of its own for that reason.
on_each_backend!([sqlite, postgres]: a_run_cancelled_at_any_moment_leaves_its_connection_outside_any_transaction);

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
    let one = Inbox::builder(pool.clone())
        .table(inbox.table().as_str())
        .create_table(false)
        .build()
        .await
        .expect("the inbox builds");
    let recorder = Recorder::new(&db, &effects, "cancelled");
    let probes = db.effects_table().await;
    let other = db.another_pool(1).await;
    let meta = Metadata::default();
    for i in 0..400u64 {
        let delay = Duration::from_micros((i * 37) % 2500);
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
        let seen =
            idem_tests::db::count_on(&other, &probes, &format!("message_key = '{probe}'")).await;
        assert_eq!(
            seen, 1,
            "a run cancelled after {delay:?} left its connection inside a transaction"
        );
    }
}

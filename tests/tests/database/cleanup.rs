//! Retention cleanup on each backend: bounded batches that delete exactly the expired records
//! while claims go on, past records a long transaction holds, one cleaner at a time per table,
//! and a background task that stops cleanly.
//!
//! Run: `cargo test -p idem-tests --test database cleanup::` with PostgreSQL and MariaDB up (see README).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_runtime::{Inbox, Metadata, RetentionPolicy};
use idem_tests::{Backend, Msg, Recorder, TestDb, on_each_backend};

on_each_backend!(
    cleanup_deletes_exactly_the_expired_records_in_batches_while_claims_go_on,
    two_cleaners_at_once_one_works,
    spawned_cleaner_runs_and_stops_cleanly,
);

/// Faults of the database servers': a record locked by another transaction.
mod servers {
    use super::*;
    on_each_backend!([postgres, mysql]: a_record_a_long_transaction_holds_is_left_and_the_rest_deleted);
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Inserts `count` completed records of `consumer`, expiring at `expires_at`, 1 000 per statement.
async fn seed(db: &TestDb, table: &str, consumer: &str, count: usize, expires_at: i64) {
    let ids: Vec<usize> = (0..count).collect();
    for chunk in ids.chunks(1000) {
        let rows: Vec<String> = chunk
            .iter()
            .map(|i| {
                format!(
                    "('{consumer}', 'key-{i}', 'completed', NULL, NULL, 1, 0, 1, 1, NULL, 1, {expires_at})"
                )
            })
            .collect();
        db.exec(&format!(
            "INSERT INTO {table} (consumer, message_key, status, fingerprint, output, attempts, \
             claim_token, created_at, claimed_at, lease_until, completed_at, expires_at) VALUES {}",
            rows.join(", ")
        ))
        .await;
    }
}

async fn inbox_with(db: &TestDb, table: &str, policy: RetentionPolicy) -> Inbox {
    Inbox::builder(db.db.clone())
        .table(table)
        .retention(policy)
        .build()
        .await
        .unwrap()
}

async fn cleanup_deletes_exactly_the_expired_records_in_batches_while_claims_go_on(
    backend: Backend,
) {
    let db = TestDb::connect(backend).await;
    let table = db.table("inbox");
    let policy = RetentionPolicy::default()
        .with_batch_size(5_000)
        .with_pause_between_batches(Duration::from_millis(2));
    let inbox = inbox_with(&db, &table, policy).await;
    seed(&db, &table, "expired", 50_000, now_ms() - 60_000).await;
    seed(&db, &table, "live", 1_000, now_ms() + 3_600_000).await;

    // Consumers keep claiming new keys while the cleaner runs.
    let effects = db.effects_table().await;
    let handler = Recorder::new(&db, &effects, "busy");
    let done = Arc::new(AtomicBool::new(false));
    let processed = Arc::new(AtomicU32::new(0));
    let claims = {
        let (inbox, done, processed) = (inbox.clone(), done.clone(), processed.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !done.load(Ordering::SeqCst) || i < 20 {
                let msg = Msg::new(format!("m-{i}"), "x");
                inbox
                    .process(&handler, msg, &Metadata::default())
                    .await
                    .expect("claims go on during cleanup");
                processed.fetch_add(1, Ordering::SeqCst);
                i += 1;
            }
        })
    };

    let report = inbox.cleaner().run_once().await.unwrap();
    done.store(true, Ordering::SeqCst);
    claims.await.unwrap();

    assert!(!report.skipped);
    assert_eq!(report.deleted, 50_000);
    assert!(
        report.batches >= 10,
        "bounded batches of 5 000, got {}",
        report.batches
    );
    assert_eq!(db.count(&table, "consumer = 'expired'").await, 0);
    assert_eq!(db.count(&table, "consumer = 'live'").await, 1_000);
    let processed = i64::from(processed.load(Ordering::SeqCst));
    assert_eq!(db.count(&table, "consumer = 'busy'").await, processed);
    assert_eq!(db.count(&effects, "1=1").await, processed);
}

async fn two_cleaners_at_once_one_works(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let table = db.table("inbox");
    let policy = RetentionPolicy::default()
        .with_batch_size(1_000)
        .with_pause_between_batches(Duration::from_millis(5));
    // Two inboxes on one table, as two processes would have.
    let first = inbox_with(&db, &table, policy.clone()).await;
    let second = inbox_with(&db, &table, policy).await;
    seed(&db, &table, "expired", 20_000, now_ms() - 60_000).await;

    let (one, two) = (first.cleaner(), second.cleaner());
    let (a, b) = tokio::join!(one.run_once(), two.run_once());
    let reports = [a.unwrap(), b.unwrap()];
    let working: Vec<_> = reports.iter().filter(|r| r.deleted > 0).collect();
    assert_eq!(working.len(), 1, "{reports:?}");
    assert_eq!(working[0].deleted, 20_000);
    assert_eq!(
        reports.iter().filter(|r| r.skipped).count(),
        1,
        "{reports:?}"
    );
    assert_eq!(db.count(&table, "1=1").await, 0);

    // Once the first is done, the lock is free again.
    seed(&db, &table, "expired", 10, now_ms() - 60_000).await;
    let later = second.cleaner().run_once().await.unwrap();
    assert_eq!((later.deleted, later.skipped), (10, false));
}

/// SQLite's in-process lock is per database file: a table named alike in another file is
/// another table.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_cleaners_of_two_files_with_one_table_name_both_work() {
    let (first, second) = (
        TestDb::connect(Backend::Sqlite).await,
        TestDb::connect(Backend::Sqlite).await,
    );
    let table = first.table("inbox");
    let policy = RetentionPolicy::default()
        .with_batch_size(1_000)
        .with_pause_between_batches(Duration::from_millis(5));
    let one = inbox_with(&first, &table, policy.clone()).await;
    let two = inbox_with(&second, &table, policy).await;
    seed(&first, &table, "expired", 10_000, now_ms() - 60_000).await;
    seed(&second, &table, "expired", 8_000, now_ms() - 60_000).await;
    seed(&second, &table, "live", 10, now_ms() + 3_600_000).await;

    // Each run takes several batches with pauses between them, so the two overlap.
    let (one, two) = (one.cleaner(), two.cleaner());
    let (a, b) = tokio::join!(one.run_once(), two.run_once());
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!((a.deleted, a.skipped), (10_000, false), "{a:?}");
    assert_eq!((b.deleted, b.skipped), (8_000, false), "{b:?}");
    assert_eq!(first.count(&table, "1=1").await, 0);
    assert_eq!(second.count(&table, "consumer = 'expired'").await, 0);
    assert_eq!(second.count(&table, "consumer = 'live'").await, 10);
}

async fn spawned_cleaner_runs_and_stops_cleanly(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let table = db.table("inbox");
    let policy = RetentionPolicy::default()
        .with_batch_size(500)
        .with_cleanup_interval(Duration::from_millis(100));
    let inbox = inbox_with(&db, &table, policy).await;
    seed(&db, &table, "expired", 2_000, now_ms() - 60_000).await;
    seed(&db, &table, "live", 10, now_ms() + 3_600_000).await;

    let cleaner = inbox.cleaner().spawn();
    // Records that expire while the cleaner runs are deleted by a later round.
    tokio::time::sleep(Duration::from_millis(150)).await;
    seed(&db, &table, "late", 300, now_ms() - 1).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while db.count(&table, "1=1").await > 10 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "cleaner did not catch up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let total = cleaner.stop().await;
    assert_eq!(total.deleted, 2_300);
    assert_eq!(db.count(&table, "consumer = 'live'").await, 10);
}

/// An expired record that a long transaction holds (a takeover whose handler runs for minutes)
/// is left for a later run; the cleaner deletes the others at once and never waits for it.
async fn a_record_a_long_transaction_holds_is_left_and_the_rest_deleted(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let table = db.table("inbox");
    let inbox = inbox_with(&db, &table, RetentionPolicy::default()).await;
    seed(&db, &table, "expired", 10, now_ms() - 60_000).await;
    let holder = db.hold_record(&table, "expired", "key-0").await;
    let run = tokio::time::timeout(Duration::from_secs(20), inbox.cleaner().run_once()).await;
    holder.rollback().await.unwrap();
    let report = run
        .expect("the cleaner does not wait for the held record")
        .unwrap();
    assert_eq!(report.deleted, 9);
    assert_eq!(db.count(&table, "1=1").await, 1);
    assert_eq!(db.count(&table, "message_key = 'key-0'").await, 1);
}

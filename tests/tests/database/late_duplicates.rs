//! Late duplicates on each backend: a copy that comes after its key's record expired, or after
//! the cleaner deleted it, is processed again (as designed) and counted as late, in the process
//! that met it and, through the digests of deleted keys, in any other; new keys are not; the
//! duplicates' summaries every process writes add up.
//!
//! Run: `cargo test -p idem-tests --test database late_duplicates::` with PostgreSQL and MariaDB up.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_runtime::admin::DuplicateSummary;
use idem_runtime::admin::InboxAdmin;
use idem_runtime::retention::RedeliveryWindow;
use idem_runtime::transport::Processing;
use idem_runtime::{Inbox, Metadata, RetentionPolicy};
use idem_tests::{Backend, Msg, Recorder, TestDb, on_each_backend, unique};
use metrics_exporter_prometheus::PrometheusBuilder;
use sea_orm::{ConnectionTrait, Statement};

on_each_backend!(
    copies_after_their_record_expired_or_was_deleted_are_late,
    duplicates_are_summed_across_processes,
    a_nearly_empty_digest_expects_next_to_no_false_alarms,
    summaries_stay_a_row_per_consumer_and_day_across_process_starts,
    a_cleaner_run_writes_the_digest_in_proportion_to_its_deletions,
    filters_unwritten_for_three_retentions_are_dropped,
);

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Inserts completed records of `consumer` for `keys`, processed `age` ago and expired since.
async fn seed_expired(db: &TestDb, table: &str, consumer: &str, keys: &[String], age: Duration) {
    let completed = now_ms() - age.as_millis() as i64;
    let rows: Vec<String> = keys
        .iter()
        .map(|key| {
            format!(
                "('{consumer}', '{key}', 'completed', 1, 0, {completed}, {completed}, \
                 {completed}, {})",
                now_ms() - 1_000
            )
        })
        .collect();
    db.exec(&format!(
        "INSERT INTO {table} (consumer, message_key, status, attempts, claim_token, created_at, \
         claimed_at, completed_at, expires_at) VALUES {}",
        rows.join(", ")
    ))
    .await;
}

/// The redelivery window the inboxes are configured with.
fn window() -> RedeliveryWindow {
    RedeliveryWindow::new(5, Duration::from_secs(1_800))
}

async fn inbox(db: &TestDb, table: &str) -> Inbox {
    Inbox::builder(db.db.clone())
        .table(table)
        .retention(RetentionPolicy::default().with_batch_size(100))
        .redelivery_window(window())
        .build()
        .await
        .unwrap()
}

fn summary_of<'a>(all: &'a [DuplicateSummary], consumer: &str) -> &'a DuplicateSummary {
    all.iter()
        .find(|summary| summary.consumer == consumer)
        .unwrap_or_else(|| panic!("no summary of {consumer} in {all:?}"))
}

async fn process(inbox: &Inbox, handler: &Recorder, key: &str) -> bool {
    let outcome = inbox
        .process(handler, Msg::new(key, "x"), &Metadata::default())
        .await
        .unwrap();
    !outcome.is_duplicate()
}

async fn copies_after_their_record_expired_or_was_deleted_are_late(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let table = db.table("inbox");
    let (first, second) = (inbox(&db, &table).await, inbox(&db, &table).await);
    let effects = db.effects_table().await;
    let consumer = unique("late");
    let handler = Recorder::new(&db, &effects, &consumer);
    let deleted: Vec<String> = (0..250).map(|i| format!("gone-{i}")).collect();
    seed_expired(&db, &table, &consumer, &deleted, Duration::from_secs(3_600)).await;
    let report = first.cleaner().run_once().await.unwrap();
    assert_eq!(report.deleted, 250);
    seed_expired(
        &db,
        &table,
        &consumer,
        &["stale".to_owned()],
        Duration::from_secs(90),
    )
    .await;

    // Processed again, each: the inbox cannot tell them from new messages, but counts them.
    assert!(process(&first, &handler, "gone-5").await);
    assert!(process(&first, &handler, "stale").await);
    // The other process learns of the deletions at its cleaner task's next look.
    second.cleaner().run_once().await.unwrap();
    assert!(process(&second, &handler, "gone-6").await);
    // A retry of the same late copy is not counted again, and new keys are not late.
    let again = inbox(&db, &table).await;
    assert!(
        !process(&again, &handler, "gone-6").await,
        "a duplicate now"
    );
    for i in 0..200 {
        assert!(process(&first, &handler, &format!("new-{i}")).await);
    }
    for inbox in [&first, &second, &again] {
        inbox.cleaner().run_once().await.unwrap();
    }

    let all = first.duplicate_summaries().await.unwrap();
    let summary = summary_of(&all, &consumer);
    assert_eq!(summary.late, 3, "{summary:?}");
    assert_eq!(
        summary.late_deleted, 2,
        "gone-5 and gone-6 by the digest: {summary:?}"
    );
    // Next to none, from a filter of 250 keys.
    assert!(summary.expected_false_alarms < 1e-6, "{summary:?}");
    // Its age known for the expired record, at least its age for the deleted ones.
    let stale = summary.late_expired_max_age.expect("an age");
    assert!((89..150).contains(&stale.as_secs()), "{summary:?}");
    let gone = summary.late_deleted_max_age.expect("an age");
    assert!((3_599..3_700).contains(&gone.as_secs()), "{summary:?}");
    assert_eq!(summary.duplicates, 1, "{summary:?}");
    assert_eq!(db.count(&effects, "1=1").await, 203);
}

async fn duplicates_are_summed_across_processes(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let table = db.table("inbox");
    let (first, second) = (inbox(&db, &table).await, inbox(&db, &table).await);
    let effects = db.effects_table().await;
    let consumer = unique("summed");
    let handler = Recorder::new(&db, &effects, &consumer);
    assert!(process(&first, &handler, "a").await);
    assert!(process(&first, &handler, "b").await);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert!(!process(&first, &handler, "a").await);
    assert!(!process(&second, &handler, "a").await);
    assert!(!process(&second, &handler, "b").await);
    first.cleaner().run_once().await.unwrap();
    second.cleaner().run_once().await.unwrap();
    // A process's later counts replace its row, they do not add a second one.
    assert!(!process(&first, &handler, "b").await);
    first.cleaner().run_once().await.unwrap();

    let all = second.duplicate_summaries().await.unwrap();
    let summary = summary_of(&all, &consumer);
    assert_eq!(summary.duplicates, 4, "{summary:?}");
    assert_eq!(summary.late, 0);
    // Between one second and a minute old, every one.
    assert_eq!(summary.ages[1], 4, "{summary:?}");
    assert!(summary.max_age >= Duration::from_secs(1));
    assert_eq!(summary.age_below(0.99), Some(Duration::from_secs(60)));
    assert!(summary.since.is_some() && summary.updated >= summary.since);
    assert_eq!(summary.redelivery_window, Some(window().duration()));
    let stats = first.stats(Some(&consumer)).await.unwrap();
    let retention = stats[0].retention.expect("completed records");
    assert_eq!(retention, RetentionPolicy::default().default_retention());
}

/// Three late copies caught by a digest of three deleted keys: the false alarms it was expected
/// to give over every key it checked are next to none, as its filters' actual fill says (not
/// the rate of full filters).
async fn a_nearly_empty_digest_expects_next_to_no_false_alarms(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let table = db.table("inbox");
    let inbox = inbox(&db, &table).await;
    let effects = db.effects_table().await;
    let consumer = unique("charged");
    let handler = Recorder::new(&db, &effects, &consumer);
    let charged: Vec<String> = (0..3).map(|i| format!("order-{i}")).collect();
    let eight_days = Duration::from_secs(8 * 86_400);
    seed_expired(&db, &table, &consumer, &charged, eight_days).await;
    assert_eq!(inbox.cleaner().run_once().await.unwrap().deleted, 3);
    for key in &charged {
        assert!(process(&inbox, &handler, key).await, "charged again");
    }
    for i in 0..200 {
        assert!(process(&inbox, &handler, &format!("fresh-{i}")).await);
    }
    inbox.cleaner().run_once().await.unwrap();

    let all = inbox.duplicate_summaries().await.unwrap();
    let summary = summary_of(&all, &consumer);
    assert_eq!((summary.late, summary.late_deleted), (3, 3), "{summary:?}");
    assert!(summary.expected_false_alarms < 1e-6, "{summary:?}");
}

/// However many times a consumer's processes start, its duplicates' summaries take one row a
/// day, each start's counts added to it.
async fn summaries_stay_a_row_per_consumer_and_day_across_process_starts(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let table = db.table("inbox");
    let effects = db.effects_table().await;
    let consumer = unique("restarted");
    let handler = Recorder::new(&db, &effects, &consumer);
    assert!(process(&inbox(&db, &table).await, &handler, "a").await);
    for _ in 0..5 {
        let started = inbox(&db, &table).await;
        assert!(!process(&started, &handler, "a").await);
        started.cleaner().run_once().await.unwrap();
    }
    let summaries = format!("{table}_dup_daily");
    let rows = db
        .count(&summaries, &format!("consumer = '{consumer}'"))
        .await;
    assert_eq!(rows, 1, "rows of {consumer} in {summaries}");
    let all = inbox(&db, &table)
        .await
        .duplicate_summaries()
        .await
        .unwrap();
    assert_eq!(summary_of(&all, &consumer).duplicates, 5);
}

/// A cleaner run that deletes a record of each of twenty consumers writes at most 4 KiB of
/// digest per key deleted, whatever the size of each consumer's filters.
async fn a_cleaner_run_writes_the_digest_in_proportion_to_its_deletions(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let table = db.table("inbox");
    let inbox = inbox(&db, &table).await;
    let consumers: Vec<String> = (0..20).map(|i| unique(&format!("many{i}"))).collect();
    for consumer in &consumers {
        let keys = ["gone".to_owned()];
        seed_expired(&db, &table, consumer, &keys, Duration::from_secs(3_600)).await;
    }
    assert_eq!(inbox.cleaner().run_once().await.unwrap().deleted, 20);
    let integer = if backend == Backend::MySql {
        "SIGNED"
    } else {
        "BIGINT"
    };
    let sql = format!("SELECT CAST(LENGTH(bits) AS {integer}) FROM {table}_key_digest");
    let statement = Statement::from_string(db.db.get_database_backend(), sql);
    let rows = db.db.query_all_raw(statement).await.unwrap();
    let written: i64 = (rows.iter())
        .map(|row| row.try_get_by_index::<i64>(0).unwrap())
        .sum();
    assert!(
        written <= 20 * 4_096,
        "{written} bytes of digest for 20 keys"
    );
}

/// A consumer's filter none of whose pieces was written for three retentions is dropped by the
/// next cleaner run that deletes, and its keys no longer recognised; others stay.
async fn filters_unwritten_for_three_retentions_are_dropped(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let table = db.table("inbox");
    let cleaning = inbox(&db, &table).await;
    let effects = db.effects_table().await;
    let (old, recent) = (unique("old"), unique("recent"));
    let hour = Duration::from_secs(3_600);
    let keys: Vec<String> = (0..300).map(|i| format!("gone-{i}")).collect();
    seed_expired(&db, &table, &old, &keys, hour).await;
    seed_expired(&db, &table, &recent, &keys, hour).await;
    assert_eq!(cleaning.cleaner().run_once().await.unwrap().deleted, 600);
    let digest = format!("{table}_key_digest");
    let three_weeks_ago = now_ms() - 22 * 86_400_000;
    db.exec(&format!(
        "UPDATE {digest} SET updated_ms = {three_weeks_ago} WHERE consumer = '{old}'"
    ))
    .await;
    seed_expired(&db, &table, &recent, &["later".to_owned()], hour).await;
    assert_eq!(cleaning.cleaner().run_once().await.unwrap().deleted, 1);
    assert_eq!(db.count(&digest, &format!("consumer = '{old}'")).await, 0);
    assert!(db.count(&digest, &format!("consumer = '{recent}'")).await > 0);
    // A process that starts now knows only the recent consumer's deletions.
    let started = inbox(&db, &table).await;
    started.cleaner().run_once().await.unwrap();
    assert!(process(&started, &Recorder::new(&db, &effects, &old), "gone-1").await);
    assert!(process(&started, &Recorder::new(&db, &effects, &recent), "gone-1").await);
    started.cleaner().run_once().await.unwrap();
    let all = started.duplicate_summaries().await.unwrap();
    assert_eq!(summary_of(&all, &old).late, 0);
    assert_eq!(summary_of(&all, &recent).late_deleted, 1);
}

/// The counter of late duplicates is scraped at zero for a consumer as soon as its handler is
/// checked at start, or its first message processed: Prometheus' `increase()` then sees the
/// first late duplicate.
#[tokio::test]
async fn the_late_duplicates_counter_is_scraped_at_zero_from_the_start() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let scrape = recorder.handle();
    // The test's runtime runs on this thread only.
    let _local = metrics::set_default_local_recorder(&recorder);
    let db = TestDb::connect(Backend::Sqlite).await;
    let table = db.table("inbox");
    let inbox = inbox(&db, &table).await;
    let effects = db.effects_table().await;
    let (started, direct) = (unique("started"), unique("direct"));
    let series = |consumer: &str| format!("idem_late_duplicates_total{{consumer=\"{consumer}\"}}");

    let handler = Recorder::new(&db, &effects, &started);
    inbox.check_handler(&handler).unwrap();
    let at_start = scrape.render();
    assert!(
        at_start.contains(&format!("{} 0", series(&started))),
        "{at_start}"
    );
    let keys = ["again".to_owned()];
    seed_expired(&db, &table, &started, &keys, Duration::from_secs(90)).await;
    assert!(process(&inbox, &handler, "again").await);
    let after = scrape.render();
    assert!(
        after.contains(&format!("{} 1", series(&started))),
        "{after}"
    );

    let handler = Recorder::new(&db, &effects, &direct);
    assert!(process(&inbox, &handler, "first").await);
    let first = scrape.render();
    assert!(first.contains(&format!("{} 0", series(&direct))), "{first}");
}

//! The inbox at its edges, on each backend: transactions a handler broke, outputs the database
//! refuses, messages whose type evolved, replicas starting together, handlers that hold a key
//! for long, corrupt records, outages inside the handler, same-named tables in two schemas, and
//! two-phase handlers that outlive their lease, lose their claim, or complete while another
//! worker is taking them over.
//!
//! Run: `cargo test -p idem-tests --test edges` with PostgreSQL and MariaDB up (see README).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_runtime::delivery::{Backoff, Decision, DeliveryPolicy, Retry, RetryMemory};
use idem_runtime::sea_orm::sea_query::{Alias, Expr, ExprTrait, Query};
use idem_runtime::sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr, TransactionTrait,
};
use idem_runtime::{
    Context, Error, Fingerprint, FingerprintError, Handler, Inbox, InboxBuilder, KeyError,
    MessageKey, Metadata, Outbox, Outcome, RetentionPolicy, Settle, Status, idempotent,
};
use idem_tests::proxy::behind_proxy;
use idem_tests::{Backend, CutWorker, Msg, Recorder, TestDb, inbox_key, on_each_backend, unique};
use idem_tests::{inbox_and_effects as setup, inbox_and_effects_with as setup_with};
use serde::{Deserialize, Serialize};

on_each_backend!(
    a_handler_that_swallows_a_failed_statement_is_never_reported_processed,
    a_transaction_the_handler_rolled_back_is_not_reported_processed,
    two_phase_output_the_database_refuses_completes_the_record_without_it,
    redeliveries_of_an_older_message_version_are_duplicates,
    replicas_starting_together_all_start,
    a_copy_waits_a_bounded_time_for_a_long_handler_then_is_requeued_uncounted,
    corrupt_records_and_refused_statements_have_their_own_errors,
    leases_and_retention_set_at_run_time_override_the_handlers,
    a_two_phase_handler_that_outlives_its_lease_keeps_its_claim,
);

/// Faults of the database servers': an outage, renewals that no longer reach them.
mod servers {
    use super::*;
    on_each_backend!([postgres, mysql]:
        an_outage_inside_the_handler_is_an_outage,
        a_handler_whose_renewals_are_cut_sees_the_loss_and_one_worker_takes_over,
    );
}

fn meta() -> Metadata {
    Metadata::default()
}

/// A transactional handler with a `()` output that writes its effect, then runs `then` and
/// carries on whatever it gave: a statement expected to fail, or a `ROLLBACK` standing for a
/// deadlock the database rolled back and the handler swallowed.
#[derive(Debug)]
struct CarriesOn {
    effects: String,
    then: &'static str,
}

impl Handler for CarriesOn {
    type Message = Msg;
    type Output = ();
    type Error = DbErr;

    fn consumer(&self) -> &str {
        "carries-on"
    }
    fn key(&self, msg: &Msg, _: &Metadata) -> Result<MessageKey, KeyError> {
        MessageKey::new(msg.id.as_str())
    }
    fn fingerprint(
        &self,
        msg: &Msg,
        meta: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        meta.content_fingerprint(msg).map(Some)
    }
    async fn handle(&self, cx: &Context<'_>, msg: Msg) -> Result<(), DbErr> {
        let tx = cx.transaction().expect("transactional");
        idem_tests::db::insert_effect(tx, &self.effects, "carries-on", &msg.id, "x").await?;
        let _ignored = tx.execute_unprepared(self.then).await;
        Ok(())
    }
}

async fn a_handler_that_swallows_a_failed_statement_is_never_reported_processed(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let handler = CarriesOn {
        effects: effects.clone(),
        then: "INSERT INTO idem_no_such_table VALUES (1)",
    };
    let result = inbox.process(&handler, Msg::new("o-1", "a"), &meta()).await;
    let key = inbox_key("carries-on", "o-1");
    if backend == Backend::Postgres {
        // PostgreSQL aborted the transaction at the failed statement: nothing can commit.
        let error = result.unwrap_err();
        assert!(
            matches!(error, Error::TransactionAborted { .. }),
            "{error:?}"
        );
        assert!(error.to_string().contains("savepoint"), "{error}");
        assert_eq!(error.settle(), Settle::Requeue);
        assert!(error.counts_as_attempt());
        assert_eq!(inbox.lookup(&key).await.unwrap(), None);
        assert_eq!(db.count(&effects, "1=1").await, 0);
    } else {
        // Elsewhere a failed statement leaves the transaction usable.
        assert_eq!(result.unwrap(), Outcome::Processed(()));
        assert_eq!(
            inbox.lookup(&key).await.unwrap().unwrap().status,
            Status::Completed
        );
        assert_eq!(db.count(&effects, "1=1").await, 1);
    }
}

async fn a_transaction_the_handler_rolled_back_is_not_reported_processed(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let handler = CarriesOn {
        effects: effects.clone(),
        then: "ROLLBACK",
    };
    let error = inbox
        .process(&handler, Msg::new("o-1", "a"), &meta())
        .await
        .unwrap_err();
    assert!(
        matches!(error, Error::TransactionAborted { .. }),
        "{error:?}"
    );
    assert_eq!(error.code(), "transaction-aborted");
    // The claim went with the rolled-back transaction: a redelivery runs the handler again.
    assert_eq!(
        inbox.lookup(&inbox_key("carries-on", "o-1")).await.unwrap(),
        None
    );
    assert_eq!(db.count(&effects, "1=1").await, 0);
}

async fn two_phase_output_the_database_refuses_completes_the_record_without_it(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let table = inbox.table().as_str().to_owned();
    // The database refuses outputs of 100 characters or more, as a packet limit would.
    db.refuse_outputs_from(&table, 100).await;
    let lease = Duration::from_millis(300);
    let handler = Recorder::new(&db, &effects, "mailer").two_phase(lease);
    let msg = Msg::new("mail-1", "x".repeat(200));

    let first = inbox
        .process(&handler, msg.clone(), &meta())
        .await
        .unwrap_err();
    assert!(matches!(first, Error::OutputNotStorable(_)), "{first:?}");
    match first.settle() {
        Settle::DeadLetter(reason) => assert_eq!(reason.code, "output-not-storable"),
        other => panic!("{other:?}"),
    }
    let record = inbox
        .lookup(&inbox_key("mailer", "mail-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.output, None);

    // Past the lease, a redelivery does not repeat the side effect: it is acknowledged.
    tokio::time::sleep(lease * 2).await;
    let again = inbox
        .process(&handler, msg.clone(), &meta())
        .await
        .unwrap_err();
    assert_eq!(again.settle(), Settle::Ack, "{again:?}");
    assert_eq!(db.count(&effects, "1=1").await, 1);

    // In transactional mode the refused output takes the handler's effects with it.
    let billing = Recorder::new(&db, &effects, "billing");
    let refused = inbox.process(&billing, msg, &meta()).await.unwrap_err();
    assert!(
        matches!(refused, Error::OutputNotStorable(_)),
        "{refused:?}"
    );
    assert_eq!(
        inbox.lookup(&inbox_key("billing", "mail-1")).await.unwrap(),
        None
    );
    assert_eq!(db.count(&effects, "consumer = 'billing'").await, 0);
}

#[derive(Debug, Serialize, Deserialize)]
struct OrderV1 {
    id: String,
    amount: i64,
}

/// The next version of [`OrderV1`]: two fields a serde user adds compatibly.
#[derive(Debug, Serialize, Deserialize)]
struct OrderV2 {
    id: String,
    amount: i64,
    #[serde(default)]
    priority: u8,
    #[serde(default)]
    note: Option<String>,
}

#[idempotent(key = order.id, consumer = "orders.evolving")]
async fn charge_v1(tx: &DatabaseTransaction, order: OrderV1) -> Result<i64, DbErr> {
    let _ = tx;
    Ok(order.amount)
}

#[idempotent(key = order.id, consumer = "orders.evolving")]
async fn charge_v2(tx: &DatabaseTransaction, order: OrderV2) -> Result<i64, DbErr> {
    let _ = tx;
    Ok(order.amount * 100 + i64::from(order.priority))
}

/// What a transport gives the inbox for `payload`: the payload's fingerprint.
fn received(payload: &[u8]) -> Metadata {
    Metadata {
        payload_fingerprint: Some(Fingerprint::of_json(payload).unwrap()),
        ..Metadata::default()
    }
}

async fn redeliveries_of_an_older_message_version_are_duplicates(backend: Backend) {
    let (_db, inbox, _effects) = setup(backend).await;
    let payload = br#"{"id":"o-1","amount":5}"#;
    let v1: OrderV1 = serde_json::from_slice(payload).unwrap();
    let first = inbox
        .process(&charge_v1_handler(), v1, &received(payload))
        .await
        .unwrap();
    assert_eq!(first, Outcome::Processed(5));

    // Deployed: version 2 of the type reads the same message with its defaults.
    let v2: OrderV2 = serde_json::from_slice(payload).unwrap();
    let again = inbox
        .process(&charge_v2_handler(), v2, &received(payload))
        .await
        .unwrap();
    assert_eq!(again, Outcome::Duplicate(5));

    // A newer producer that sends the new field as null still sends the same message...
    let explicit = br#"{"note":null,"amount":5,"id":"o-1"}"#;
    let v2: OrderV2 = serde_json::from_slice(explicit).unwrap();
    let same = inbox
        .process(&charge_v2_handler(), v2, &received(explicit))
        .await
        .unwrap();
    assert_eq!(same, Outcome::Duplicate(5));

    // ...but a value in it, or a changed amount, is other content.
    for changed in [
        &br#"{"id":"o-1","amount":5,"priority":3}"#[..],
        br#"{"id":"o-1","amount":6}"#,
    ] {
        let v2: OrderV2 = serde_json::from_slice(changed).unwrap();
        let error = inbox
            .process(&charge_v2_handler(), v2, &received(changed))
            .await
            .unwrap_err();
        assert!(
            matches!(error, Error::FingerprintMismatch { .. }),
            "{error:?}"
        );
    }
}

async fn replicas_starting_together_all_start(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let table = db.table("inbox");
    let outbox_table = db.table("outbox");
    for create_table in [true, false] {
        let mut starts = Vec::new();
        for _ in 0..8 {
            let pool = db.another_pool(2).await;
            let (table, outbox_table) = (table.clone(), outbox_table.clone());
            starts.push(tokio::spawn(async move {
                let outbox = Outbox::builder(pool.clone())
                    .table(outbox_table)
                    .create_table(create_table)
                    .build()
                    .await?;
                Inbox::builder(pool)
                    .table(table)
                    .create_table(create_table)
                    .outbox(outbox)
                    .build()
                    .await
                    .map(|_| ())
            }));
        }
        for start in starts {
            start.await.unwrap().unwrap_or_else(|error| {
                panic!("a replica failed to start (create_table({create_table})): {error:?}")
            });
        }
    }
}

async fn a_copy_waits_a_bounded_time_for_a_long_handler_then_is_requeued_uncounted(
    backend: Backend,
) {
    let claim_wait = Duration::from_secs(1);
    let (db, inbox, effects) = setup_with(backend, |builder| builder.claim_wait(claim_wait)).await;
    // Longer than the claim wait, and than SQLite's busy timeout (5 s), which bounds the wait on
    // that backend.
    let handler_time = if backend == Backend::Sqlite {
        Duration::from_secs(7)
    } else {
        Duration::from_secs(4)
    };
    let slow = Recorder::new(&db, &effects, "billing").slow(handler_time);
    let msg = Msg::new("o-1", "charge");
    let first = {
        let (inbox, slow, msg) = (inbox.clone(), slow.clone(), msg.clone());
        tokio::spawn(async move { inbox.process(&slow, msg, &Metadata::default()).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = Instant::now();
    let copy = inbox.process(&slow, msg.clone(), &meta()).await;
    let waited = started.elapsed();
    let error = copy.expect_err("the copy must not wait for the handler");
    assert_eq!(error.settle(), Settle::Requeue, "{error:?}");
    assert!(!error.counts_as_attempt(), "{error:?} counted");
    if backend != Backend::Sqlite {
        assert!(
            matches!(error, Error::InProgressElsewhere { .. }),
            "{error:?}"
        );
    }
    assert!(
        waited < handler_time - Duration::from_millis(1200),
        "the copy waited {waited:?}"
    );

    assert_eq!(
        first.await.unwrap().unwrap(),
        Outcome::Processed("run:charge".into())
    );
    let later = inbox.process(&slow, msg, &meta()).await.unwrap();
    assert!(later.is_duplicate());
    assert_eq!(db.count(&effects, "1=1").await, 1);
}

async fn corrupt_records_and_refused_statements_have_their_own_errors(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let table = inbox.table().as_str().to_owned();
    let handler = Recorder::new(&db, &effects, "billing");
    inbox
        .process(&handler, Msg::new("o-1", "a"), &meta())
        .await
        .unwrap();

    // Someone changed the record by hand: dead-lettered as corrupt, never requeued in a loop.
    db.exec(&format!(
        "UPDATE {table} SET status = 'bogus' WHERE message_key = 'o-1'"
    ))
    .await;
    let corrupt = inbox
        .process(&handler, Msg::new("o-1", "a"), &meta())
        .await
        .unwrap_err();
    assert!(
        matches!(corrupt, Error::CorruptRecord { .. }),
        "{corrupt:?}"
    );
    match corrupt.settle() {
        Settle::DeadLetter(reason) => assert_eq!(reason.code, "corrupt-record"),
        other => panic!("{other:?}"),
    }

    // A stored fingerprint of the wrong length, met by other content under the key (MySQL's
    // `BINARY(32)` pads whatever it is given to 32 bytes).
    if backend != Backend::MySql {
        let update = Query::update()
            .table(Alias::new(table.as_str()))
            .value(Alias::new("status"), "completed")
            .value(Alias::new("fingerprint"), vec![1u8, 2, 3])
            .and_where(Expr::col(Alias::new("message_key")).eq("o-1"))
            .to_owned();
        db.db.execute(&update).await.unwrap();
        let corrupt = inbox
            .process(&handler, Msg::new("o-1", "b"), &meta())
            .await
            .unwrap_err();
        assert_eq!(corrupt.code(), "corrupt-record", "{corrupt:?}");
    }

    // The database refuses the claim itself: its own code, a counted requeue.
    match backend {
        Backend::Sqlite => {
            db.exec(&format!(
                "CREATE TRIGGER {table}_refuse BEFORE INSERT ON {table} \
                 WHEN NEW.message_key = 'refused' BEGIN SELECT RAISE(ABORT, 'refused'); END"
            ))
            .await
        }
        _ => {
            db.exec(&format!(
                "ALTER TABLE {table} ADD CONSTRAINT {table}_refuse CHECK (message_key <> 'refused')"
            ))
            .await
        }
    }
    let refused = inbox
        .process(&handler, Msg::new("refused", "a"), &meta())
        .await
        .unwrap_err();
    assert!(matches!(refused, Error::Database(_)), "{refused:?}");
    assert_eq!(refused.code(), "database-error");
    assert_eq!(refused.settle(), Settle::Requeue);
    assert!(refused.counts_as_attempt() && !refused.is_store_unavailable());
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

/// Two inboxes with one table name in two PostgreSQL schemas clean at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_cleaners_of_same_named_tables_in_two_schemas_do_not_share_a_lock() {
    let admin = TestDb::connect(Backend::Postgres).await;
    let table = unique("inbox");
    let schemas = [unique("schema_a"), unique("schema_b")];
    let mut cleaners = Vec::new();
    let mut pools = Vec::new();
    for schema in &schemas {
        admin.exec(&format!("CREATE SCHEMA {schema}")).await;
        let url = format!(
            "{}?options=-c%20search_path%3D{schema}",
            Backend::Postgres.url("")
        );
        let db = TestDb::connect_url(Backend::Postgres, url, 4).await;
        let inbox = Inbox::builder(db.db.clone())
            .table(table.clone())
            .retention(
                RetentionPolicy::default()
                    .with_batch_size(10)
                    .with_pause_between_batches(Duration::from_millis(50)),
            )
            .build()
            .await
            .unwrap();
        db.exec(&format!(
            "INSERT INTO {table} (consumer, message_key, status, attempts, claim_token, \
             created_at, claimed_at, completed_at, expires_at) \
             SELECT 'c', 'k-' || n, 'completed', 1, 0, 1, 1, 1, 1 FROM generate_series(1, 100) n"
        ))
        .await;
        cleaners.push(inbox.cleaner());
        pools.push(db);
    }
    let first = {
        let cleaner = cleaners[0].clone();
        tokio::spawn(async move { cleaner.run_once().await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = cleaners[1].run_once().await.unwrap();
    let first = first.await.unwrap().unwrap();
    for schema in &schemas {
        admin.exec(&format!("DROP SCHEMA {schema} CASCADE")).await;
    }
    assert!(!first.skipped && !second.skipped, "{first:?} {second:?}");
    assert_eq!((first.deleted, second.deleted), (100, 100));
}

async fn leases_and_retention_set_at_run_time_override_the_handlers(backend: Backend) {
    let hour = Duration::from_secs(3600);
    let configure = |builder: InboxBuilder| {
        builder
            .lease("mailer", Duration::from_millis(300))
            .retention(RetentionPolicy::default().with_consumer("mailer", 2 * hour))
    };
    let (db, inbox, effects) = setup_with(backend, configure).await;
    // The handler says an hour for both; the configuration says otherwise. The stale worker's
    // renewals are cut once it has claimed (and renewed) the message, so its claim lasts one
    // configured lease past its last renewal.
    let stale_worker = CutWorker::new(&db, inbox.table().as_str(), configure).await;
    let mut stale = Recorder::new(&db, &effects, "mailer")
        .two_phase(hour)
        .slow(Duration::from_millis(900));
    stale.retention = Some(hour);
    let fresh = stale.clone().slow(Duration::ZERO).tagged("fresh");
    let msg = Msg::new("mail-1", "hello");
    let stale_run = {
        let (inbox, stale, msg) = (stale_worker.inbox.clone(), stale.clone(), msg.clone());
        tokio::spawn(async move { inbox.process(&stale, msg, &Metadata::default()).await })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    stale_worker.cut().await;
    tokio::time::sleep(Duration::from_millis(450)).await;
    // Past the configured lease, not the handler's hour: taken over.
    let taken = inbox.process(&fresh, msg, &meta()).await.unwrap();
    assert_eq!(taken, Outcome::Processed("fresh:hello".into()));
    stale_worker.restore().await;
    assert!(matches!(
        stale_run.await.unwrap(),
        Err(Error::ClaimLost { .. })
    ));
    let record = inbox
        .lookup(&inbox_key("mailer", "mail-1"))
        .await
        .unwrap()
        .unwrap();
    let kept = record
        .expires_at
        .duration_since(record.completed_at.unwrap())
        .unwrap();
    assert!(
        kept > hour + Duration::from_secs(3000) && kept <= 2 * hour + Duration::from_secs(1),
        "kept for {kept:?}"
    );
}

async fn a_two_phase_handler_that_outlives_its_lease_keeps_its_claim(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let lease = Duration::from_millis(300);
    let slow = Recorder::new(&db, &effects, "mailer")
        .two_phase(lease)
        .slow(lease * 4);
    let msg = Msg::new("mail-1", "hello");
    let started = Instant::now();
    let first = {
        let (inbox, slow, msg) = (inbox.clone(), slow.clone(), msg.clone());
        tokio::spawn(async move { inbox.process(&slow, msg, &Metadata::default()).await })
    };
    // A second worker, with a pool of its own as another process would have, tries all along:
    // within the first lease and until three leases have passed, the claim is the first
    // worker's.
    let second = Inbox::builder(db.another_pool(4).await)
        .table(inbox.table().as_str())
        .create_table(false)
        .build()
        .await
        .unwrap();
    let other = slow.clone().slow(Duration::ZERO).tagged("second");
    let mut tried_at = Vec::new();
    loop {
        tokio::time::sleep(lease / 2).await;
        if started.elapsed() > lease * 3 {
            break;
        }
        tried_at.push(started.elapsed());
        let busy = second
            .process(&other, msg.clone(), &meta())
            .await
            .unwrap_err();
        assert!(
            matches!(busy, Error::InProgressElsewhere { .. }),
            "{busy:?}"
        );
    }
    assert!(
        tried_at.first() < Some(&lease) && tried_at.last() > Some(&(lease * 2)),
        "tried at {tried_at:?}"
    );
    assert_eq!(
        first.await.unwrap().unwrap(),
        Outcome::Processed("run:hello".into())
    );
    let again = second.process(&other, msg, &meta()).await.unwrap();
    assert_eq!(again, Outcome::Duplicate("run:hello".into()));
    let record = inbox
        .lookup(&inbox_key("mailer", "mail-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.attempts, 1);
    assert_eq!(slow.attempts(), vec![1]);
    assert_eq!(db.count(&effects, "1=1").await, 1);
}

/// A two-phase handler that checks its claim before its external call (an effect row written on
/// a connection of its own, which stays up). Its first attempt waits for the claim to be lost,
/// then for the test to let it go on.
#[derive(Debug, Clone)]
struct Careful {
    db: DatabaseConnection,
    effects: String,
    lease: Duration,
    attempts: Arc<Mutex<Vec<u32>>>,
    /// Whether the first attempt saw its claim lost, through both of the context's signals.
    saw_loss: Arc<AtomicBool>,
    go_on: Arc<tokio::sync::Notify>,
}

impl Handler for Careful {
    type Message = Msg;
    type Output = String;
    type Error = DbErr;

    fn consumer(&self) -> &str {
        "careful"
    }
    fn key(&self, msg: &Msg, _: &Metadata) -> Result<MessageKey, KeyError> {
        MessageKey::new(msg.id.as_str())
    }
    fn fingerprint(
        &self,
        msg: &Msg,
        meta: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        meta.content_fingerprint(msg).map(Some)
    }
    fn mode(&self) -> idem_runtime::Mode {
        idem_runtime::Mode::TwoPhase { lease: self.lease }
    }
    async fn handle(&self, cx: &Context<'_>, msg: Msg) -> Result<String, DbErr> {
        self.attempts.lock().unwrap().push(cx.attempt());
        if cx.attempt() == 1 {
            assert!(!cx.claim_lost());
            // A long call that gives up when the claim is lost.
            let lost = tokio::time::timeout(Duration::from_secs(30), cx.lost()).await;
            self.saw_loss
                .store(lost.is_ok() && cx.claim_lost(), Ordering::SeqCst);
            self.go_on.notified().await;
        }
        // Before the external call: another worker may have the message now.
        if cx.claim_lost() {
            return Ok("abandoned".to_owned());
        }
        idem_tests::db::insert_effect(&self.db, &self.effects, "careful", &msg.id, &msg.body)
            .await?;
        Ok("done".to_owned())
    }
}

async fn a_handler_whose_renewals_are_cut_sees_the_loss_and_one_worker_takes_over(
    backend: Backend,
) {
    let (db, inbox, effects) = setup(backend).await;
    let lease = Duration::from_millis(600);
    let handler = Careful {
        db: db.db.clone(),
        effects: effects.clone(),
        lease,
        attempts: Arc::default(),
        saw_loss: Arc::default(),
        go_on: Arc::default(),
    };
    // The first worker reaches the database through a proxy; the second directly.
    let first_worker = CutWorker::new(&db, inbox.table().as_str(), |b| b).await;
    let msg = Msg::new("mail-1", "hello");
    let first = {
        let (inbox, handler, msg) = (first_worker.inbox.clone(), handler.clone(), msg.clone());
        tokio::spawn(async move { inbox.process(&handler, msg, &Metadata::default()).await })
    };
    // Claimed and renewed once; then its renewals no longer reach the database.
    tokio::time::sleep(Duration::from_millis(300)).await;
    first_worker.cut().await;
    let cut = Instant::now();

    let mut busy = 0;
    let taken = loop {
        match inbox.process(&handler, msg.clone(), &meta()).await {
            Err(Error::InProgressElsewhere { .. }) => {
                busy += 1;
                assert!(cut.elapsed() < Duration::from_secs(10), "never taken over");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => break other,
        }
    };
    assert_eq!(taken.unwrap(), Outcome::Processed("done".into()));
    assert!(busy > 0, "taken over before the lease ran out");
    assert!(
        cut.elapsed() >= lease / 2,
        "taken over {:?} after the cut",
        cut.elapsed()
    );
    // The first worker knew before the second could take over.
    assert!(
        handler.saw_loss.load(Ordering::SeqCst),
        "the loss went unseen"
    );
    assert_eq!(*handler.attempts.lock().unwrap(), vec![1, 2]);

    // The first worker's handler returns, its database back: its completion is refused.
    first_worker.restore().await;
    handler.go_on.notify_one();
    match first.await.unwrap() {
        Err(Error::ClaimLost { .. }) => {}
        Err(error) if error.is_store_unavailable() => {}
        other => panic!("the first worker's completion went through: {other:?}"),
    }
    let record = inbox
        .lookup(&inbox_key("careful", "mail-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.attempts, 2);
    assert_eq!(record.output.as_deref(), Some("\"done\""));
    let again = inbox.process(&handler, msg, &meta()).await.unwrap();
    assert_eq!(again, Outcome::Duplicate("done".into()));
    // One external call: the first worker gave its up on seeing the loss.
    assert_eq!(db.count(&effects, "1=1").await, 1);
}

/// A two-phase handler whose first attempt waits for the test before its external call (an
/// effect row written on a connection of its own).
#[derive(Debug, Clone)]
struct Gated {
    db: DatabaseConnection,
    effects: String,
    attempts: Arc<Mutex<Vec<u32>>>,
    go_on: Arc<tokio::sync::Notify>,
}

impl Handler for Gated {
    type Message = Msg;
    type Output = String;
    type Error = DbErr;

    fn consumer(&self) -> &str {
        "gated"
    }
    fn key(&self, msg: &Msg, _: &Metadata) -> Result<MessageKey, KeyError> {
        MessageKey::new(msg.id.as_str())
    }
    fn fingerprint(
        &self,
        msg: &Msg,
        meta: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        meta.content_fingerprint(msg).map(Some)
    }
    fn mode(&self) -> idem_runtime::Mode {
        idem_runtime::Mode::TwoPhase {
            lease: Duration::from_millis(600),
        }
    }
    async fn handle(&self, cx: &Context<'_>, msg: Msg) -> Result<String, DbErr> {
        self.attempts.lock().unwrap().push(cx.attempt());
        if cx.attempt() == 1 {
            self.go_on.notified().await;
        }
        idem_tests::db::insert_effect(&self.db, &self.effects, "gated", &msg.id, &msg.body).await?;
        Ok("done".to_owned())
    }
}

/// Waits until a statement of the test's database whose text holds `text` waits for a lock
/// (PostgreSQL).
async fn waits_for_a_lock(db: &TestDb, text: &str) {
    let filter = format!(
        "wait_event_type = 'Lock' AND query LIKE '%{}%'",
        text.replace('\'', "''")
    );
    let started = Instant::now();
    while db.count("pg_stat_activity", &filter).await == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no statement with {text:?} waits for a lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A worker whose lease ran out completes; a second worker, which read the record before that
/// completion and found the lease run out, must not reopen the completed record and run the
/// handler again. PostgreSQL only: its claim reads the record without a lock, so the takeover's
/// `UPDATE` is what meets the completion (MySQL/MariaDB read it with a shared lock, which the
/// completion waits for; SQLite has one writer).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_takeover_never_reopens_a_record_completed_while_it_waited() {
    let (db, inbox, effects) = setup(Backend::Postgres).await;
    let handler = Gated {
        db: db.db.clone(),
        effects: effects.clone(),
        attempts: Arc::default(),
        go_on: Arc::default(),
    };
    let msg = Msg::new("gated-1", "hello");
    let first = {
        let (inbox, handler, msg) = (inbox.clone(), handler.clone(), msg.clone());
        tokio::spawn(async move { inbox.process(&handler, msg, &Metadata::default()).await })
    };
    while handler.attempts.lock().unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The record locked elsewhere: the first worker's renewals wait, and its lease runs out.
    // `FOR UPDATE` rather than an update: a claim's insert waits for a transaction that updated
    // the row it conflicts with, not for one that only locked it.
    let locker = db.db.begin().await.unwrap();
    locker
        .execute_unprepared(&format!(
            "SELECT 1 FROM {} WHERE consumer = 'gated' AND message_key = 'gated-1' FOR UPDATE",
            inbox.table().as_str()
        ))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // The first worker's handler returns: its completion waits for the lock.
    handler.go_on.notify_one();
    waits_for_a_lock(&db, "status = 'completed'").await;
    // A second worker reads the record, finds the lease run out, and tries to take the message
    // over: its takeover waits for the lock, behind the completion.
    let second = {
        let (inbox, handler, msg) = (inbox.clone(), handler.clone(), msg.clone());
        tokio::spawn(async move { inbox.process(&handler, msg, &Metadata::default()).await })
    };
    waits_for_a_lock(&db, "SET status = $").await;
    locker.rollback().await.unwrap();

    let first = first.await.unwrap();
    let second = second.await.unwrap();
    assert_eq!(first.unwrap(), Outcome::Processed("done".into()));
    assert_eq!(second.unwrap(), Outcome::Duplicate("done".into()));
    assert_eq!(*handler.attempts.lock().unwrap(), vec![1]);
    assert_eq!(db.count(&effects, "1=1").await, 1);
    let record = inbox
        .lookup(&inbox_key("gated", "gated-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.output.as_deref(), Some("\"done\""));
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

/// A transactional handler that sets a statement timeout its transaction's completion then
/// runs into.
#[derive(Debug)]
struct Hasty {
    effects: String,
}

impl Handler for Hasty {
    type Message = Msg;
    type Output = String;
    type Error = DbErr;

    fn consumer(&self) -> &str {
        "hasty"
    }
    fn key(&self, msg: &Msg, _: &Metadata) -> Result<MessageKey, KeyError> {
        MessageKey::new(msg.id.as_str())
    }
    fn fingerprint(&self, _: &Msg, _: &Metadata) -> Result<Option<Fingerprint>, FingerprintError> {
        Ok(None)
    }
    async fn handle(&self, cx: &Context<'_>, msg: Msg) -> Result<String, DbErr> {
        let tx = cx.transaction().expect("transactional");
        idem_tests::db::insert_effect(tx, &self.effects, "hasty", &msg.id, "x").await?;
        tx.execute_unprepared("SET LOCAL statement_timeout = 50")
            .await?;
        Ok("a short output".to_owned())
    }
}

/// A completion the database gives up on for a reason of its own (here a statement timeout,
/// the record's update slowed by a trigger) is a failure of the attempt, retried: not an output
/// that cannot be stored, which would dead-letter the message. PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_completion_that_times_out_is_retried_not_dead_lettered() {
    let (db, inbox, effects) = setup(Backend::Postgres).await;
    let table = inbox.table().as_str().to_owned();
    let function = format!("{table}_slow");
    db.exec(&format!(
        "CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM pg_sleep(0.3); RETURN NEW; END $$"
    ))
    .await;
    db.exec(&format!(
        "CREATE TRIGGER {function} BEFORE UPDATE ON {table} FOR EACH ROW \
         EXECUTE FUNCTION {function}()"
    ))
    .await;
    let handler = Hasty {
        effects: effects.clone(),
    };
    let msg = Msg::new("hasty-1", "x");
    let error = inbox
        .process(&handler, msg.clone(), &meta())
        .await
        .unwrap_err();
    assert_eq!(error.code(), "database-error", "{error:?}");
    assert_eq!(error.settle(), Settle::Requeue);
    assert_eq!(db.count(&effects, "1=1").await, 0);
    db.exec(&format!("DROP TRIGGER {function} ON {table}"))
        .await;
    db.exec(&format!("DROP FUNCTION {function}()")).await;
    let processed = inbox.process(&handler, msg, &meta()).await.unwrap();
    assert_eq!(processed, Outcome::Processed("a short output".to_owned()));
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

/// A two-phase takeover that fails hands its claim on instead of deleting it: the next copy is
/// told it follows earlier attempts (a takeover, attempt 3), whose side effects may have
/// happened. Deleted, the record forgot them, and the next copy ran as a first attempt, without
/// reconciling.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_takeover_hands_its_claim_on_with_its_history() {
    let (db, inbox, effects) = setup(Backend::Postgres).await;
    let lease = Duration::from_millis(500);
    let msg = Msg::new("mail-1", "hello");
    // The first worker crashes mid-handler: its claim stays in progress until its lease ends.
    let crashed = Recorder::new(&db, &effects, "mailer")
        .two_phase(lease)
        .slow(Duration::from_secs(30));
    let run = {
        let (inbox, crashed, msg) = (inbox.clone(), crashed.clone(), msg.clone());
        tokio::spawn(async move { inbox.process(&crashed, msg, &Metadata::default()).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    run.abort();
    tokio::time::sleep(lease + Duration::from_millis(150)).await;
    // The takeover fails.
    let failing = Recorder::new(&db, &effects, "mailer").two_phase(lease);
    failing.fail_next(1);
    let error = inbox
        .process(&failing, msg.clone(), &meta())
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Handler { .. }), "{error:?}");
    assert_eq!(failing.attempts(), vec![2]);
    // The next copy knows it follows them.
    let next = Recorder::new(&db, &effects, "mailer").two_phase(lease);
    let outcome = inbox.process(&next, msg, &meta()).await.unwrap();
    assert!(!outcome.is_duplicate());
    assert_eq!(next.attempts(), vec![3]);
}

/// A two-phase handler's side effect done, the database lost for longer than a few quick tries
/// but less than the lease: the completion is tried until the database is back, and the record
/// completes. Giving up after the quick tries left the claim in progress, and a redelivery ran
/// the side effect again once the lease ran out. PostgreSQL through the tests' proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_two_phase_completion_outlasts_a_short_outage() {
    let (db, proxy) = behind_proxy(Backend::Postgres).await;
    let proxy = Arc::new(proxy);
    let inbox = Inbox::builder(db.db.clone())
        .table(db.table("inbox"))
        .build()
        .await
        .unwrap();
    let effects = db.effects_table().await;
    let cutter = Arc::clone(&proxy);
    let handler = Recorder::new(&db, &effects, "mailer")
        .two_phase(Duration::from_secs(30))
        .after_first_effect(move || {
            let proxy = Arc::clone(&cutter);
            async move {
                proxy.cut().await;
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    proxy.restore();
                });
            }
        });
    let outcome = inbox.process(&handler, Msg::new("m-1", "x"), &meta()).await;
    assert!(matches!(outcome, Ok(Outcome::Processed(_))), "{outcome:?}");
    let record = inbox
        .lookup(&inbox_key("mailer", "m-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, Status::Completed);
    assert_eq!(db.count(&effects, "1=1").await, 1);
}

/// A two-phase completion refused once for a reason of the database's own (a statement
/// cancelled, here by a trigger on its first run) is tried again, and the record completes with
/// its output: the output is not dropped, nor the message dead-lettered as one that cannot be
/// stored. PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_two_phase_completion_refused_once_is_tried_again_with_its_output() {
    let (db, inbox, effects) = setup(Backend::Postgres).await;
    let table = inbox.table().as_str().to_owned();
    let function = format!("{table}_once");
    db.exec(&format!("CREATE SEQUENCE {function}")).await;
    db.exec(&format!(
        "CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
         IF NEW.status = 'completed' AND nextval('{function}') = 1 THEN \
         RAISE EXCEPTION 'cancelled once' USING ERRCODE = '57014'; END IF; RETURN NEW; END $$"
    ))
    .await;
    db.exec(&format!(
        "CREATE TRIGGER {function} BEFORE UPDATE ON {table} FOR EACH ROW \
         EXECUTE FUNCTION {function}()"
    ))
    .await;
    let handler = Recorder::new(&db, &effects, "once").two_phase(Duration::from_secs(30));
    let outcome = inbox
        .process(&handler, Msg::new("once-1", "x"), &meta())
        .await;
    db.exec(&format!("DROP TRIGGER {function} ON {table}"))
        .await;
    db.exec(&format!("DROP FUNCTION {function}()")).await;
    db.exec(&format!("DROP SEQUENCE {function}")).await;
    assert!(matches!(outcome, Ok(Outcome::Processed(_))), "{outcome:?}");
    let record = inbox
        .lookup(&inbox_key("once", "once-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, Status::Completed);
    assert!(record.output.is_some());
    assert_eq!(db.count(&effects, "1=1").await, 1);
}

//! The inbox on each backend: fresh and duplicate, content checks, concurrency, failures,
//! expiry, two-phase leases and bad input.
//!
//! Run: `cargo test -p idem-tests --test database inbox::` with PostgreSQL and MariaDB up (see README).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_runtime::admin::Forgotten;
use idem_runtime::admin::InboxAdmin;
use idem_runtime::admin::LiveClaim;
use idem_runtime::admin::Status;
use idem_runtime::retention::RedeliveryWindow;
use idem_runtime::transport::Processing;
use idem_runtime::{
    ConfigError, Error, Inbox, Metadata, Outcome, RetentionPolicy, transport::Settle,
};
use idem_tests::{
    Backend, CutWorker, Msg, Recorder, TestDb, inbox_key, meta, on_each_backend, unique,
};
use idem_tests::{inbox_and_effects as setup, inbox_and_effects_with as setup_with};

on_each_backend!(
    fresh_then_duplicate_returns_the_stored_output,
    reused_key_with_other_content_is_refused,
    fingerprint_off_lets_changed_content_through_as_duplicate,
    two_consumers_each_process_the_same_message,
    thirty_two_concurrent_copies_have_one_effect,
    two_hundred_keys_four_copies_each_have_two_hundred_effects,
    handler_error_before_commit_records_nothing,
    handler_panic_before_commit_records_nothing,
    permanent_handler_error_is_dead_lettered,
    expired_record_is_processed_again,
    thirty_two_concurrent_copies_of_an_expired_record_have_one_effect,
    two_phase_lease_takeover_fences_the_stale_worker,
    two_phase_releases_the_claim_when_the_handler_fails,
    two_phase_max_takeovers_needs_intervention,
    two_phase_duplicate_returns_the_stored_output,
    two_phase_output_that_cannot_be_stored_still_completes_the_record,
    two_phase_claim_outlives_a_retention_shorter_than_its_lease,
    bad_input_gets_its_own_error,
    table_creation_is_idempotent_and_migration_creates_the_same_table,
    migrations_of_two_inbox_tables_are_recorded_apart,
    retention_shorter_than_the_redelivery_window_is_refused,
    a_table_with_another_schema_is_refused_at_start_up,
    a_table_whose_key_merges_keys_is_refused_at_start_up,
    a_handler_asking_for_no_retention_is_refused,
    a_key_the_table_refuses_fails_and_counts,
    retention_and_lease_of_forever_keep_their_records,
);

/// Processes until the inbox stops asking for a requeue, as a broker would redeliver.
async fn process_until_settled(
    inbox: &Inbox,
    handler: &Recorder,
    msg: Msg,
) -> Result<Outcome<String>, Error> {
    process_counting_requeues(inbox, handler, msg).await.0
}

/// Like [`process_until_settled`], also returning how many requeues it took.
async fn process_counting_requeues(
    inbox: &Inbox,
    handler: &Recorder,
    msg: Msg,
) -> (Result<Outcome<String>, Error>, usize) {
    let mut requeues = 0;
    loop {
        match inbox.process(handler, msg.clone(), &meta()).await {
            Err(e) if e.settle() == Settle::Requeue => {
                requeues += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            other => return (other, requeues),
        }
    }
}

async fn fresh_then_duplicate_returns_the_stored_output(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let handler = Recorder::new(&db, &effects, "billing").tagged("first");
    let msg = Msg::new("order-1", "charge 10");

    let first = inbox.process(&handler, msg.clone(), &meta()).await.unwrap();
    assert_eq!(first, Outcome::Processed("first:charge 10".into()));

    // A later run must not run the handler: its tag would change the output.
    let handler = handler.tagged("second");
    let again = inbox.process(&handler, msg.clone(), &meta()).await.unwrap();
    assert_eq!(again, Outcome::Duplicate("first:charge 10".into()));
    assert_eq!(db.count(&effects, "1=1").await, 1);

    let record = inbox
        .lookup(&inbox_key("billing", "order-1"))
        .await
        .unwrap()
        .expect("record");
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.attempts, 1);
    assert_eq!(record.output.as_deref(), Some("\"first:charge 10\""));
    assert!(record.expires_at > record.completed_at.unwrap());
}

async fn reused_key_with_other_content_is_refused(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let handler = Recorder::new(&db, &effects, "billing");
    inbox
        .process(&handler, Msg::new("order-1", "charge 10"), &meta())
        .await
        .unwrap();

    let err = inbox
        .process(&handler, Msg::new("order-1", "charge 99"), &meta())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::FingerprintMismatch { .. }),
        "got {err:?}"
    );
    match err.settle() {
        Settle::DeadLetter(reason) => assert_eq!(reason.code, "fingerprint-mismatch"),
        other => panic!("mismatch must be dead-lettered, got {other:?}"),
    }
    assert_eq!(db.count(&effects, "1=1").await, 1);
    assert_eq!(db.count(&effects, "body = 'charge 99'").await, 0);
}

async fn fingerprint_off_lets_changed_content_through_as_duplicate(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let mut handler = Recorder::new(&db, &effects, "audit");
    handler.fingerprint = false;
    inbox
        .process(&handler, Msg::new("e-1", "a"), &meta())
        .await
        .unwrap();
    let again = inbox
        .process(&handler, Msg::new("e-1", "b"), &meta())
        .await
        .unwrap();
    assert_eq!(again, Outcome::Duplicate("run:a".into()));
    assert_eq!(db.count(&effects, "1=1").await, 1);
}

async fn two_consumers_each_process_the_same_message(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let billing = Recorder::new(&db, &effects, "billing");
    let shipping = Recorder::new(&db, &effects, "shipping");
    let msg = Msg::new("order-7", "placed");
    for handler in [&billing, &shipping] {
        let outcome = inbox.process(handler, msg.clone(), &meta()).await.unwrap();
        assert!(!outcome.is_duplicate());
    }
    for handler in [&billing, &shipping] {
        let outcome = inbox.process(handler, msg.clone(), &meta()).await.unwrap();
        assert!(outcome.is_duplicate());
    }
    assert_eq!(db.count(&effects, "consumer = 'billing'").await, 1);
    assert_eq!(db.count(&effects, "consumer = 'shipping'").await, 1);
}

async fn thirty_two_concurrent_copies_have_one_effect(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let handler = Arc::new(Recorder::new(&db, &effects, "billing").slow(Duration::from_millis(20)));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (inbox, handler) = (inbox.clone(), Arc::clone(&handler));
            tokio::spawn(async move {
                process_until_settled(&inbox, &handler, Msg::new("hot-key", "x")).await
            })
        })
        .collect();
    let mut processed = 0;
    for task in tasks {
        match task.await.unwrap().unwrap() {
            Outcome::Processed(_) => processed += 1,
            Outcome::Duplicate(output) => assert_eq!(output, "run:x"),
        }
    }
    assert_eq!(processed, 1);
    assert_eq!(db.count(&effects, "1=1").await, 1);
}

async fn two_hundred_keys_four_copies_each_have_two_hundred_effects(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let handler = Arc::new(Recorder::new(&db, &effects, "billing"));
    // Interleave copies so that copies of one key run at the same time.
    let messages: Vec<Msg> = (0..4)
        .flat_map(|_| (0..200).map(|i| Msg::new(format!("k-{i}"), format!("body-{i}"))))
        .collect();
    let tasks: Vec<_> = messages
        .into_iter()
        .map(|msg| {
            let (inbox, handler) = (inbox.clone(), Arc::clone(&handler));
            tokio::spawn(async move { process_until_settled(&inbox, &handler, msg).await })
        })
        .collect();
    let mut processed = 0;
    for task in tasks {
        if let Outcome::Processed(_) = task.await.unwrap().unwrap() {
            processed += 1;
        }
    }
    assert_eq!(processed, 200);
    assert_eq!(db.count(&effects, "1=1").await, 200);
    assert_eq!(db.count(inbox.table().as_str(), "1=1").await, 200);
}

async fn handler_error_before_commit_records_nothing(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let handler = Recorder::new(&db, &effects, "billing");
    handler.fail_next(1);
    let msg = Msg::new("order-1", "charge");
    let err = inbox
        .process(&handler, msg.clone(), &meta())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Handler {
                permanent: false,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.settle(), Settle::Requeue);
    // The effect written before the failure was rolled back with the claim.
    assert_eq!(db.count(&effects, "1=1").await, 0);
    assert!(
        inbox
            .lookup(&inbox_key("billing", "order-1"))
            .await
            .unwrap()
            .is_none()
    );

    let retry = inbox.process(&handler, msg, &meta()).await.unwrap();
    assert_eq!(retry, Outcome::Processed("run:charge".into()));
    assert_eq!(db.count(&effects, "1=1").await, 1);
}

async fn handler_panic_before_commit_records_nothing(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let handler = Recorder::new(&db, &effects, "billing");
    handler.panic_next(1);
    let msg = Msg::new("order-1", "charge");
    let err = inbox
        .process(&handler, msg.clone(), &meta())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::HandlerPanicked(ref m) if m.contains("on purpose")));
    assert_eq!(err.settle(), Settle::Requeue);
    assert_eq!(db.count(&effects, "1=1").await, 0);

    let retry = inbox.process(&handler, msg, &meta()).await.unwrap();
    assert!(!retry.is_duplicate());
    assert_eq!(db.count(&effects, "1=1").await, 1);
}

async fn permanent_handler_error_is_dead_lettered(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let mut handler = Recorder::new(&db, &effects, "billing");
    handler.permanent = true;
    handler.fail_next(1);
    let err = inbox
        .process(&handler, Msg::new("bad-order", "x"), &meta())
        .await
        .unwrap_err();
    match err.settle() {
        Settle::DeadLetter(reason) => assert_eq!(reason.code, "handler-permanent-error"),
        other => panic!("expected dead-letter, got {other:?}"),
    }
    assert_eq!(db.count(&effects, "1=1").await, 0);
}

async fn expired_record_is_processed_again(backend: Backend) {
    let retention = RetentionPolicy::default().with_consumer("short", Duration::from_millis(300));
    let (db, inbox, effects) = setup_with(backend, |b| b.retention(retention)).await;
    let handler = Recorder::new(&db, &effects, "short");
    let msg = Msg::new("k", "v");
    assert!(
        !inbox
            .process(&handler, msg.clone(), &meta())
            .await
            .unwrap()
            .is_duplicate()
    );
    assert!(
        inbox
            .process(&handler, msg.clone(), &meta())
            .await
            .unwrap()
            .is_duplicate()
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Past its retention the record behaves as absent, cleaner or not.
    let after = inbox.process(&handler, msg.clone(), &meta()).await.unwrap();
    assert_eq!(after, Outcome::Processed("run:v".into()));
    assert_eq!(db.count(&effects, "1=1").await, 2);
    // Even with different content: an expired record is not compared.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let changed = inbox
        .process(&handler, Msg::new("k", "w"), &meta())
        .await
        .unwrap();
    assert_eq!(changed, Outcome::Processed("run:w".into()));
}

async fn thirty_two_concurrent_copies_of_an_expired_record_have_one_effect(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let handler = Arc::new(Recorder::new(&db, &effects, "billing").slow(Duration::from_millis(20)));
    inbox
        .process(handler.as_ref(), Msg::new("k", "v"), &meta())
        .await
        .unwrap();
    // Expired long ago; the takeover's record keeps the default retention of 7 days.
    db.exec(&format!("UPDATE {} SET expires_at = 1", inbox.table()))
        .await;
    // Every copy finds the expired record; one takes it over, the others see its new run. Racing
    // takeovers that deadlock (MySQL/MariaDB) are retried inside the inbox, never requeued.
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (inbox, handler) = (inbox.clone(), Arc::clone(&handler));
            tokio::spawn(async move {
                process_counting_requeues(&inbox, &handler, Msg::new("k", "v")).await
            })
        })
        .collect();
    let (mut processed, mut requeues) = (0, 0);
    for task in tasks {
        let (outcome, requeued) = task.await.unwrap();
        processed += usize::from(!outcome.unwrap().is_duplicate());
        requeues += requeued;
    }
    assert_eq!(processed, 1);
    assert_eq!(requeues, 0, "copies were requeued");
    assert_eq!(db.count(&effects, "1=1").await, 2);
}

async fn two_phase_lease_takeover_fences_the_stale_worker(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let lease = Duration::from_millis(300);
    // The stale worker's handler outlives its lease three times over; it keeps its claim only as
    // long as its renewals reach the database.
    let stale_worker = CutWorker::new(&db, inbox.table().as_str(), |b| b).await;
    let stale = Recorder::new(&db, &effects, "mailer")
        .two_phase(lease)
        .tagged("stale")
        .slow(Duration::from_millis(900));
    let fresh = Recorder::new(&db, &effects, "mailer")
        .two_phase(lease)
        .tagged("fresh");
    let msg = Msg::new("mail-1", "hello");

    let stale_run = {
        let (inbox, stale, msg) = (stale_worker.inbox.clone(), stale.clone(), msg.clone());
        tokio::spawn(async move { inbox.process(&stale, msg, &Metadata::default()).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;

    // The stale worker's claim is live: another copy is told to come back later.
    let busy = inbox
        .process(&fresh, msg.clone(), &meta())
        .await
        .unwrap_err();
    assert!(
        matches!(busy, Error::InProgressElsewhere { .. }),
        "{busy:?}"
    );
    assert_eq!(busy.settle(), Settle::Requeue);
    let record = inbox
        .lookup(&inbox_key("mailer", "mail-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, Status::InProgress);

    // Its renewals stop reaching the database: once the lease ran out, the claim is taken over,
    // and the handler sees it is attempt 2.
    stale_worker.cut().await;
    tokio::time::sleep(lease + Duration::from_millis(150)).await;
    let taken = inbox.process(&fresh, msg.clone(), &meta()).await.unwrap();
    assert_eq!(taken, Outcome::Processed("fresh:hello".into()));
    assert_eq!(fresh.attempts(), vec![2]);

    // The stale worker reaches the database again, finishes late and may not complete the
    // record.
    stale_worker.restore().await;
    let stale_result = stale_run.await.unwrap().unwrap_err();
    assert!(
        matches!(stale_result, Error::ClaimLost { .. }),
        "{stale_result:?}"
    );
    assert_eq!(stale_result.settle(), Settle::Requeue);

    let record = inbox
        .lookup(&inbox_key("mailer", "mail-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.attempts, 2);
    assert_eq!(record.output.as_deref(), Some("\"fresh:hello\""));
    // Fencing stops the double completion; both external calls happened, which is why the key is
    // handed downstream.
    assert_eq!(db.count(&effects, "1=1").await, 2);
    let again = inbox.process(&stale, msg, &meta()).await.unwrap();
    assert_eq!(again, Outcome::Duplicate("fresh:hello".into()));
}

async fn two_phase_releases_the_claim_when_the_handler_fails(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let handler = Recorder::new(&db, &effects, "mailer").two_phase(Duration::from_secs(30));
    handler.fail_next(1);
    let msg = Msg::new("mail-2", "hi");
    let err = inbox
        .process(&handler, msg.clone(), &meta())
        .await
        .unwrap_err();
    assert_eq!(err.settle(), Settle::Requeue);
    // No key is kept after a failed handler, so the retry is not dropped as a duplicate.
    assert!(
        inbox
            .lookup(&inbox_key("mailer", "mail-2"))
            .await
            .unwrap()
            .is_none()
    );
    let retry = inbox.process(&handler, msg.clone(), &meta()).await.unwrap();
    assert_eq!(retry, Outcome::Processed("run:hi".into()));

    handler.panic_next(1);
    let panicked = inbox
        .process(&handler, Msg::new("mail-3", "hi"), &meta())
        .await
        .unwrap_err();
    assert!(matches!(panicked, Error::HandlerPanicked(_)));
    assert!(
        inbox
            .lookup(&inbox_key("mailer", "mail-3"))
            .await
            .unwrap()
            .is_none()
    );
}

async fn two_phase_max_takeovers_needs_intervention(backend: Backend) {
    let (db, inbox, effects) = setup_with(backend, |b| b.max_attempts(2)).await;
    let lease = Duration::from_millis(150);
    let hanging = Recorder::new(&db, &effects, "mailer")
        .two_phase(lease)
        .slow(Duration::from_secs(60));
    let msg = Msg::new("mail-9", "hello");
    // Two workers crash mid-handler (their futures are dropped): each leaves a claim behind.
    // Each crashes once its claim is seen and its handler runs, however slow the machine is.
    for attempt in 1..=2u32 {
        let claimed = async {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            loop {
                let record = inbox.lookup(&inbox_key("mailer", "mail-9")).await.unwrap();
                let handling = hanging.attempts().len() == attempt as usize;
                if handling && record.is_some_and(|record| record.attempts == attempt) {
                    return;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "attempt {attempt} never claimed the key"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::pin!(claimed);
        let meta = meta();
        loop {
            tokio::select! {
                finished = inbox.process(&hanging, msg.clone(), &meta) => match finished {
                    // The previous claim's last renewal is not over yet.
                    Err(Error::InProgressElsewhere { .. }) => {
                        tokio::time::sleep(Duration::from_millis(20)).await
                    }
                    other => panic!("attempt {attempt} should hang, it ended with {other:?}"),
                },
                () = &mut claimed => break,
            }
        }
        // Its renewals stopped with it: the claim is free a lease after the last one.
        tokio::time::sleep(lease + Duration::from_millis(60)).await;
    }
    let err = inbox
        .process(&hanging, msg.clone(), &meta())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::NeedsIntervention { attempts: 2, .. }),
        "{err:?}"
    );
    match err.settle() {
        Settle::DeadLetter(reason) => assert_eq!(reason.code, "needs-intervention"),
        other => panic!("expected dead-letter, got {other:?}"),
    }
    assert_eq!(hanging.attempts(), vec![1, 2]);

    // An operator reconciles and forgets the key: the next delivery is processed.
    let key = inbox_key("mailer", "mail-9");
    let forgotten = inbox.forget(&key, LiveClaim::Refuse).await.unwrap();
    assert_eq!(forgotten, Forgotten::Deleted);
    let quick = Recorder::new(&db, &effects, "mailer").two_phase(lease);
    assert!(
        !inbox
            .process(&quick, msg, &meta())
            .await
            .unwrap()
            .is_duplicate()
    );
}

async fn two_phase_duplicate_returns_the_stored_output(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let handler = Recorder::new(&db, &effects, "mailer").two_phase(Duration::from_secs(5));
    let msg = Msg::new("mail-4", "hey");
    assert_eq!(
        inbox.process(&handler, msg.clone(), &meta()).await.unwrap(),
        Outcome::Processed("run:hey".into())
    );
    let handler = handler.tagged("other");
    assert_eq!(
        inbox.process(&handler, msg.clone(), &meta()).await.unwrap(),
        Outcome::Duplicate("run:hey".into())
    );
    let err = inbox
        .process(&handler, Msg::new("mail-4", "changed"), &meta())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::FingerprintMismatch { .. }));
    assert_eq!(db.count(&effects, "1=1").await, 1);
}

/// A two-phase service whose output JSON cannot hold: map keys must be strings there.
#[derive(Debug, Default)]
struct UnstorableOutput {
    calls: AtomicUsize,
}

impl UnstorableOutput {
    #[idem_runtime::idempotent(key = msg.id.clone(), consumer = "unstorable", mode = two_phase)]
    async fn call(&self, msg: Msg) -> Result<HashMap<(u8, u8), u8>, std::convert::Infallible> {
        let _ = msg;
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(HashMap::from([((1, 2), 3)]))
    }
}

async fn two_phase_output_that_cannot_be_stored_still_completes_the_record(backend: Backend) {
    let (_db, inbox, _effects) = setup(backend).await;
    let service = Arc::new(UnstorableOutput::default());
    let handler = service.call_handler();
    let first = inbox.process(&handler, Msg::new("k", "v"), &meta()).await;
    assert!(
        matches!(first, Err(Error::OutputNotStorable(_))),
        "{first:?}"
    );
    assert!(matches!(
        first.unwrap_err().settle(),
        Settle::DeadLetter(reason) if reason.code == "output-not-storable"
    ));
    // The external call happened once; a redelivery or a resubmission must not repeat it.
    let again = inbox.process(&handler, Msg::new("k", "v"), &meta()).await;
    assert!(
        matches!(&again, Err(e) if e.settle() == Settle::Ack),
        "{again:?}"
    );
    assert_eq!(service.calls.load(Ordering::SeqCst), 1);
    let record = inbox
        .lookup(&inbox_key("unstorable", "k"))
        .await
        .unwrap()
        .expect("a record");
    assert_eq!(record.status, Status::Completed);
}

async fn bad_input_gets_its_own_error(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let handler = Recorder::new(&db, &effects, "billing");

    let empty = inbox
        .process(&handler, Msg::new("", "x"), &meta())
        .await
        .unwrap_err();
    assert!(
        matches!(
            empty,
            Error::InvalidKey(idem_runtime::KeyError::Empty { .. })
        ),
        "{empty:?}"
    );
    let long = inbox
        .process(&handler, Msg::new("k".repeat(256), "x"), &meta())
        .await
        .unwrap_err();
    assert!(
        matches!(
            long,
            Error::InvalidKey(idem_runtime::KeyError::TooLong { len: 256, .. })
        ),
        "{long:?}"
    );
    for err in [&empty, &long] {
        match err.settle() {
            Settle::DeadLetter(reason) => assert_eq!(reason.code, "invalid-key"),
            other => panic!("expected dead-letter, got {other:?}"),
        }
    }
    // The longest valid key fits the column on every backend.
    let longest = "k".repeat(idem_runtime::MessageKey::MAX_LEN);
    assert!(
        !inbox
            .process(&handler, Msg::new(longest, "x"), &meta())
            .await
            .unwrap()
            .is_duplicate()
    );
    // Keys differing only in case or trailing blanks are different keys on every backend.
    for key in ["Case", "case", "case "] {
        let outcome = inbox
            .process(&handler, Msg::new(key, "x"), &meta())
            .await
            .unwrap();
        assert!(!outcome.is_duplicate(), "{key:?} was taken for another key");
    }
    assert_eq!(db.count(&effects, "1=1").await, 4);

    let bad_consumer = Recorder::new(&db, &effects, "");
    let err = inbox
        .process(&bad_consumer, Msg::new("k", "x"), &meta())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidConsumer(_)), "{err:?}");

    let bad_table = Inbox::builder(db.db.clone())
        .table("inbox; DROP TABLE x")
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(
            bad_table,
            Error::Config(ConfigError::InvalidTableName(ref name)) if name == "inbox; DROP TABLE x"
        ),
        "{bad_table:?}"
    );
}

async fn table_creation_is_idempotent_and_migration_creates_the_same_table(backend: Backend) {
    use sea_orm_migration::{MigrationTrait, SchemaManager};

    let (db, inbox, effects) = setup(backend).await;
    // Building again on the same table neither fails nor loses records.
    let handler = Recorder::new(&db, &effects, "billing");
    inbox
        .process(&handler, Msg::new("a", "1"), &meta())
        .await
        .unwrap();
    let again = Inbox::builder(db.db.clone())
        .table(inbox.table().as_str())
        .build()
        .await
        .unwrap();
    assert!(
        again
            .process(&handler, Msg::new("a", "1"), &meta())
            .await
            .unwrap()
            .is_duplicate()
    );

    // The migration creates a table the inbox can use without creating anything itself.
    let migrated = db.table("migrated");
    let migration = idem_runtime::migration::CreateInbox::new(
        idem_runtime::schema::TableName::new(migrated.clone()).unwrap(),
    );
    let manager = SchemaManager::new(&db.db);
    migration.up(&manager).await.unwrap();
    let inbox = Inbox::builder(db.db.clone())
        .table(migrated.clone())
        .create_table(false)
        .build()
        .await
        .unwrap();
    inbox
        .process(&handler, Msg::new("b", "1"), &meta())
        .await
        .unwrap();
    assert_eq!(db.count(&migrated, "1=1").await, 1);
    // With the tables beside it; for an inbox migrated before they came, a migration of
    // their own.
    assert!(inbox.duplicate_summaries().await.unwrap().is_empty());
    let companions = idem_runtime::migration::CreateInboxCompanions::new(
        idem_runtime::schema::TableName::new(migrated.clone()).unwrap(),
    );
    companions.down(&manager).await.unwrap();
    assert!(inbox.duplicate_summaries().await.is_err());
    companions.up(&manager).await.unwrap();
    assert!(inbox.duplicate_summaries().await.unwrap().is_empty());
    // Companions of an earlier version (summaries by process) are left alone; the upgrade
    // adds this version's beside them.
    companions.down(&manager).await.unwrap();
    db.exec(&format!(
        "CREATE TABLE {migrated}_duplicates (consumer VARCHAR(128) NOT NULL, \
         instance VARCHAR(36) NOT NULL, PRIMARY KEY (consumer, instance))"
    ))
    .await;
    db.exec(&format!(
        "INSERT INTO {migrated}_duplicates VALUES ('c', 'i')"
    ))
    .await;
    let upgrade = idem_runtime::migration::UpgradeInboxCompanions::new(
        idem_runtime::schema::TableName::new(migrated.clone()).unwrap(),
    );
    upgrade.up(&manager).await.unwrap();
    assert!(inbox.duplicate_summaries().await.unwrap().is_empty());
    assert_eq!(db.count(&format!("{migrated}_duplicates"), "1=1").await, 1);
    migration.down(&manager).await.unwrap();
    let gone = inbox.process(&handler, Msg::new("c", "1"), &meta()).await;
    assert!(matches!(gone, Err(Error::Database(_))), "{gone:?}");
    assert_eq!(gone.unwrap_err().settle(), Settle::Requeue);
}

async fn migrations_of_two_inbox_tables_are_recorded_apart(backend: Backend) {
    use idem_runtime::migration::CreateInbox;
    use idem_runtime::schema::TableName;
    use sea_orm::DynIden;
    use sea_orm_migration::sea_query::{Alias, IntoIden};
    use sea_orm_migration::{MigrationTrait, MigratorTraitSelf};

    /// A migrator with its own migrations table, so that tests do not share one.
    struct Migrator {
        table: String,
        inboxes: Vec<TableName>,
    }

    impl MigratorTraitSelf for Migrator {
        fn migrations(&self) -> Vec<Box<dyn MigrationTrait>> {
            self.inboxes
                .iter()
                .map(|table| Box::new(CreateInbox::new(table.clone())) as Box<dyn MigrationTrait>)
                .collect()
        }

        fn migration_table_name(&self) -> DynIden {
            Alias::new(self.table.as_str()).into_iden()
        }
    }

    let db = TestDb::connect(backend).await;
    let inboxes = [db.table("orders"), db.table("billing")];
    let migrator = Migrator {
        table: db.table("migrations"),
        inboxes: inboxes
            .iter()
            .map(|table| TableName::new(table.as_str()).unwrap())
            .collect(),
    };
    migrator.up(&db.db, None).await.unwrap();
    // Both ran: each table serves an inbox that does not create its own.
    assert_eq!(db.count(&migrator.table, "1=1").await, 2);
    for table in &inboxes {
        Inbox::builder(db.db.clone())
            .table(table.as_str())
            .create_table(false)
            .build()
            .await
            .unwrap_or_else(|error| panic!("{table}: {error}"));
    }
    migrator.down(&db.db, None).await.unwrap();
    assert_eq!(db.count(&migrator.table, "1=1").await, 0);
}

async fn retention_shorter_than_the_redelivery_window_is_refused(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let day = Duration::from_secs(24 * 3600);
    let window =
        RedeliveryWindow::new(5, Duration::from_secs(1800)).with_dead_letter_resubmission(7 * day);
    let err = Inbox::builder(db.db.clone())
        .table(unique("inbox"))
        .retention(RetentionPolicy::default())
        .redelivery_window(window)
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Config(ConfigError::RetentionTooShort { .. })),
        "{err:?}"
    );

    // A long enough default, but one handler asking for less, is caught when it is checked.
    let table = db.table("inbox");
    let inbox = Inbox::builder(db.db.clone())
        .table(table)
        .retention(RetentionPolicy::new(10 * day))
        .redelivery_window(window)
        .build()
        .await
        .unwrap();
    let effects = db.effects_table().await;
    let mut handler = Recorder::new(&db, &effects, "billing");
    assert!(inbox.check_handler(&handler).is_ok());
    handler.retention = Some(day);
    assert!(matches!(
        inbox.check_handler(&handler),
        Err(Error::Config(ConfigError::RetentionTooShort { .. }))
    ));
}

async fn a_table_with_another_schema_is_refused_at_start_up(backend: Backend) {
    let db = TestDb::connect(backend).await;
    // A column missing.
    let missing = db.table("inbox");
    db.exec(&format!(
        "CREATE TABLE {missing} (consumer VARCHAR(128) NOT NULL, message_key VARCHAR(255) NOT NULL, \
         PRIMARY KEY (consumer, message_key))"
    ))
    .await;
    let err = Inbox::builder(db.db.clone())
        .table(missing)
        .create_table(false)
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Config(ConfigError::SchemaMismatch { .. })),
        "{err:?}"
    );

    // A fingerprint column too narrow for 32 bytes (SQLite does not enforce column types).
    if backend != Backend::Sqlite {
        let narrow = db.table("inbox");
        let statements = idem_runtime::schema::create_table_statements(
            db.db.get_database_backend(),
            &idem_runtime::schema::TableName::new(narrow.clone()).unwrap(),
        );
        let binary = if backend == Backend::Postgres {
            "BYTEA"
        } else {
            "BINARY(32)"
        };
        db.exec(&statements[0].replace(binary, "CHAR(8)")).await;
        let err = Inbox::builder(db.db.clone())
            .table(narrow)
            .create_table(false)
            .build()
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::Config(ConfigError::SchemaMismatch { .. })),
            "{err:?}"
        );
    }

    // Without the table and without creating it: refused too, by name.
    let absent = unique("absent");
    let err = Inbox::builder(db.db.clone())
        .table(absent.clone())
        .create_table(false)
        .build()
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&absent), "{err}");
}

/// A key a constraint of the table refuses fails its message, counted towards its delivery
/// limit (MariaDB's `INSERT IGNORE` does not ignore a `CHECK`): never taken for a claim held
/// elsewhere, requeued forever uncounted.
async fn a_key_the_table_refuses_fails_and_counts(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let table = db.table("inbox");
    let statements = idem_runtime::schema::create_table_statements(
        db.db.get_database_backend(),
        &idem_runtime::schema::TableName::new(table.as_str()).unwrap(),
    );
    let key = "PRIMARY KEY (consumer, message_key)";
    for sql in &statements {
        db.exec(&sql.replace(key, &format!("{key}, CHECK (message_key <> 'refused')")))
            .await;
    }
    let inbox = Inbox::builder(db.db.clone())
        .table(table)
        .create_table(false)
        .build()
        .await
        .unwrap();
    let effects = db.effects_table().await;
    let handler = Recorder::new(&db, &effects, "billing");
    let refused = inbox
        .process(&handler, Msg::new("refused", "1"), &meta())
        .await;
    let error = refused.unwrap_err();
    assert_eq!(error.code(), "database-error", "{error:?}");
    assert!(error.counts_as_attempt(), "{error:?}");
    let fine = inbox
        .process(&handler, Msg::new("fine", "1"), &meta())
        .await;
    assert!(matches!(fine, Ok(Outcome::Processed(_))), "{fine:?}");
    assert_eq!(db.count(&effects, "1=1").await, 1);
}

/// A handler's own retention of zero (which the builder never saw) would let every copy run
/// again: refused when the handler is checked, and when it processes.
async fn a_handler_asking_for_no_retention_is_refused(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let mut handler = Recorder::new(&db, &effects, "billing");
    handler.retention = Some(Duration::ZERO);
    assert!(
        matches!(
            inbox.check_handler(&handler),
            Err(Error::Config(ConfigError::Zero("retention")))
        ),
        "{:?}",
        inbox.check_handler(&handler)
    );
    for _ in 0..2 {
        let processed = inbox.process(&handler, Msg::new("a", "1"), &meta()).await;
        assert!(
            matches!(
                processed,
                Err(Error::Config(ConfigError::Zero("retention")))
            ),
            "{processed:?}"
        );
    }
    assert_eq!(db.count(&effects, "1=1").await, 0);
}

/// A retention or a lease of `Duration::MAX` (kept for good) is added to the database's clock
/// without overflowing it: the record is kept, and a copy is a duplicate.
async fn retention_and_lease_of_forever_keep_their_records(backend: Backend) {
    let forever = RetentionPolicy::new(Duration::MAX);
    let (db, inbox, effects) = setup_with(backend, |b| b.retention(forever)).await;
    let transactional = Recorder::new(&db, &effects, "billing");
    let two_phase = Recorder::new(&db, &effects, "mailer").two_phase(Duration::MAX);
    for handler in [&transactional, &two_phase] {
        let first = inbox.process(handler, Msg::new("a", "1"), &meta()).await;
        assert!(matches!(first, Ok(Outcome::Processed(_))), "{first:?}");
        let again = inbox.process(handler, Msg::new("a", "1"), &meta()).await;
        assert!(matches!(again, Ok(Outcome::Duplicate(_))), "{again:?}");
    }
    assert_eq!(db.count(&effects, "1=1").await, 2);
}

/// A table created by someone else whose key does not keep every two keys apart (no unique key,
/// a collation that ignores case, accents or trailing spaces, an index on a prefix, a character
/// set without 4-byte characters) would run a message twice or take one message for another:
/// refused at start-up.
async fn a_table_whose_key_merges_keys_is_refused_at_start_up(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let ours = |table: &str| {
        idem_runtime::schema::create_table_statements(
            db.db.get_database_backend(),
            &idem_runtime::schema::TableName::new(table).unwrap(),
        )
    };
    const KEY: &str = "PRIMARY KEY (consumer, message_key)";
    /// How a variant changes idem's `CREATE TABLE`.
    type Change = fn(&str) -> String;
    let mut variants: Vec<(&str, Change)> =
        vec![("no unique key", |sql| sql.replace(&format!(", {KEY}"), ""))];
    if backend == Backend::MySql {
        let more: [(&str, Change); 4] = [
            ("a surrogate primary key", |sql| {
                sql.replace(KEY, "id BIGINT AUTO_INCREMENT, PRIMARY KEY (id)")
            }),
            ("the default collation", |sql| {
                sql.replace("VARBINARY", "VARCHAR")
            }),
            ("a unique key on a prefix", |sql| {
                sql.replace(KEY, "PRIMARY KEY (consumer, message_key(100))")
            }),
            ("a character set without 4-byte characters", |sql| {
                let utf8mb3 = "CHARACTER SET utf8mb3 COLLATE utf8mb3_bin";
                sql.replace("VARBINARY(255)", &format!("VARCHAR(255) {utf8mb3}"))
                    .replace("VARBINARY(128)", &format!("VARCHAR(128) {utf8mb3}"))
            }),
        ];
        variants.extend(more);
    }
    // A table that keeps every two keys apart, with a constraint of its own that refuses some of
    // the keys start-up tries: accepted.
    let table = db.table("inbox");
    let checked = ours(&table)[0].replace(
        KEY,
        &format!("{KEY}, CHECK (SUBSTR(consumer, 1, 1) <> 'C' AND message_key NOT LIKE '% ')"),
    );
    db.exec(&checked).await;
    let built = Inbox::builder(db.db.clone())
        .table(table)
        .create_table(false)
        .build()
        .await;
    assert!(built.is_ok(), "a table with a constraint: {built:?}");
    for (what, change) in variants {
        let table = db.table("inbox");
        let statements = ours(&table);
        let changed = change(&statements[0]);
        assert_ne!(changed, statements[0], "{what}: the table is changed");
        db.exec(&changed).await;
        let built = Inbox::builder(db.db.clone())
            .table(table)
            .create_table(false)
            .build()
            .await;
        assert!(
            matches!(
                built,
                Err(Error::Config(ConfigError::SchemaMismatch { .. }))
            ),
            "{what}: {built:?}"
        );
    }
}

async fn two_phase_claim_outlives_a_retention_shorter_than_its_lease(backend: Backend) {
    let retention = RetentionPolicy::default().with_consumer("mailer", Duration::from_millis(50));
    let (db, inbox, effects) = setup_with(backend, |b| b.retention(retention)).await;
    // The handler outlives its lease: the renewals keep the record for the retention after each
    // new lease, as the claim did.
    let lease = Duration::from_millis(300);
    let slow = Recorder::new(&db, &effects, "mailer")
        .two_phase(lease)
        .slow(Duration::from_millis(900));
    let msg = Msg::new("mail-1", "hi");
    let first = {
        let (inbox, slow, msg) = (inbox.clone(), slow.clone(), msg.clone());
        tokio::spawn(async move { inbox.process(&slow, msg, &Metadata::default()).await })
    };
    // Past the retention within the first lease, then past the first lease and its retention:
    // the claim is neither expired nor taken over.
    for pause in [200, 400] {
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let err = inbox
            .process(&slow, msg.clone(), &meta())
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InProgressElsewhere { .. }), "{err:?}");
    }
    assert!(!first.await.unwrap().unwrap().is_duplicate());
    assert_eq!(slow.attempts(), vec![1]);
    assert_eq!(db.count(&effects, "1=1").await, 1);
}

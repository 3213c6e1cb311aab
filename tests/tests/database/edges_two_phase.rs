//! Two-phase handlers at their edges, on each backend: a handler that outlives its lease keeps
//! its claim; one whose renewals no longer reach the database sees the loss, and one other
//! worker takes over; a takeover never reopens a record completed meanwhile, and one that fails
//! hands its claim on; a completion outlasts a short outage or a refusal; an output the database
//! refuses completes the record without it.
//!
//! Run: `cargo test -p idem-tests --test database edges_two_phase::` with PostgreSQL and MariaDB up (see
//! README).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_runtime::admin::InboxAdmin;
use idem_runtime::admin::Status;
use idem_runtime::fingerprint::{Fingerprint, FingerprintError};
use idem_runtime::sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, TransactionTrait};
use idem_runtime::{
    Context, Error, Handler, Inbox, KeyError, MessageKey, Metadata, Outcome, transport::Settle,
};
use idem_tests::inbox_and_effects as setup;
use idem_tests::proxy::{Proxy, behind_proxy};
use idem_tests::{Backend, CutWorker, Msg, Recorder, TestDb, inbox_key, meta, on_each_backend};

on_each_backend!(
    two_phase_output_the_database_refuses_completes_the_record_without_it,
    a_two_phase_handler_that_outlives_its_lease_keeps_its_claim,
);

/// Faults of the database servers': renewals that no longer reach them.
mod servers {
    use super::*;
    on_each_backend!([postgres, mysql]: a_handler_whose_renewals_are_cut_sees_the_loss_and_one_worker_takes_over);
}

/// A database whose answers come later than a claim's lease.
mod slow_answers {
    use super::*;
    on_each_backend!([postgres, mysql]: a_claim_that_answers_after_its_lease_does_not_run_its_handler);
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
    let filter = waiting_for_a_lock(text);
    let started = Instant::now();
    while db.count("pg_stat_activity", &filter).await == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no statement with {text:?} waits for a lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The `pg_stat_activity` filter of the statements whose text holds `text` and that wait for a
/// lock.
fn waiting_for_a_lock(text: &str) -> String {
    format!(
        "wait_event_type = 'Lock' AND query LIKE '%{}%'",
        text.replace('\'', "''")
    )
}

/// Cancels the statements of the test's database whose text holds `text` and that wait for a
/// lock, and waits until none does (PostgreSQL).
async fn cancel_waiting(db: &TestDb, text: &str) {
    let waiting = waiting_for_a_lock(text);
    let started = Instant::now();
    while db.count("pg_stat_activity", &waiting).await > 0 {
        db.exec(&format!(
            "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE {waiting}"
        ))
        .await;
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "a statement with {text:?} still waits for a lock"
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
    // The renewal that waited for the lock gave up at the lease's end (`renew_until_lost`), but
    // its statement still waits on the server; once the lock is gone it would update the row
    // first, and the completion and the takeover would then race for the new row version
    // instead of queueing in the order they came. Cancelled, it leaves them in that order.
    let renewal = format!("UPDATE \"{}\" SET lease_until = ", inbox.table().as_str());
    cancel_waiting(&db, &renewal).await;
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

/// A claim whose answer comes after its lease ran out (every answer of the database takes
/// longer than the lease) does not start its handler: another worker may have taken the claim
/// over meanwhile, and here one did. Found by the lease simulation (`inbox::renewal`): the
/// handler ran, and its external call with the other worker's.
async fn a_claim_that_answers_after_its_lease_does_not_run_its_handler(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let lease = Duration::from_millis(300);
    let handler = Recorder::new(&db, &effects, "slow").two_phase(lease);
    let (target, url) = match backend {
        Backend::Postgres => (
            "127.0.0.1:5432",
            "postgres://postgres@127.0.0.1:{port}/test",
        ),
        _ => ("127.0.0.1:3306", "mysql://root@127.0.0.1:{port}/test"),
    };
    let proxy = Proxy::start_with_delay(target, Duration::from_millis(500)).await;
    let url = url.replace("{port}", &proxy.port().to_string());
    let slow_pool = idem_tests::db::connect_with(&url, 2, Duration::from_secs(30))
        .await
        .expect("the database through the proxy");
    let slow = Inbox::builder(slow_pool)
        .table(inbox.table().as_str())
        .create_table(false)
        .build()
        .await
        .expect("the inbox builds");
    let msg = Msg::new("m-1", "hello");
    let slow_run = {
        let (handler, msg) = (handler.clone(), msg.clone());
        tokio::spawn(async move { slow.process(&handler, msg, &Metadata::default()).await })
    };
    // The slow worker's claim is in the database; its answer is still on the way.
    let key = inbox_key("slow", "m-1");
    let started = Instant::now();
    while inbox.lookup(&key).await.unwrap().is_none() {
        assert!(started.elapsed() < Duration::from_secs(10), "never claimed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Another worker takes it over once its lease ran out.
    let taken = loop {
        match inbox.process(&handler, msg.clone(), &meta()).await {
            Err(Error::InProgressElsewhere { .. }) => {
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "never taken over"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => break other,
        }
    };
    assert_eq!(taken.unwrap(), Outcome::Processed("run:hello".into()));
    let slow_outcome = slow_run.await.unwrap();
    assert!(
        matches!(slow_outcome, Err(Error::InProgressElsewhere { .. })),
        "{slow_outcome:?}"
    );
    assert_eq!(
        handler.attempts(),
        vec![2],
        "the slow worker ran its handler"
    );
    assert_eq!(db.count(&effects, "1=1").await, 1);
}

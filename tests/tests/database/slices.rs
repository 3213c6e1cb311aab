//! Slice handlers on each backend: a batch's fresh messages in one call settle as each would
//! alone (fresh, duplicate, mismatch, failing, panicking, an output missing), the failing ones
//! found by halving the slice; stagings get ids derived from their own message; concurrent
//! batches from two processes sharing keys have one effect per key.
//!
//! Run: `cargo test -p idem-tests --test database slices::` with PostgreSQL and MariaDB up (see README).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_runtime::admin::InboxAdmin;
use idem_runtime::admin::Status;
use idem_runtime::fingerprint::{Fingerprint, FingerprintError};
use idem_runtime::outbox::Outbox;
use idem_runtime::outbox::Relaying;
use idem_runtime::outbox::derived_id;
use idem_runtime::sea_orm::sea_query::{Alias, Query};
use idem_runtime::sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr, TransactionTrait};
use idem_runtime::transport::Processing;
use idem_runtime::{
    Context, Handler, Inbox, KeyError, MessageKey, Metadata, Outcome, SliceContext, SliceHandler,
    idempotent, transport::BatchItem,
};
use idem_tests::on_each_backend;
use idem_tests::slicer::{SLICER_CONSUMER, Slicer, SlicerError};
use idem_tests::{Backend, Msg, Recorder, TestDb, inbox_and_effects as setup, inbox_key};

on_each_backend!(
    an_idempotent_slice_function_writes_its_slice_in_one_statement,
    a_mixed_slice_batch_settles_each_message_as_it_would_alone,
    a_failing_message_is_found_by_halving,
    a_slice_that_breaks_its_transaction_is_found_by_the_completion,
    a_slice_stages_each_messages_events_under_its_own_ids,
    slices_from_two_processes_sharing_keys_have_one_effect_per_key,
    an_outage_of_the_handlers_own_database_fails_its_slice_in_one_call,
);

/// MySQL/MariaDB roll a deadlock's whole transaction back.
mod server {
    use super::*;
    on_each_backend!([mysql]: a_deadlock_under_a_slice_requeues_its_messages);
}

/// The table [`charge_all`] writes into, on each backend (a function names its tables).
const CHARGES: &str = "idem_slice_charges";

/// A slice function: every fresh message's charge in one multi-row insert.
#[idempotent(key = order.id, consumer = "slices.charge", slice)]
async fn charge_all(tx: &DatabaseTransaction, orders: Vec<Msg>) -> Result<Vec<String>, DbErr> {
    let mut insert = Query::insert();
    insert
        .into_table(Alias::new(CHARGES))
        .columns(["consumer", "message_key", "body"]);
    for order in &orders {
        insert.values_panic([
            "charge".into(),
            order.id.as_str().into(),
            order.body.as_str().into(),
        ]);
    }
    tx.execute(&insert).await?;
    Ok(orders
        .into_iter()
        .map(|order| format!("charged {}", order.id))
        .collect())
}

/// The handler `#[idempotent(..., slice)]` generates takes a batch's fresh messages in one call
/// and one message alone as a slice of one.
async fn an_idempotent_slice_function_writes_its_slice_in_one_statement(backend: Backend) {
    let (db, inbox, _) = setup(backend).await;
    let table = CHARGES;
    db.exec(&format!("DROP TABLE IF EXISTS {table}")).await;
    db.exec(&format!(
        "CREATE TABLE {table} (consumer VARCHAR(128), message_key VARCHAR(255), body VARCHAR(255))"
    ))
    .await;
    let handler = charge_all_handler();
    let alone = inbox
        .process(&handler, Msg::new("o-0", "one"), &Metadata::default())
        .await
        .unwrap();
    assert_eq!(alone, Outcome::Processed("charged o-0".to_owned()));
    let items = vec![item("o-1", "a"), item("o-0", "one"), item("o-2", "b")];
    let results = inbox.process_slices(&handler, items).await;
    let settled: Vec<String> = results.iter().map(settled_as).collect();
    assert_eq!(
        settled,
        [
            "processed charged o-1",
            "duplicate charged o-0",
            "processed charged o-2"
        ]
    );
    assert_eq!(db.count(table, "1=1").await, 3);
    db.exec(&format!("DROP TABLE {table}")).await;
}

fn item(id: &str, body: &str) -> BatchItem<Msg> {
    BatchItem {
        key: MessageKey::new(id),
        message: Msg::new(id, body),
        metadata: Metadata::default(),
    }
}

fn settled_as(result: &idem_runtime::Result<Outcome<String>>) -> String {
    match result {
        Ok(Outcome::Processed(output)) => format!("processed {output}"),
        Ok(Outcome::Duplicate(output)) => format!("duplicate {output}"),
        Err(error) => error.code().to_owned(),
    }
}

async fn effects_of(db: &TestDb, effects: &str, key: &str) -> i64 {
    db.count(effects, &format!("message_key = '{key}'")).await
}

async fn a_mixed_slice_batch_settles_each_message_as_it_would_alone(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let slicer = Slicer::new(&effects);
    // Records from earlier deliveries: one completed, one to be reused with other content, one
    // expired (a recorder with a short retention, on the same consumer).
    for id in ["dup", "mismatch"] {
        inbox
            .process(&slicer, Msg::new(id, "a"), &Metadata::default())
            .await
            .unwrap();
    }
    let mut short = Recorder::new(&db, &effects, SLICER_CONSUMER);
    short.retention = Some(Duration::from_millis(50));
    inbox
        .process(&short, Msg::new("expired", "a"), &Metadata::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    slicer.forget_calls();
    let items = vec![
        item("fresh-1", "a"),
        item("dup", "a"),
        item("mismatch", "b"),
        item("failing", "fail"),
        item("panicking", "panic"),
        item("short", "short"),
        item("expired", "a"),
        item("fresh-2", "a"),
        item("fresh-2", "a"),
        item("fresh-3", "a"),
        item("fresh-3", "c"),
        BatchItem {
            key: Err(KeyError::Missing("order id")),
            message: Msg::new("", "a"),
            metadata: Metadata::default(),
        },
    ];
    let results = inbox.process_slices(&slicer, items).await;
    let settled: Vec<String> = results.iter().map(settled_as).collect();
    assert_eq!(
        settled,
        [
            "processed did a",
            "duplicate did a",
            "fingerprint-mismatch",
            "handler-error",
            "handler-panicked",
            "handler-error",
            "processed did a",
            "processed did a",
            "duplicate did a",
            "processed did a",
            "fingerprint-mismatch",
            "invalid-key",
        ]
    );
    // The first call had every fresh message, in the order of their keys.
    assert_eq!(
        slicer.calls()[0],
        [
            "failing",
            "fresh-1",
            "fresh-2",
            "fresh-3",
            "panicking",
            "short"
        ]
    );
    for (key, expected) in [
        ("fresh-1", 1),
        ("fresh-2", 1),
        ("fresh-3", 1),
        ("dup", 1),
        ("mismatch", 1),
        ("expired", 2),
        ("failing", 0),
        ("panicking", 0),
        ("short", 0),
    ] {
        assert_eq!(effects_of(&db, &effects, key).await, expected, "{key}");
    }
    for key in ["failing", "panicking", "short"] {
        let record = inbox
            .lookup(&inbox_key(SLICER_CONSUMER, key))
            .await
            .unwrap();
        assert_eq!(record, None, "{key}");
    }
    let record = inbox
        .lookup(&inbox_key(SLICER_CONSUMER, "fresh-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.output.as_deref(), Some("\"did a\""));
    // Their redelivery, fixed, is processed.
    let again = inbox
        .process_slices(&slicer, vec![item("failing", "ok"), item("short", "ok")])
        .await;
    assert!(again.iter().all(|r| matches!(r, Ok(Outcome::Processed(_)))));
}

/// One failing message among 64 is found in a few calls: the slice is halved, down to it.
async fn a_failing_message_is_found_by_halving(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let slicer = Slicer::new(&effects);
    let items = (0..64)
        .map(|i| {
            let id = format!("o-{i:02}");
            item(&id, if i == 37 { "fail" } else { "ok" })
        })
        .collect();
    let results = inbox.process_slices(&slicer, items).await;
    for (i, result) in results.iter().enumerate() {
        let expected = if i == 37 {
            "handler-error"
        } else {
            "processed did ok"
        };
        assert_eq!(settled_as(result), expected, "o-{i:02}");
    }
    // The whole slice, then the two halves of each failing slice, down to the culprit: six
    // halvings of 64.
    let calls = slicer.calls();
    assert_eq!(calls.len(), 1 + 2 * 6, "{calls:?}");
    assert!(calls.contains(&vec!["o-37".to_owned()]), "{calls:?}");
    assert_eq!(db.count(&effects, "1=1").await, 63);
}

/// A slice first runs with no savepoint, as a hand-written multi-row batch does: a call that
/// swallows a failed statement returns as if it succeeded. On PostgreSQL, where that aborts the
/// transaction, the completion finds it: the batch is rolled back and runs again under
/// savepoints, halving down to the culprit, which fails alone while the others commit once.
/// Elsewhere the transaction stays usable and every message is processed.
async fn a_slice_that_breaks_its_transaction_is_found_by_the_completion(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let slicer = Slicer::new(&effects);
    let items = (0..8)
        .map(|i| {
            let id = format!("s-{i}");
            item(&id, if i == 5 { "swallow" } else { "ok" })
        })
        .collect();
    let results = inbox.process_slices(&slicer, items).await;
    let postgres = backend == Backend::Postgres;
    for (i, result) in results.iter().enumerate() {
        let expected = match i {
            5 if postgres => "transaction-aborted",
            5 => "processed did swallow",
            _ => "processed did ok",
        };
        assert_eq!(settled_as(result), expected, "s-{i}");
    }
    let calls = slicer.calls();
    if postgres {
        // Unguarded, then halves under savepoints down to the culprit.
        assert_eq!(calls.len(), 1 + 2 * 3, "{calls:?}");
        assert_eq!(effects_of(&db, &effects, "s-5").await, 0);
        assert_eq!(
            inbox
                .lookup(&inbox_key(SLICER_CONSUMER, "s-5"))
                .await
                .unwrap(),
            None
        );
    } else {
        assert_eq!(calls.len(), 1, "{calls:?}");
    }
    assert_eq!(
        db.count(&effects, "1=1").await,
        if postgres { 7 } else { 8 }
    );
}

/// A handler's own database unreachable is no one message's fault: its slice fails at once, each
/// message with the outage (requeued without counting), instead of halving into the same outage.
async fn an_outage_of_the_handlers_own_database_fails_its_slice_in_one_call(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let slicer = Slicer::new(&effects);
    let items = (0..16)
        .map(|i| item(&format!("o-{i:02}"), if i == 5 { "outage" } else { "ok" }))
        .collect();
    let results = inbox.process_slices(&slicer, items).await;
    for (i, result) in results.iter().enumerate() {
        assert_eq!(settled_as(result), "database-unavailable", "o-{i:02}");
        assert!(!result.as_ref().unwrap_err().counts_as_attempt());
    }
    assert_eq!(slicer.calls().len(), 1, "{:?}", slicer.calls());
    assert_eq!(db.count(&effects, "1=1").await, 0);
}

/// A slice's handler chosen as a deadlock's victim: MySQL/MariaDB roll the batch's whole
/// transaction back under it. No message of the slice is at fault: each is requeued as
/// contention (not counted), nothing of the batch is committed, and the next delivery
/// processes them all.
async fn a_deadlock_under_a_slice_requeues_its_messages(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let locks = db.table("idem_slice_locks");
    let heavy = db.table("idem_slice_heavy");
    db.exec(&format!("CREATE TABLE {locks} (id INT PRIMARY KEY, n INT)"))
        .await;
    db.exec(&format!("INSERT INTO {locks} VALUES (1, 0), (2, 0)"))
        .await;
    db.exec(&format!("CREATE TABLE {heavy} (n INT)")).await;
    let (go, rival) = rival_of_the_first_call(&db, &locks, &heavy).await;
    let handler = Deadlocking {
        slicer: Slicer::new(&effects),
        locks: locks.clone(),
        go: std::sync::Mutex::new(Some(go)),
    };
    let items = || (0..4).map(|i| item(&format!("d-{i}"), "ok")).collect();
    let results = inbox.process_slices(&handler, items()).await;
    rival.await.unwrap();
    for (i, result) in results.iter().enumerate() {
        assert_eq!(settled_as(result), "database-contention", "d-{i}");
        assert!(!result.as_ref().unwrap_err().counts_as_attempt());
    }
    assert_eq!(db.count(&effects, "1=1").await, 0);
    let again = inbox.process_slices(&handler, items()).await;
    assert!(again.iter().all(|r| matches!(r, Ok(Outcome::Processed(_)))));
    assert_eq!(db.count(&effects, "1=1").await, 4);
}

/// A transaction that locks row 2 of `locks` after writing enough rows of `heavy` not to be the
/// deadlock's victim; told to go on, it locks row 1 and commits once it has it.
async fn rival_of_the_first_call(
    db: &TestDb,
    locks: &str,
    heavy: &str,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let pool = db.another_pool(1).await;
    let tx = pool.begin().await.unwrap();
    let rows = (0..1000).map(|n| format!("({n})")).collect::<Vec<_>>();
    let fill = format!("INSERT INTO {heavy} (n) VALUES {}", rows.join(", "));
    tx.execute_unprepared(&fill).await.unwrap();
    let lock = |id: u8| format!("UPDATE {locks} SET n = n + 1 WHERE id = {id}");
    tx.execute_unprepared(&lock(2)).await.unwrap();
    let (go, told) = tokio::sync::oneshot::channel();
    let second = lock(1);
    let rival = tokio::spawn(async move {
        told.await.unwrap();
        tx.execute_unprepared(&second).await.unwrap();
        tx.commit().await.unwrap();
    });
    (go, rival)
}

/// A slice handler that, in its first call, locks row 1 of `locks`, lets the rival go on to
/// wait for it, and then waits for row 2, which the rival holds: a deadlock, this transaction
/// its victim. Then it runs as [`Slicer`] does.
struct Deadlocking {
    slicer: Slicer,
    locks: String,
    go: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
}

impl Deadlocking {
    async fn lock_both(&self, tx: &DatabaseTransaction) -> Result<(), DbErr> {
        let lock = |id: u8| format!("UPDATE {} SET n = n + 1 WHERE id = {id}", self.locks);
        let go = self.go.lock().unwrap().take();
        tx.execute_unprepared(&lock(1)).await?;
        if let Some(go) = go {
            go.send(()).unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        tx.execute_unprepared(&lock(2)).await?;
        Ok(())
    }
}

impl Handler for Deadlocking {
    type Message = Msg;
    type Output = String;
    type Error = SlicerError;

    fn consumer(&self) -> &str {
        self.slicer.consumer()
    }
    fn key(&self, msg: &Msg, meta: &Metadata) -> Result<MessageKey, KeyError> {
        self.slicer.key(msg, meta)
    }
    fn fingerprint(
        &self,
        msg: &Msg,
        meta: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        self.slicer.fingerprint(msg, meta)
    }
    async fn handle(&self, cx: &Context<'_>, msg: Msg) -> Result<String, SlicerError> {
        self.lock_both(cx.transaction().expect("transactional"))
            .await?;
        self.slicer.handle(cx, msg).await
    }
}

impl SliceHandler for Deadlocking {
    async fn handle_slice(
        &self,
        cx: &SliceContext<'_>,
        messages: Vec<Msg>,
    ) -> Result<Vec<String>, SlicerError> {
        self.lock_both(cx.transaction()).await?;
        self.slicer.handle_slice(cx, messages).await
    }
}

/// A message of a slice stages through its own context: its events carry the id derived from
/// that message, as they would alone, and commit with it.
async fn a_slice_stages_each_messages_events_under_its_own_ids(backend: Backend) {
    let db = TestDb::connect(backend).await;
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
    let effects = db.effects_table().await;
    let slicer = Slicer::new(&effects);
    let items = vec![
        item("a", "stage"),
        item("b", "ok"),
        item("c", "stage"),
        item("d", "fail"),
    ];
    let results = inbox.process_slices(&slicer, items).await;
    let settled: Vec<String> = results.iter().map(settled_as).collect();
    assert_eq!(
        settled,
        [
            "processed did stage",
            "processed did ok",
            "processed did stage",
            "handler-error"
        ]
    );
    let batch = outbox.take_pending(100).await.unwrap();
    let mut ids: Vec<String> = batch
        .messages()
        .iter()
        .map(|m| m.message_id.clone())
        .collect();
    ids.sort();
    let mut expected: Vec<String> = ["a", "c"]
        .iter()
        .map(|key| derived_id(&inbox_key(SLICER_CONSUMER, key), 0))
        .collect();
    expected.sort();
    assert_eq!(ids, expected);
}

/// The keys both processes take, in batches of this many.
const SHARED_KEYS: usize = 1000;
const SLICE: usize = 20;

/// Two processes (this one and a child running [`slice_worker`]) process the same keys in
/// slices at once, each from two tasks: one effect per key, every copy but one a duplicate.
async fn slices_from_two_processes_sharing_keys_have_one_effect_per_key(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    // Both start at this moment, the child connected by then.
    let start = SystemTime::now() + Duration::from_secs(2);
    let start_ms = start.duration_since(UNIX_EPOCH).unwrap().as_millis();
    let child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &idem_tests::test_named(module_path!(), "slice_worker"),
            "--ignored",
            "--nocapture",
        ])
        .env("IDEM_SLICE_CHILD_URL", db.url())
        .env("IDEM_SLICE_CHILD_BACKEND", format!("{backend:?}"))
        .env("IDEM_SLICE_CHILD_INBOX", inbox.table().as_str())
        .env("IDEM_SLICE_CHILD_EFFECTS", &effects)
        .env("IDEM_SLICE_CHILD_START", start_ms.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the child worker starts");
    wait_until(start).await;
    let processed = process_shared_keys(&inbox, &effects).await;
    let output = child.wait_with_output().await.unwrap();
    assert!(
        output.status.success(),
        "the child worker failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let child_processed: usize = String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("processed "))
        .and_then(|n| n.trim().parse().ok())
        .expect("the child says how many it processed");
    assert_eq!(processed + child_processed, SHARED_KEYS);
    // Both took part. (SQLite's busy handler makes a process waiting for the file sleep and
    // try again, while the process that writes takes it again at once: there one process may
    // do all the work.)
    if backend != Backend::Sqlite {
        assert!(
            processed > 0 && child_processed > 0,
            "{processed} and {child_processed}"
        );
    }
    // One effect per key: as many rows as keys, every key among them.
    assert_eq!(db.count(&effects, "1=1").await, SHARED_KEYS as i64);
    let distinct = format!("message_key IN (SELECT DISTINCT message_key FROM {effects})");
    assert_eq!(db.count(&effects, &distinct).await, SHARED_KEYS as i64);
}

/// Processes every shared key in slices from two tasks, each running until all are settled;
/// returns how many this process processed.
async fn process_shared_keys(inbox: &Inbox, effects: &str) -> usize {
    let run = |offset: usize| {
        let (inbox, slicer) = (inbox.clone(), Slicer::new(effects));
        tokio::spawn(async move {
            let mut processed = 0;
            let mut pending: Vec<usize> = (0..SHARED_KEYS).collect();
            pending.rotate_left(offset);
            while !pending.is_empty() {
                let mut retry = Vec::new();
                for chunk in pending.chunks(SLICE) {
                    let items = chunk
                        .iter()
                        .map(|i| item(&format!("k-{i:03}"), "ok"))
                        .collect();
                    let results = inbox.process_slices(&slicer, items).await;
                    for (i, result) in chunk.iter().zip(results) {
                        match result {
                            Ok(Outcome::Processed(_)) => processed += 1,
                            Ok(Outcome::Duplicate(_)) => {}
                            // Held by the other process's batch, or contention: again later.
                            Err(error) if error.is_transient() && !error.counts_as_attempt() => {
                                retry.push(*i)
                            }
                            Err(error) => panic!("k-{i:03}: {error}"),
                        }
                    }
                }
                pending = retry;
            }
            processed
        })
    };
    let (first, second) = tokio::join!(run(0), run(SHARED_KEYS / 2));
    first.unwrap() + second.unwrap()
}

/// The other process of [`slices_from_two_processes_sharing_keys_have_one_effect_per_key`]; it
/// does nothing when run on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a worker process started by the slice tests"]
async fn slice_worker() {
    let (Ok(url), Ok(backend), Ok(table), Ok(effects), Ok(start)) = (
        std::env::var("IDEM_SLICE_CHILD_URL"),
        std::env::var("IDEM_SLICE_CHILD_BACKEND"),
        std::env::var("IDEM_SLICE_CHILD_INBOX"),
        std::env::var("IDEM_SLICE_CHILD_EFFECTS"),
        std::env::var("IDEM_SLICE_CHILD_START"),
    ) else {
        return;
    };
    let start = UNIX_EPOCH + Duration::from_millis(start.parse().expect("a start time"));
    let backend = Backend::of_child(&backend);
    let db = TestDb::connect_url(backend, url, 8).await;
    let inbox = Inbox::builder(db.db.clone())
        .table(table)
        .create_table(false)
        .build()
        .await
        .unwrap();
    wait_until(start).await;
    let processed = process_shared_keys(&inbox, &effects).await;
    println!("processed {processed}");
}

/// Sleeps until the wall clock reads `at`.
async fn wait_until(at: SystemTime) {
    if let Ok(left) = at.duration_since(SystemTime::now()) {
        tokio::time::sleep(left).await;
    }
}

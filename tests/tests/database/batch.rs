//! Batch mode on each backend: a batch settles every message as per-message processing would,
//! commits the good ones beside the bad ones, and loses nothing when its transaction is lost.
//!
//! Run: `cargo test -p idem-tests --test database batch::` with PostgreSQL and MariaDB up (see README).

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::admin::InboxAdmin;
use idem_runtime::admin::Status;
use idem_runtime::fingerprint::{Fingerprint, FingerprintError};
use idem_runtime::sea_orm::{ConnectionTrait, DbErr, Statement};
use idem_runtime::transport::BatchChecks;
use idem_runtime::transport::Processing;
use idem_runtime::{
    Context, Error, Handler, Inbox, KeyError, MessageKey, Metadata, Outcome,
    transport::{BatchItem, Settle},
};
use idem_tests::proxy::behind_proxy;
use idem_tests::{Backend, Msg, Recorder, TestDb, inbox_key, on_each_backend};
use idem_tests::{inbox_and_effects as setup, inbox_and_effects_with as setup_with};

on_each_backend!(
    a_mixed_batch_settles_each_message_as_it_would_alone,
    a_mixed_batch_checked_after_each_handler_settles_the_same,
    a_handler_that_breaks_the_transaction_checked_after_each_fails_alone_or_rolls_back_the_batch,
    a_handler_that_breaks_the_trust_of_the_default_batch_loses_no_message,
    concurrent_batches_sharing_keys_have_one_effect_per_key,
    a_batch_of_duplicates_runs_no_handler,
    an_output_the_database_refuses_fails_only_its_message,
    a_key_held_by_a_long_transaction_delays_only_its_own_message,
);

/// Faults of the database servers'.
mod servers {
    use super::*;
    on_each_backend!([postgres, mysql]:
        a_key_the_table_refuses_fails_only_its_message,
        a_database_lost_mid_batch_requeues_it_uncounted,
        a_database_lost_mid_batch_checked_after_each_handler_requeues_it_the_same,
    );
}

/// Faults of one server's own: PostgreSQL's constraints checked at the commit, MariaDB's tables
/// and locks.
mod server {
    use super::*;
    on_each_backend!([postgres]:
        a_commit_a_deferred_constraint_refuses_fails_only_its_message,
        a_batchs_handlers_wait_for_locks_as_the_application_configured,
    );
    on_each_backend!([mysql]:
        a_table_provisioned_with_another_primary_key_takes_batches,
        a_record_locked_elsewhere_holds_up_no_batch_of_other_keys,
    );
}

const CONSUMER: &str = "batch";

/// A handler whose message body says what it does after writing its effect: `ok`, `fail`,
/// `panic`, `swallow` (a failed statement it ignores), `rollback` (a `ROLLBACK` it ignores, as
/// a swallowed MySQL deadlock would be), `lock-timeout` (its output is PostgreSQL's
/// `lock_timeout` as the handler sees it), `big` (an output of 200 characters), `once-…` (the
/// body inserted into the table `<effects>_once`).
#[derive(Debug, Clone)]
struct Scripted {
    effects: String,
    runs: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Scripted {
    fn new(effects: &str) -> Self {
        Self {
            effects: effects.to_owned(),
            runs: Arc::default(),
        }
    }

    fn runs(&self) -> Vec<String> {
        self.runs.lock().unwrap().clone()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ScriptError(String);

impl From<DbErr> for ScriptError {
    fn from(error: DbErr) -> Self {
        Self(error.to_string())
    }
}

impl Handler for Scripted {
    type Message = Msg;
    type Output = String;
    type Error = ScriptError;

    fn consumer(&self) -> &str {
        CONSUMER
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
    async fn handle(&self, cx: &Context<'_>, msg: Msg) -> Result<String, ScriptError> {
        self.runs.lock().unwrap().push(msg.id.clone());
        let tx = cx.transaction().expect("transactional");
        idem_tests::db::insert_effect(tx, &self.effects, CONSUMER, &msg.id, &msg.body).await?;
        match msg.body.as_str() {
            "fail" => Err(ScriptError("failing on purpose".into())),
            "panic" => panic!("panicking on purpose"),
            "swallow" => {
                let _ignored = tx
                    .execute_unprepared("INSERT INTO idem_no_such_table VALUES (1)")
                    .await;
                Ok(msg.body)
            }
            "rollback" => {
                let _ignored = tx.execute_unprepared("ROLLBACK").await;
                Ok(msg.body)
            }
            "commit-fail" => {
                let _ignored = tx.execute_unprepared("COMMIT").await;
                Err(ScriptError("failing after committing on its own".into()))
            }
            "lock-timeout" => {
                let sql = "SELECT current_setting('lock_timeout') AS v";
                let statement = Statement::from_string(tx.get_database_backend(), sql);
                let row = tx.query_one_raw(statement).await?.expect("a row");
                Ok(row.try_get::<String>("", "v")?)
            }
            "big" => Ok("x".repeat(200)),
            "huge" => Ok("x".repeat(512 << 10)),
            once if once.starts_with("once-") => {
                // A value a constraint checked at the commit may refuse.
                let sql = format!("INSERT INTO {}_once (v) VALUES ('{once}')", self.effects);
                tx.execute_unprepared(&sql).await?;
                Ok(msg.body)
            }
            _ => Ok(format!("did {}", msg.body)),
        }
    }
}

/// How a batch item settled: `processed`, `duplicate` or its error's code.
fn settled_as(result: &idem_runtime::Result<Outcome<String>>) -> &'static str {
    match result {
        Ok(Outcome::Processed(_)) => "processed",
        Ok(Outcome::Duplicate(_)) => "duplicate",
        Err(error) => error.code(),
    }
}

fn item(id: &str, body: &str) -> BatchItem<Msg> {
    BatchItem {
        key: MessageKey::new(id),
        message: Msg::new(id, body),
        metadata: Metadata::default(),
    }
}

async fn effects_of(db: &TestDb, effects: &str, key: &str) -> i64 {
    db.count(effects, &format!("message_key = '{key}'")).await
}

/// Checks that a message whose handler swallowed a failed statement failed as aborted on
/// PostgreSQL, where that breaks the transaction, and nowhere else; returns whether it did.
fn aborted_on_postgres_only(
    backend: Backend,
    result: &idem_runtime::Result<Outcome<String>>,
) -> bool {
    let broken = backend == Backend::Postgres;
    assert_eq!(
        matches!(result, Err(Error::TransactionAborted { .. })),
        broken,
        "{result:?}"
    );
    broken
}

/// The default batch, its handlers checked once before the commit.
async fn a_mixed_batch_settles_each_message_as_it_would_alone(backend: Backend) {
    mixed_batch(backend, BatchChecks::default()).await;
}

async fn a_mixed_batch_checked_after_each_handler_settles_the_same(backend: Backend) {
    mixed_batch(backend, BatchChecks::EachMessage).await;
}

async fn mixed_batch(backend: Backend, checks: BatchChecks) {
    let (db, inbox, effects) = setup(backend).await;
    let handler = Scripted::new(&effects);
    // Records from earlier deliveries: one completed, one to be reused with other content, one
    // expired (a recorder with a short retention, on the same consumer).
    for id in ["dup", "mismatch"] {
        inbox
            .process(&handler, Msg::new(id, "a"), &Metadata::default())
            .await
            .unwrap();
    }
    let mut short = Recorder::new(&db, &effects, CONSUMER);
    short.retention = Some(Duration::from_millis(50));
    inbox
        .process(&short, Msg::new("expired", "a"), &Metadata::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    handler.runs.lock().unwrap().clear();

    let items = vec![
        item("fresh-1", "a"),
        item("dup", "a"),
        item("mismatch", "b"),
        item("failing", "fail"),
        item("panicking", "panic"),
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
    let results = inbox.process_batch_with(&handler, items, checks).await;
    let settle: Vec<String> = results
        .iter()
        .map(|result| match result {
            Ok(Outcome::Processed(output)) => format!("processed {output}"),
            Ok(Outcome::Duplicate(output)) => format!("duplicate {output}"),
            Err(error) => error.code().to_owned(),
        })
        .collect();
    assert_eq!(
        settle,
        [
            "processed did a",
            "duplicate did a",
            "fingerprint-mismatch",
            "handler-error",
            "handler-panicked",
            "processed did a",
            "processed did a",
            "duplicate did a",
            "processed did a",
            "fingerprint-mismatch",
            "invalid-key",
        ]
    );
    // Only the fresh and expired keys ran; the failing ones rolled back alone. Where the
    // handlers first run without savepoints (PostgreSQL, or checked before the commit), after a
    // failure the others run again with them: a handler that ran before a failing one runs
    // twice, its effects committed once.
    let mut runs = handler.runs();
    runs.sort();
    for failed in ["failing", "panicking"] {
        let times = runs.iter().filter(|run| *run == failed).count();
        assert_eq!(times, 1, "a failure stands: {failed} ran {times} times");
    }
    runs.dedup();
    assert_eq!(
        runs,
        [
            "expired",
            "failing",
            "fresh-1",
            "fresh-2",
            "fresh-3",
            "panicking"
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
    ] {
        assert_eq!(effects_of(&db, &effects, key).await, expected, "{key}");
    }
    for key in ["failing", "panicking"] {
        assert_eq!(inbox.lookup(&inbox_key(CONSUMER, key)).await.unwrap(), None);
    }
    let record = inbox
        .lookup(&inbox_key(CONSUMER, "fresh-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.output.as_deref(), Some("\"did a\""));

    // A redelivery of the failed ones, per message or in a batch, processes them.
    let again = inbox
        .process_batch_with(
            &handler,
            vec![item("failing", "ok"), item("panicking", "ok")],
            checks,
        )
        .await;
    assert!(again.iter().all(|r| matches!(r, Ok(Outcome::Processed(_)))));
    assert_eq!(effects_of(&db, &effects, "failing").await, 1);
}

/// Handlers not trusted to keep the contract, checked after each: no later handler runs
/// outside a transaction one of them ended.
async fn a_handler_that_breaks_the_transaction_checked_after_each_fails_alone_or_rolls_back_the_batch(
    backend: Backend,
) {
    let (db, inbox, effects) = setup(backend).await;
    let handler = Scripted::new(&effects);
    let checked = |items| inbox.process_batch_with(&handler, items, BatchChecks::EachMessage);
    let results = checked(vec![item("a", "ok"), item("b", "swallow"), item("c", "ok")]).await;
    if backend == Backend::Postgres {
        // PostgreSQL aborted the savepoint only: the others commit.
        assert!(matches!(results[1], Err(Error::TransactionAborted { .. })));
        assert!(matches!(results[0], Ok(Outcome::Processed(_))));
        assert!(matches!(results[2], Ok(Outcome::Processed(_))));
        assert_eq!(effects_of(&db, &effects, "b").await, 0);
    } else {
        // Elsewhere a failed statement leaves the transaction usable.
        assert!(
            results
                .iter()
                .all(|r| matches!(r, Ok(Outcome::Processed(_))))
        );
        assert_eq!(effects_of(&db, &effects, "b").await, 1);
    }
    assert_eq!(effects_of(&db, &effects, "a").await, 1);
    assert_eq!(effects_of(&db, &effects, "c").await, 1);

    // The last handler of a batch is checked as the others are.
    let results = checked(vec![item("g", "ok"), item("h", "swallow")]).await;
    assert!(matches!(results[0], Ok(Outcome::Processed(_))));
    let broken = aborted_on_postgres_only(backend, &results[1]);
    assert_eq!(effects_of(&db, &effects, "g").await, 1);
    assert_eq!(effects_of(&db, &effects, "h").await, i64::from(!broken));

    // A transaction rolled back under a handler takes the whole batch with it: that message
    // fails as aborted, the others are rolled back and requeued without counting.
    let results = checked(vec![
        item("d", "ok"),
        item("e", "rollback"),
        item("f", "ok"),
        item("a", "ok"),
    ])
    .await;
    let error = results[1].as_ref().unwrap_err();
    assert!(
        matches!(error, Error::TransactionAborted { .. }),
        "{error:?}"
    );
    for other in [&results[0], &results[2]] {
        let error = other.as_ref().unwrap_err();
        assert!(matches!(error, Error::BatchRolledBack { .. }), "{error:?}");
        assert_eq!(error.settle(), Settle::Requeue);
        assert!(!error.counts_as_attempt());
    }
    // A duplicate read from a committed record stands.
    assert!(matches!(results[3], Ok(Outcome::Duplicate(_))));
    for key in ["d", "e", "f"] {
        assert_eq!(effects_of(&db, &effects, key).await, 0, "{key}");
        assert_eq!(inbox.lookup(&inbox_key(CONSUMER, key)).await.unwrap(), None);
    }

    // A handler that ends the transaction and then fails: its error stands, and the batch is
    // lost with the transaction, no later handler running outside it.
    let results = checked(vec![
        item("p", "ok"),
        item("q", "commit-fail"),
        item("r", "ok"),
    ])
    .await;
    assert_eq!(
        results[1].as_ref().unwrap_err().code(),
        "handler-error",
        "{:?}",
        results[1]
    );
    for other in [&results[0], &results[2]] {
        let error = other.as_ref().unwrap_err();
        assert!(matches!(error, Error::BatchRolledBack { .. }), "{error:?}");
    }
    assert_eq!(effects_of(&db, &effects, "r").await, 0);

    // The last handler of a batch ending the transaction is found as the others are.
    let results = checked(vec![item("x", "ok"), item("y", "rollback")]).await;
    assert!(
        matches!(results[1], Err(Error::TransactionAborted { .. })),
        "{:?}",
        results[1]
    );
    assert!(
        matches!(results[0], Err(Error::BatchRolledBack { .. })),
        "{:?}",
        results[0]
    );
    for key in ["x", "y"] {
        assert_eq!(effects_of(&db, &effects, key).await, 0, "{key}");
    }
}

/// The default batch trusts its handlers as hand-written batch code trusts its own, checking
/// the transaction once before the commit; a handler that breaks that trust loses no message.
async fn a_handler_that_breaks_the_trust_of_the_default_batch_loses_no_message(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let handler = Scripted::new(&effects);
    let trusted = |items| inbox.process_batch(&handler, items);

    // A failed statement the handler swallowed: PostgreSQL aborted the transaction, which the
    // check before the commit finds; the batch runs again checked, and only that message fails.
    // Elsewhere the transaction stays usable, and every message is processed.
    let results = trusted(vec![item("a", "ok"), item("b", "swallow"), item("c", "ok")]).await;
    let broken = aborted_on_postgres_only(backend, &results[1]);
    assert!(matches!(results[0], Ok(Outcome::Processed(_))));
    assert!(matches!(results[2], Ok(Outcome::Processed(_))));
    for (key, expected) in [("a", 1), ("b", i64::from(!broken)), ("c", 1)] {
        assert_eq!(effects_of(&db, &effects, key).await, expected, "{key}");
    }

    // A handler that rolls the transaction back: the batch runs again checked, which finds it
    // (its attempt counts, so a handler that always does so is dead-lettered in the end);
    // nothing of the batch is recorded, and the others are requeued uncounted. What the broken
    // trust cost: the handler after it wrote outside the transaction, in the trusted try.
    let results = trusted(vec![
        item("d", "ok"),
        item("e", "rollback"),
        item("f", "ok"),
    ])
    .await;
    assert!(
        matches!(results[1], Err(Error::TransactionAborted { .. })),
        "{:?}",
        results[1]
    );
    assert!(results[1].as_ref().unwrap_err().counts_as_attempt());
    for other in [&results[0], &results[2]] {
        let error = other.as_ref().unwrap_err();
        assert!(matches!(error, Error::BatchRolledBack { .. }), "{error:?}");
        assert_eq!(error.settle(), Settle::Requeue);
        assert!(!error.counts_as_attempt());
    }
    for key in ["d", "e", "f"] {
        assert_eq!(inbox.lookup(&inbox_key(CONSUMER, key)).await.unwrap(), None);
    }
    assert_eq!(effects_of(&db, &effects, "d").await, 0);
    assert_eq!(effects_of(&db, &effects, "f").await, 1);
    let results = trusted(vec![item("d", "ok"), item("e", "ok")]).await;
    assert!(
        results
            .iter()
            .all(|r| matches!(r, Ok(Outcome::Processed(_))))
    );
    assert_eq!(effects_of(&db, &effects, "d").await, 1);
}

/// A MariaDB inbox table provisioned by hand with a surrogate primary key, the message keys
/// unique beside it: batch statements cannot name the primary key to look keys up, and still
/// settle every message, locking only their own records.
async fn a_table_provisioned_with_another_primary_key_takes_batches(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let table = db.table("provisioned");
    db.exec(&format!(
        "CREATE TABLE {table} (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
         consumer VARBINARY(128) NOT NULL, message_key VARBINARY(255) NOT NULL, \
         status VARCHAR(16) NOT NULL, fingerprint BINARY(32) NULL, output TEXT NULL, \
         attempts BIGINT NOT NULL, claim_token BIGINT NOT NULL, created_at BIGINT NOT NULL, \
         claimed_at BIGINT NOT NULL, lease_until BIGINT NULL, completed_at BIGINT NULL, \
         expires_at BIGINT NOT NULL, UNIQUE KEY {table}_key (consumer, message_key), \
         INDEX {table}_expires (expires_at)) ENGINE=InnoDB"
    ))
    .await;
    let inbox = Inbox::builder(db.db.clone())
        .table(table.as_str())
        .create_table(false)
        .build()
        .await
        .expect("the provisioned table is accepted");
    batches_beside_a_locked_record(&db, &inbox).await;
}

/// On idem's own MariaDB table, batch statements look their keys up through the primary key:
/// another record of the consumer locked by a long transaction holds none of them up.
async fn a_record_locked_elsewhere_holds_up_no_batch_of_other_keys(backend: Backend) {
    let (db, inbox, _) = setup(backend).await;
    batches_beside_a_locked_record(&db, &inbox).await;
}

/// Runs three batches while another transaction holds a record of the same consumer locked
/// (its key ordered before the batches' keys, so that its lock covers no gap they go into), and
/// checks that each message settled as it would alone, in time: the batch's statements (claims,
/// reads, completions, and the release of failed messages' claims) lock the records of their own
/// keys, not the consumer's, even when their keys are most of the consumer's records (MariaDB
/// reads an `IN` list, or a join in the order it chooses, by a scan of them). The first batch's
/// two messages fail while the consumer has no other record.
async fn batches_beside_a_locked_record(db: &TestDb, inbox: &Inbox) {
    let table = inbox.table().as_str();
    db.exec(&format!(
        "INSERT INTO {table} (consumer, message_key, status, attempts, claim_token, created_at, \
         claimed_at, expires_at) VALUES ('{CONSUMER}', '0', 'completed', 1, 1, 0, 0, {})",
        i64::MAX
    ))
    .await;
    let holder = db.hold_record(table, CONSUMER, "0").await;
    let effects = db.effects_table().await;
    let handler = Scripted::new(&effects);
    let batches = async {
        let failed = inbox
            .process_batch(&handler, vec![item("d", "fail"), item("e", "fail")])
            .await;
        // Keys that are most of the consumer's records: read by an `IN` list, MariaDB scans
        // them all.
        let wide = || (0..12).map(|i| item(&format!("w{i:02}"), "ok")).collect();
        let wide_first = inbox.process_batch(&handler, wide()).await;
        // Statistics as the server keeps them once a tenth of a table changed.
        db.exec(&format!("ANALYZE TABLE {table}")).await;
        let wide_again = inbox.process_batch(&handler, wide()).await;
        let failed: Vec<_> = failed
            .into_iter()
            .chain(wide_first)
            .chain(wide_again)
            .collect();
        let first = inbox
            .process_batch(
                &handler,
                vec![item("a", "ok"), item("b", "ok"), item("a", "ok")],
            )
            .await;
        let again = inbox
            .process_batch(
                &handler,
                vec![item("a", "ok"), item("b", "other"), item("c", "ok")],
            )
            .await;
        (failed, first, again)
    };
    let (failed, first, again) = tokio::time::timeout(Duration::from_secs(20), batches)
        .await
        .expect("no batch waits for a record it does not use");
    holder.rollback().await.unwrap();
    let settle: Vec<&str> = failed
        .iter()
        .chain(&first)
        .chain(&again)
        .map(settled_as)
        .collect();
    let expected: Vec<&str> = ["handler-error"; 2]
        .into_iter()
        .chain(["processed"; 12])
        .chain(["duplicate"; 12])
        .chain([
            "processed",
            "processed",
            "duplicate",
            "duplicate",
            "fingerprint-mismatch",
            "processed",
        ])
        .collect();
    assert_eq!(settle, expected);
    for key in ["a", "b", "c"] {
        assert_eq!(effects_of(db, &effects, key).await, 1, "{key}");
        let record = inbox.lookup(&inbox_key(CONSUMER, key)).await.unwrap();
        assert_eq!(record.map(|record| record.status), Some(Status::Completed));
    }
    for i in 0..12 {
        assert_eq!(effects_of(db, &effects, &format!("w{i:02}")).await, 1);
    }
    for key in ["d", "e"] {
        assert_eq!(effects_of(db, &effects, key).await, 0, "{key}");
        let record = inbox.lookup(&inbox_key(CONSUMER, key)).await.unwrap();
        assert!(record.is_none(), "the claim of failed {key} is released");
    }
}

async fn concurrent_batches_sharing_keys_have_one_effect_per_key(backend: Backend) {
    let (db, inbox, effects) =
        setup_with(backend, |inbox| inbox.claim_wait(Duration::from_secs(10))).await;
    // A second pool stands for a second process.
    let other = Inbox::builder(if backend == Backend::Sqlite {
        db.db.clone()
    } else {
        db.another_pool(4).await
    })
    .table(inbox.table().as_str())
    .build()
    .await
    .unwrap();
    let handler = Scripted::new(&effects);
    let keys: Vec<String> = (0..200).map(|i| format!("k{i:03}")).collect();
    let mut tasks = Vec::new();
    for worker in 0..4 {
        let inbox = if worker % 2 == 0 {
            inbox.clone()
        } else {
            other.clone()
        };
        let handler = handler.clone();
        // Half the workers trust their handlers: both kinds of batch share the keys.
        let checks = if worker % 2 == 0 {
            BatchChecks::EachMessage
        } else {
            BatchChecks::BeforeCommit
        };
        // Each worker sees every key, in its own order and batch boundaries.
        let mut mine = keys.clone();
        mine.rotate_left(worker * 37);
        if worker % 2 == 1 {
            mine.reverse();
        }
        tasks.push(tokio::spawn(async move {
            let mut pending = mine;
            while !pending.is_empty() {
                let mut requeued = Vec::new();
                for chunk in pending.chunks(25 + worker * 10) {
                    let items = chunk.iter().map(|key| item(key, "ok")).collect();
                    let results = inbox.process_batch_with(&handler, items, checks).await;
                    for (key, result) in chunk.iter().zip(results) {
                        match result {
                            Ok(_) => {}
                            Err(error) if error.settle() == Settle::Requeue => {
                                requeued.push(key.clone())
                            }
                            Err(error) => panic!("{key}: {error:?}"),
                        }
                    }
                }
                pending = requeued;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    // Every key was processed or found processed by each worker, so each has an effect; 200
    // in all means one each.
    assert_eq!(db.count(&effects, "1=1").await, 200);
}

async fn a_batch_of_duplicates_runs_no_handler(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let handler = Scripted::new(&effects);
    let items = || (0..50).map(|i| item(&format!("o{i}"), "ok")).collect();
    let first = inbox.process_batch(&handler, items()).await;
    assert!(first.iter().all(|r| matches!(r, Ok(Outcome::Processed(_)))));
    let again = inbox.process_batch(&handler, items()).await;
    assert!(
        again
            .iter()
            .all(|r| matches!(r, Ok(Outcome::Duplicate(output)) if output == "did ok"))
    );
    assert_eq!(handler.runs().len(), 50);
    assert_eq!(db.count(&effects, "1=1").await, 50);
}

async fn an_output_the_database_refuses_fails_only_its_message(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let table = inbox.table().as_str().to_owned();
    // The database refuses outputs of 100 characters or more, as a packet limit would.
    db.refuse_outputs_from(&table, 100).await;
    let handler = Scripted::new(&effects);
    let results = inbox
        .process_batch(
            &handler,
            vec![item("a", "ok"), item("b", "big"), item("c", "ok")],
        )
        .await;
    let error = results[1].as_ref().unwrap_err();
    assert_eq!(error.code(), "output-not-storable", "{error:?}");
    assert!(matches!(error.settle(), Settle::DeadLetter(_)));
    // The others run again without it, and commit.
    for other in [&results[0], &results[2]] {
        assert!(matches!(other, Ok(Outcome::Processed(_))), "{other:?}");
    }
    assert_eq!(db.count(&effects, "1=1").await, 2);
    assert_eq!(effects_of(&db, &effects, "b").await, 0);
    assert_eq!(inbox.lookup(&inbox_key(CONSUMER, "b")).await.unwrap(), None);
}

/// A batch's claims wait for a rival's key no longer than the claim wait, and the statement
/// that claims them ends that bound: the handlers' own statements wait for locks as long as
/// the application configured (here, as PostgreSQL's default, for ever), with and without
/// checks after each handler.
async fn a_batchs_handlers_wait_for_locks_as_the_application_configured(backend: Backend) {
    let (_db, inbox, effects) = setup_with(backend, |inbox| {
        inbox.claim_wait(Duration::from_millis(250))
    })
    .await;
    let handler = Scripted::new(&effects);
    for (round, checks) in [BatchChecks::BeforeCommit, BatchChecks::EachMessage]
        .into_iter()
        .enumerate()
    {
        let items = (0..3)
            .map(|i| item(&format!("lt-{round}-{i}"), "lock-timeout"))
            .collect();
        let results = inbox.process_batch_with(&handler, items, checks).await;
        for result in &results {
            assert!(
                matches!(result, Ok(Outcome::Processed(seen)) if seen == "0"),
                "{checks:?}: {result:?}"
            );
        }
    }
}

async fn a_key_held_by_a_long_transaction_delays_only_its_own_message(backend: Backend) {
    if backend == Backend::Sqlite {
        // One writer at a time: a long transaction holds the whole file, not one key.
        return;
    }
    let (db, inbox, effects) = setup_with(backend, |inbox| {
        inbox.claim_wait(Duration::from_millis(500))
    })
    .await;
    // Held far longer than the batch's waits (a 1 s claim wait on MySQL/MariaDB, then the
    // per-message claim's), with room for a loaded machine: seen finishing first at 3 s.
    let slow = Recorder::new(&db, &effects, CONSUMER).slow(Duration::from_secs(8));
    let held = {
        let (inbox, slow) = (inbox.clone(), slow.clone());
        tokio::spawn(async move {
            inbox
                .process(&slow, Msg::new("held", "ok"), &Metadata::default())
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let handler = Scripted::new(&effects);
    let results = inbox
        .process_batch(
            &handler,
            vec![item("a", "ok"), item("held", "ok"), item("b", "ok")],
        )
        .await;
    assert!(
        matches!(results[0], Ok(Outcome::Processed(_))),
        "{:?}",
        results[0]
    );
    assert!(
        matches!(results[2], Ok(Outcome::Processed(_))),
        "{:?}",
        results[2]
    );
    let error = results[1].as_ref().unwrap_err();
    assert!(
        matches!(error, Error::InProgressElsewhere { .. }),
        "{error:?}"
    );
    assert!(!error.counts_as_attempt());
    assert!(matches!(held.await.unwrap(), Ok(Outcome::Processed(_))));
    assert_eq!(db.count(&effects, "1=1").await, 3);
}

/// A database lost mid-batch requeues the batch, uncounted; once it is back, every message is
/// processed once.
async fn a_database_lost_mid_batch_requeues_it_uncounted(backend: Backend) {
    lost_mid_batch(backend, BatchChecks::default()).await;
}

/// The same for a batch whose handlers are checked after each.
async fn a_database_lost_mid_batch_checked_after_each_handler_requeues_it_the_same(
    backend: Backend,
) {
    lost_mid_batch(backend, BatchChecks::EachMessage).await;
}

async fn lost_mid_batch(backend: Backend, checks: BatchChecks) {
    let (db, proxy) = behind_proxy(backend).await;
    let inbox = Inbox::builder(db.db.clone())
        .table(db.table("inbox"))
        .build()
        .await
        .unwrap();
    let effects = db.effects_table().await;
    let slow = Recorder::new(&db, &effects, CONSUMER).slow(Duration::from_millis(300));
    let items = || {
        (0..4)
            .map(|i| BatchItem {
                key: MessageKey::new(format!("o-{i}")),
                message: Msg::new(format!("o-{i}"), "a"),
                metadata: Metadata::default(),
            })
            .collect::<Vec<_>>()
    };
    let run = {
        let (inbox, slow) = (inbox.clone(), slow.clone());
        tokio::spawn(async move { inbox.process_batch_with(&slow, items(), checks).await })
    };
    tokio::time::sleep(Duration::from_millis(450)).await;
    proxy.cut().await;
    for result in run.await.unwrap() {
        let error = result.unwrap_err();
        assert!(error.is_store_unavailable(), "{error:?}");
        assert!(!error.counts_as_attempt());
    }
    proxy.restore();
    let mut results = inbox.process_batch_with(&slow, items(), checks).await;
    for _ in 0..20 {
        if results.iter().all(Result::is_ok) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        results = inbox.process_batch_with(&slow, items(), checks).await;
    }
    assert!(
        results
            .iter()
            .all(|r| matches!(r, Ok(Outcome::Processed(_)))),
        "{results:?}"
    );
    assert_eq!(db.count(&effects, "1=1").await, 4);
}

/// A constraint checked at the commit (PostgreSQL's `DEFERRABLE INITIALLY DEFERRED`) refuses
/// what one handler of the batch wrote: the commit fails for the whole batch, and only each
/// message's own commit tells whose write it was. That message fails alone; the others commit.
async fn a_commit_a_deferred_constraint_refuses_fails_only_its_message(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let once = format!("{effects}_once");
    db.exec(&format!(
        "CREATE TABLE {once} (v TEXT, CONSTRAINT {once}_v UNIQUE (v) DEFERRABLE INITIALLY DEFERRED)"
    ))
    .await;
    db.exec(&format!("INSERT INTO {once} (v) VALUES ('once-taken')"))
        .await;
    let handler = Scripted::new(&effects);
    let results = inbox
        .process_batch(
            &handler,
            vec![
                item("a", "once-a"),
                item("b", "once-taken"),
                item("c", "once-c"),
                // A failing handler: the others run again with a savepoint each.
                item("d", "fail"),
            ],
        )
        .await;
    db.exec(&format!("DROP TABLE {once}")).await;
    let settle: Vec<&str> = results.iter().map(settled_as).collect();
    assert_eq!(
        settle,
        ["processed", "database-error", "processed", "handler-error"]
    );
    for (key, effect) in [("a", 1), ("b", 0), ("c", 1), ("d", 0)] {
        assert_eq!(effects_of(&db, &effects, key).await, effect, "{key}");
    }
    assert!(
        inbox
            .lookup(&inbox_key(CONSUMER, "b"))
            .await
            .unwrap()
            .is_none()
    );
}

/// A key the inbox table refuses (a check constraint added by its operators) fails its own
/// message only: the batch's claim statement is refused whole, and each message goes its own way.
/// A batch whose outputs together outgrow what one statement may carry (MariaDB's
/// `max_allowed_packet`, 16 MiB by default; here 40 outputs of 512 KiB) completes: the server
/// refused the single completion statement and closed the connection, and the batch was
/// requeued again and again. MariaDB.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_whose_outputs_outgrow_one_statement_completes() {
    let (db, inbox, effects) = idem_tests::inbox_and_effects(Backend::MySql).await;
    let handler = Scripted::new(&effects);
    let keys: Vec<String> = (0..40).map(|i| format!("h-{i}")).collect();
    let items = keys.iter().map(|key| item(key, "huge")).collect();
    let results = inbox.process_batch(&handler, items).await;
    let settle: Vec<&str> = results.iter().map(settled_as).collect();
    assert_eq!(settle, vec!["processed"; 40]);
    assert_eq!(db.count(&effects, "1=1").await, 40);
}

/// A statement of the batch refused for a reason of the database's own (here a claim cancelled
/// once, as by a statement timeout on a large batch) is no message's fault: each message goes
/// the per-message way, where it is processed. Every message was counted an attempt, and
/// repeated, a batch was dead-lettered whole. PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_statement_refused_by_the_database_counts_against_no_message() {
    let db = TestDb::connect(Backend::Postgres).await;
    let table = db.table("inbox");
    let inbox = Inbox::builder(db.db.clone())
        .table(table.as_str())
        .build()
        .await
        .unwrap();
    let function = format!("{table}_once");
    db.exec(&format!("CREATE SEQUENCE {function}")).await;
    db.exec(&format!(
        "CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
         IF nextval('{function}') = 1 THEN \
         RAISE EXCEPTION 'cancelled once' USING ERRCODE = '57014'; END IF; RETURN NULL; END $$"
    ))
    .await;
    db.exec(&format!(
        "CREATE TRIGGER {function} BEFORE INSERT ON {table} \
         FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
    ))
    .await;
    let effects = db.effects_table().await;
    let handler = Scripted::new(&effects);
    let results = inbox
        .process_batch(
            &handler,
            vec![item("a", "ok"), item("b", "ok"), item("c", "ok")],
        )
        .await;
    let settle: Vec<&str> = results.iter().map(settled_as).collect();
    assert_eq!(settle, ["processed", "processed", "processed"]);
    for key in ["a", "b", "c"] {
        assert_eq!(effects_of(&db, &effects, key).await, 1, "{key}");
    }
}

async fn a_key_the_table_refuses_fails_only_its_message(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let table = db.table("inbox");
    let inbox = Inbox::builder(db.db.clone())
        .table(table.as_str())
        .build()
        .await
        .unwrap();
    db.exec(&format!(
        "ALTER TABLE {table} ADD CONSTRAINT {table}_no_b CHECK (message_key <> 'b')"
    ))
    .await;
    let effects = db.effects_table().await;
    let handler = Scripted::new(&effects);
    let results = inbox
        .process_batch(
            &handler,
            vec![item("a", "ok"), item("b", "ok"), item("c", "ok")],
        )
        .await;
    let settle: Vec<&str> = results.iter().map(settled_as).collect();
    assert_eq!(settle, ["processed", "database-error", "processed"]);
    for (key, effect) in [("a", 1), ("b", 0), ("c", 1)] {
        assert_eq!(effects_of(&db, &effects, key).await, effect, "{key}");
    }
}

//! The inbox at the edges of a handler's transaction, on each backend: a handler that swallows a
//! failed statement, or rolls its transaction back, is never reported processed; a copy waits a
//! bounded time for a long handler that holds its key; a claim or a completion the database
//! refuses, and a record changed by hand, each have an error of their own.
//!
//! Run: `cargo test -p idem-tests --test database edges_transactions::` with PostgreSQL and MariaDB up (see
//! README).

use std::time::{Duration, Instant};

use idem_runtime::admin::InboxAdmin;
use idem_runtime::admin::Status;
use idem_runtime::fingerprint::{Fingerprint, FingerprintError};
use idem_runtime::sea_orm::sea_query::{Alias, Expr, ExprTrait, Query};
use idem_runtime::sea_orm::{ConnectionTrait, DbErr};
use idem_runtime::{
    Context, Error, Handler, KeyError, MessageKey, Metadata, Outcome,
    transport::{Processing, Settle},
};
use idem_tests::{Backend, Msg, Recorder, inbox_key, meta, on_each_backend};
use idem_tests::{inbox_and_effects as setup, inbox_and_effects_with as setup_with};

on_each_backend!(
    a_handler_that_swallows_a_failed_statement_is_never_reported_processed,
    a_transaction_the_handler_rolled_back_is_not_reported_processed,
    a_copy_waits_a_bounded_time_for_a_long_handler_then_is_requeued_uncounted,
    a_failed_handlers_claim_is_released_before_its_error_is_returned,
    corrupt_records_and_refused_statements_have_their_own_errors,
);

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

/// A handler's failure answers its caller only once its transaction has been rolled back: a
/// retry that does not wait for locks (as an HTTP retry's claim) runs at once, never told the key
/// is still in progress by a rollback the pool had yet to send.
async fn a_failed_handlers_claim_is_released_before_its_error_is_returned(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let inbox = inbox.without_claim_wait();
    let handler = Recorder::new(&db, &effects, "billing");
    let msg = Msg::new("o-1", "charge");
    handler.fail_next(1);
    // The failing run on a runtime of its own that nobody drives once it has answered: what it
    // left for later (a rollback the pool sends when it gets the connection back) stays undone.
    let left = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let failed = std::thread::scope(|scope| {
        scope
            .spawn(|| left.block_on(inbox.process(&handler, msg.clone(), &meta())))
            .join()
            .expect("the run answers")
    });
    assert!(matches!(failed, Err(Error::Handler { .. })), "{failed:?}");
    let retried = inbox.process(&handler, msg, &meta()).await;
    left.shutdown_background();
    assert!(
        matches!(retried, Ok(Outcome::Processed(_))),
        "the retry found the failed claim still held: {retried:?}"
    );
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

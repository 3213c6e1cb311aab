//! Batch mode's faults, each on the backends it concerns: an outage keeps its kind (a server
//! that takes no writes, a pool with no free connection), one handler's outage or one output too
//! large for the server sinks no other message, a refusal is classified as it would be alone,
//! and the statements' texts do not grow with the batches' sizes.
//!
//! Run: `cargo test -p idem-tests --test database batch_faults::` with PostgreSQL and MariaDB up (see
//! README).

use idem_runtime::sea_orm::{ConnectionTrait, DatabaseConnection, Statement};
use idem_runtime::transport::BatchChecks;
use idem_runtime::transport::Processing;
use idem_runtime::transport::Retry;
use idem_runtime::{MessageKey, Metadata, Outcome, transport::BatchItem};
use idem_tests::script::{Script, another_database_that_is_down};
use idem_tests::{Backend, Msg, TestDb, inbox_and_effects as setup, on_each_backend};

on_each_backend!(
    a_batch_on_a_database_that_takes_no_writes_keeps_the_outage_kind,
    a_batch_whose_pool_has_no_free_connection_keeps_the_outage_kind,
    a_handler_that_loses_its_own_database_fails_alone,
    a_trigger_refusing_an_output_is_classified_as_it_is_alone,
);

/// Faults of MySQL/MariaDB's own.
mod server {
    use super::*;
    on_each_backend!([mysql]:
        an_output_larger_than_a_packet_fails_alone,
        batch_statement_texts_do_not_grow_with_batch_sizes,
    );
}

fn item(id: &str, body: &str) -> BatchItem<Msg> {
    BatchItem {
        key: MessageKey::new(id),
        message: Msg::new(id, body),
        metadata: Metadata::default(),
    }
}

/// How a result settled: `processed`, `duplicate` or its error's code.
fn settled_as(result: &idem_runtime::Result<Outcome<String>>) -> &'static str {
    match result {
        Ok(Outcome::Processed(_)) => "processed",
        Ok(Outcome::Duplicate(_)) => "duplicate",
        Err(error) => error.code(),
    }
}

/// The retry each result calls for (`None` for a success).
fn retries(results: &[idem_runtime::Result<Outcome<String>>]) -> Vec<Option<Retry>> {
    results
        .iter()
        .map(|result| result.as_ref().err().map(Retry::of))
        .collect()
}

async fn effects_of(db: &TestDb, effects: &str, key: &str) -> i64 {
    db.count(effects, &format!("message_key = '{key}'")).await
}

/// A server that takes no writes (a standby, a failover's demoted primary) is an outage no
/// message causes: every message of a batch meeting it is requeued as such (never counted),
/// as it would be alone, however often it comes back.
async fn a_batch_on_a_database_that_takes_no_writes_keeps_the_outage_kind(backend: Backend) {
    for checks in [BatchChecks::EachMessage, BatchChecks::BeforeCommit] {
        let (db, inbox, effects) = setup(backend).await;
        let (inbox, pool) = idem_tests::one_connection_inbox(&db, &inbox).await;
        let handler = Script::new(&effects);
        let (read_only, writable) = backend.read_only_session();
        pool.execute_unprepared(read_only).await.unwrap();
        let items = || (0..5).map(|i| item(&format!("o-{i}"), "ok")).collect();
        for delivery in 1..=3 {
            let results = inbox.process_batch_with(&handler, items(), checks).await;
            assert_eq!(
                retries(&results),
                vec![Some(Retry::NoWrites); 5],
                "delivery {delivery}, {checks:?}: {results:?}"
            );
            let per_message = inbox
                .process(&handler, Msg::new("alone", "ok"), &Metadata::default())
                .await;
            assert_eq!(
                per_message.as_ref().err().map(Retry::of),
                Some(Retry::NoWrites)
            );
        }
        pool.execute_unprepared(writable).await.unwrap();
        let results = inbox.process_batch_with(&handler, items(), checks).await;
        assert!(
            results.iter().all(|r| settled_as(r) == "processed"),
            "{results:?}"
        );
        assert_eq!(db.count(&effects, "1=1").await, 5);
    }
}

/// A pool whose connections are all busy elsewhere: no message of the batch reached the
/// database, and none is counted, as it would not be alone.
async fn a_batch_whose_pool_has_no_free_connection_keeps_the_outage_kind(backend: Backend) {
    for checks in [BatchChecks::EachMessage, BatchChecks::BeforeCommit] {
        let (db, inbox, effects) = setup(backend).await;
        let (inbox, pool) = idem_tests::one_connection_inbox(&db, &inbox).await;
        let handler = Script::new(&effects);
        let items = || (0..5).map(|i| item(&format!("o-{i}"), "ok")).collect();
        let held = idem_runtime::sea_orm::TransactionTrait::begin(&pool)
            .await
            .unwrap();
        let results = inbox.process_batch_with(&handler, items(), checks).await;
        assert_eq!(
            retries(&results),
            vec![Some(Retry::NoConnection); 5],
            "{checks:?}: {results:?}"
        );
        held.rollback().await.unwrap();
        let results = inbox.process_batch_with(&handler, items(), checks).await;
        assert!(
            results.iter().all(|r| settled_as(r) == "processed"),
            "{results:?}"
        );
        assert_eq!(db.count(&effects, "1=1").await, 5);
    }
}

/// A handler whose error carries an unreachable database of its own (another database it
/// reads is down) settles as it would alone, an outage; the other messages of its batch,
/// whose database is fine, commit.
async fn a_handler_that_loses_its_own_database_fails_alone(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let (other, _proxy) = another_database_that_is_down().await;
    let handler = Script::new(&effects).reading(other);
    let alone = inbox
        .process(
            &handler,
            Msg::new("alone", "other-db"),
            &Metadata::default(),
        )
        .await;
    assert_eq!(settled_as(&alone), "database-unavailable", "{alone:?}");
    for (round, checks) in [BatchChecks::EachMessage, BatchChecks::BeforeCommit]
        .into_iter()
        .enumerate()
    {
        let ids = ["a", "b", "p", "c"].map(|id| format!("{id}-{round}"));
        let items = ids
            .iter()
            .map(|id| {
                item(
                    id,
                    if id.starts_with('p') {
                        "other-db"
                    } else {
                        "ok"
                    },
                )
            })
            .collect();
        let results = inbox.process_batch_with(&handler, items, checks).await;
        let settled: Vec<_> = results.iter().map(settled_as).collect();
        assert_eq!(
            settled,
            [
                "processed",
                "processed",
                "database-unavailable",
                "processed"
            ],
            "{checks:?}: {results:?}"
        );
        assert_eq!(
            results[2].as_ref().err().map(Retry::of),
            alone.as_ref().err().map(Retry::of),
            "settled as it would alone"
        );
        for (id, expected) in ids.iter().zip([1, 1, 0, 1]) {
            assert_eq!(effects_of(&db, &effects, id).await, expected, "{id}");
        }
    }
}

/// The table's trigger refusing the completion's write: the database's own rule (not a value
/// no column can hold), which another try may pass. Per message and in a batch, on every
/// backend, the same error: `database-error`, requeued and counted.
async fn a_trigger_refusing_an_output_is_classified_as_it_is_alone(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let table = inbox.table().as_str().to_owned();
    let refusal = match backend {
        Backend::Sqlite => vec![format!(
            "CREATE TRIGGER {table}_refuse BEFORE UPDATE ON {table} \
             WHEN NEW.output LIKE '%refused%' \
             BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END"
        )],
        Backend::Postgres => vec![
            format!(
                "CREATE FUNCTION {table}_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ \
                 BEGIN IF NEW.output LIKE '%refused%' THEN \
                 RAISE EXCEPTION 'refused by a trigger'; END IF; RETURN NEW; END $$"
            ),
            format!(
                "CREATE TRIGGER {table}_refuse BEFORE UPDATE ON {table} \
                 FOR EACH ROW EXECUTE FUNCTION {table}_refuse()"
            ),
        ],
        Backend::MySql => vec![format!(
            "CREATE TRIGGER {table}_refuse BEFORE UPDATE ON {table} FOR EACH ROW \
             BEGIN IF NEW.output LIKE '%refused%' THEN \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by a trigger'; END IF; END"
        )],
    };
    for sql in &refusal {
        db.exec(sql).await;
    }
    let handler = Script::new(&effects);
    let alone = inbox
        .process(&handler, Msg::new("alone", "refused"), &Metadata::default())
        .await;
    assert_eq!(settled_as(&alone), "database-error", "{alone:?}");
    assert_eq!(alone.as_ref().err().map(Retry::of), Some(Retry::Failed));
    for checks in [BatchChecks::EachMessage, BatchChecks::BeforeCommit] {
        let tag = format!("{checks:?}");
        let items = vec![
            item(&format!("a-{tag}"), "ok"),
            item(&format!("r-{tag}"), "refused"),
            item(&format!("b-{tag}"), "ok"),
        ];
        let results = inbox.process_batch_with(&handler, items, checks).await;
        let settled: Vec<_> = results.iter().map(settled_as).collect();
        assert_eq!(
            settled,
            ["processed", "database-error", "processed"],
            "{checks:?}: {results:?}"
        );
        assert_eq!(effects_of(&db, &effects, &format!("r-{tag}")).await, 0);
        assert_eq!(effects_of(&db, &effects, &format!("a-{tag}")).await, 1);
    }
    if backend == Backend::Postgres {
        db.exec(&format!("DROP FUNCTION IF EXISTS {table}_refuse() CASCADE"))
            .await;
    }
}

/// The server's largest packet, in bytes.
async fn max_allowed_packet(db: &TestDb) -> usize {
    let row = db
        .db
        .query_one_raw(Statement::from_string(
            db.db.get_database_backend(),
            "SELECT CAST(@@max_allowed_packet AS SIGNED)",
        ))
        .await
        .unwrap()
        .unwrap();
    usize::try_from(row.try_get_by_index::<i64>(0).unwrap()).unwrap()
}

/// An output larger than the server's `max_allowed_packet`, which resets the connection that
/// sends it: per message it is `output-not-storable`, dead-lettered; in a batch the same, and
/// the other messages commit, redelivered as a consumer would until each has settled.
async fn an_output_larger_than_a_packet_fails_alone(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let handler =
        Script::new(&effects).with_huge_outputs(max_allowed_packet(&db).await + (1 << 20));
    let alone = inbox
        .process(&handler, Msg::new("alone", "huge"), &Metadata::default())
        .await;
    assert_eq!(settled_as(&alone), "output-not-storable", "{alone:?}");
    for checks in [BatchChecks::EachMessage, BatchChecks::BeforeCommit] {
        let tag = format!("{checks:?}");
        let ids = ["a", "big", "b"].map(|id| format!("{id}-{tag}"));
        let bodies = ["ok", "huge", "ok"];
        let mut settled: Vec<Option<&str>> = vec![None; 3];
        // Redelivered as a consumer would: what was requeued comes back, up to four times.
        for _ in 0..4 {
            let pending: Vec<usize> = (0..3).filter(|i| settled[*i].is_none()).collect();
            if pending.is_empty() {
                break;
            }
            let items = pending.iter().map(|i| item(&ids[*i], bodies[*i])).collect();
            let results = inbox.process_batch_with(&handler, items, checks).await;
            for (i, result) in pending.iter().zip(&results) {
                let code = settled_as(result);
                if code != "database-unavailable" && code != "batch-rolled-back" {
                    settled[*i] = Some(code);
                }
            }
        }
        assert_eq!(
            settled,
            [
                Some("processed"),
                Some("output-not-storable"),
                Some("processed")
            ],
            "{checks:?}"
        );
        for (id, expected) in ids.iter().zip([1, 0, 1]) {
            assert_eq!(effects_of(&db, &effects, id).await, expected, "{id}");
        }
    }
}

/// How many statements the session of `pool` (one connection) has prepared.
async fn statements_prepared(pool: &DatabaseConnection) -> i64 {
    let row = pool
        .query_one_raw(Statement::from_string(
            pool.get_database_backend(),
            "SELECT CAST(VARIABLE_VALUE AS SIGNED) FROM information_schema.SESSION_STATUS \
             WHERE VARIABLE_NAME = 'COM_STMT_PREPARE'",
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get_by_index::<i64>(0).unwrap()
}

/// MySQL/MariaDB prepare every statement on each connection and keep the last hundred: batch
/// statements whose text varied with the batch's size would have a fleet's connections hold
/// as many as `max_prepared_stmt_count` allows (16 382 by default), after which every
/// statement fails. Batches of 64 different sizes prepare a few dozen statements at most.
async fn batch_statement_texts_do_not_grow_with_batch_sizes(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    let (inbox, pool) = idem_tests::one_connection_inbox(&db, &inbox).await;
    let handler = Script::new(&effects);
    let before = statements_prepared(&pool).await;
    let mut next = 0;
    for size in 1..=64 {
        // Fresh keys, and each batch's keys again: claims, reads of known keys, completions.
        let ids: Vec<String> = (next..next + size).map(|i| format!("o-{i}")).collect();
        next += size;
        for _ in 0..2 {
            let items = ids.iter().map(|id| item(id, "ok")).collect();
            let results = inbox.process_batch(&handler, items).await;
            assert!(results.iter().all(Result::is_ok), "{results:?}");
        }
    }
    let prepared = statements_prepared(&pool).await - before;
    assert!(
        prepared <= 40,
        "64 batch sizes prepared {prepared} statements on one connection"
    );
}

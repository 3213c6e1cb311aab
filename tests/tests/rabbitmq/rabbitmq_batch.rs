//! Batch mode through the RabbitMQ adapter, on each backend: every delivery settles as it would
//! alone, a failing one waiting to be requeued is never covered by a later multiple ack, a
//! crash after the commit replays the batch as duplicates, and settings that cannot work are
//! refused at start.
//!
//! Run: `cargo test -p idem-tests --test rabbitmq rabbitmq_batch::` with RabbitMQ, PostgreSQL and MariaDB
//! up (see README).

use std::time::Duration;

use idem_rabbitmq::{Binding, Consumer, SettingError};
use idem_runtime::sea_orm::{ConnectionTrait, Statement};
use idem_runtime::transport::BatchChecks;
use idem_runtime::{MessageKey, Metadata, Outcome, transport::BatchItem};
use idem_tests::rabbit::with_id;
use idem_tests::recorder::{PANICS_IN_FINGERPRINT, PANICS_IN_KEY};
use idem_tests::script::{Script, another_database_that_is_down};
use idem_tests::slicer::Slicer;
use idem_tests::{Backend, Fixture, Msg, Recorder, on_each_backend};

on_each_backend!(
    a_slicing_binding_settles_each_delivery_as_it_would_alone,
    a_handler_whose_own_database_is_down_holds_up_no_other_delivery,
    a_batching_binding_settles_each_delivery_as_it_would_alone,
    a_batching_binding_checked_after_each_handler_settles_the_same,
    a_crash_between_commit_and_ack_is_replayed_as_duplicates,
    a_key_or_fingerprint_that_panics_fails_only_its_own_delivery,
    a_binding_has_at_most_its_batches_in_flight,
);

/// Faults of MySQL/MariaDB's own.
mod server {
    use super::*;
    on_each_backend!([mysql]: an_output_larger_than_a_packet_is_dead_lettered_alone);
}

/// Faults of the database servers'.
mod servers {
    use super::*;
    on_each_backend!([postgres, mysql]: a_batching_consumer_never_counts_a_database_that_takes_no_writes);
}

const WAIT: Duration = Duration::from_secs(60);

async fn start_batching(t: &Fixture, handler: Recorder, checks: BatchChecks) -> Consumer {
    t.consumer()
        .prefetch(100)
        // A failed message waits a second to be requeued: long enough for later batches to
        // commit and acknowledge meanwhile.
        .retry_backoff(Duration::from_secs(1), Duration::from_secs(1))
        .bind_with(
            t.binding(handler)
                .batch(25, Duration::from_millis(20))
                .batch_checks(checks),
        )
        .start()
        .await
        .expect("consumer starts")
}

/// The default binding, its handlers checked once before each batch's commit.
async fn a_batching_binding_settles_each_delivery_as_it_would_alone(backend: Backend) {
    batching_binding(backend, BatchChecks::default()).await;
}

async fn a_batching_binding_checked_after_each_handler_settles_the_same(backend: Backend) {
    batching_binding(backend, BatchChecks::EachMessage).await;
}

async fn batching_binding(backend: Backend, checks: BatchChecks) {
    let t = Fixture::builder().on(backend).declared().build().await;
    // 300 orders, every tenth a producer's retry of an earlier one; a payload that is not
    // JSON; a reused key with other content.
    let mut published = 0;
    for i in 0..300 {
        let order = if i % 10 == 9 { i - 4 } else { i };
        let id = format!("o-{order}");
        t.send(&Msg::new(&id, "charge"), with_id(&id)).await;
        published += 1;
    }
    t.send_bytes(b"{not json", with_id("bad")).await;
    t.send(&Msg::new("o-1", "charge 99"), with_id("o-1")).await;
    published += 2;
    let handler = t.recorder("billing");
    // The first message processed fails once, after writing its effect.
    handler.fail_next(1);
    let consumer = start_batching(&t, handler.clone(), checks).await;

    t.broker
        .eventually("every delivery settled", WAIT, || async {
            let stats = consumer.stats();
            stats.acked + stats.duplicates + stats.dead_lettered == published
        })
        .await;
    let stats = consumer.stats();
    assert_eq!(stats.acked, 270, "{stats:?}");
    assert_eq!(stats.duplicates, 30, "{stats:?}");
    assert_eq!(stats.dead_lettered, 2, "{stats:?}");
    // The failed message, and the producer's retry of it if that shared its batch.
    assert!((1..=2).contains(&stats.requeued), "{stats:?}");
    // One effect per order: the failed first run rolled back alone, and its requeued delivery
    // was processed, not swallowed by a later batch's multiple ack.
    assert_eq!(t.effects("1=1").await, 270);
    assert_eq!(handler.attempts().len(), 271);
    assert_eq!(
        t.dead_letter_reasons().await,
        ["fingerprint-mismatch", "undecodable"]
    );
    assert_eq!(t.depth().await, 0);
    consumer.shutdown().await;
}

/// A message whose key or fingerprint panics (user code, computed before any handler runs) is
/// failed alone, as it would be one at a time; the rest of its batch is processed at once.
async fn a_key_or_fingerprint_that_panics_fails_only_its_own_delivery(backend: Backend) {
    let t = Fixture::builder().on(backend).declared().build().await;
    for i in 0..20 {
        let id = format!("o-{i}");
        let body = match i {
            5 => PANICS_IN_KEY,
            12 => PANICS_IN_FINGERPRINT,
            _ => "charge",
        };
        t.send(&Msg::new(&id, body), with_id(&id)).await;
    }
    let handler = t.recorder("billing");
    let consumer = t
        .consumer()
        .prefetch(100)
        .max_deliveries(2)
        .bind_with(
            t.binding(handler.clone())
                .batch(25, Duration::from_millis(50)),
        )
        .start()
        .await
        .expect("consumer starts");
    t.broker
        .eventually("every delivery settled", WAIT, || async {
            let stats = consumer.stats();
            stats.acked + stats.dead_lettered == 20
        })
        .await;
    let stats = consumer.stats();
    // Each panicking message was requeued once and then given up on; no other was requeued.
    assert_eq!((stats.acked, stats.dead_lettered), (18, 2), "{stats:?}");
    assert_eq!(stats.requeued, 2, "{stats:?}");
    assert_eq!(t.effects("1=1").await, 18);
    assert_eq!(handler.attempts().len(), 18);
    assert_eq!(
        t.dead_letter_reasons().await,
        ["delivery-limit", "delivery-limit"]
    );
    consumer.shutdown().await;
}

/// A binding runs at most two batches at once by default (one handler each at a time), and as
/// many as it says.
async fn a_binding_has_at_most_its_batches_in_flight(backend: Backend) {
    let t = Fixture::builder().on(backend).build().await;
    // SQLite writes one transaction at a time: a consumer's batches take turns there.
    let two = if backend == Backend::Sqlite { 1 } else { 2 };
    for (batches, expected) in [(None, two), (Some(1), 1)] {
        let topology = t.broker.classic_queue();
        t.broker.declare(&topology).await;
        let queue = topology.queue().to_owned();
        let handler = t.recorder("billing").slow(Duration::from_millis(20));
        let mut binding =
            Binding::new(topology, handler.clone()).batch(5, Duration::from_millis(20));
        if let Some(batches) = batches {
            binding = binding.batches_in_flight(batches);
        }
        // Every delivery ready at the start: the batches could all run at once.
        for i in 0..60 {
            let id = format!("o-{batches:?}-{i}");
            t.broker
                .send(&queue, &Msg::new(&id, "charge"), with_id(&id))
                .await;
        }
        let consumer = t
            .consumer()
            .prefetch(100)
            .bind_with(binding)
            .start()
            .await
            .expect("consumer starts");
        t.broker
            .eventually("every delivery acked", WAIT, || async {
                consumer.stats().acked == 60
            })
            .await;
        assert_eq!(
            handler.most_at_once(),
            expected,
            "{batches:?} batches in flight"
        );
        consumer.shutdown().await;
    }
    assert_eq!(t.effects("1=1").await, 120);
}

async fn a_crash_between_commit_and_ack_is_replayed_as_duplicates(backend: Backend) {
    let t = Fixture::builder().on(backend).declared().build().await;
    let handler = t.recorder("billing");
    let orders: Vec<Msg> = (0..60)
        .map(|i| Msg::new(format!("o-{i}"), "charge"))
        .collect();
    for order in &orders {
        t.send(order, with_id(&order.id)).await;
    }
    // A consumer that committed the batch and died before acknowledging it: the broker still
    // holds every delivery.
    let items = orders
        .iter()
        .map(|order| BatchItem {
            key: MessageKey::new(order.id.as_str()),
            message: order.clone(),
            metadata: Metadata::default(),
        })
        .collect();
    let committed = t.inbox.process_batch(&handler, items).await;
    assert!(
        committed
            .iter()
            .all(|r| matches!(r, Ok(Outcome::Processed(_))))
    );

    let consumer = start_batching(&t, handler.clone(), BatchChecks::EachMessage).await;
    t.broker
        .eventually("the redeliveries acknowledged", WAIT, || async {
            consumer.stats().duplicates == 60
        })
        .await;
    assert_eq!(consumer.stats().acked, 0);
    assert_eq!(handler.attempts().len(), 60, "no handler ran again");
    assert_eq!(t.effects("1=1").await, 60);
    assert_eq!(t.depth().await, 0);
    consumer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batch_settings_that_cannot_work_are_refused_at_start() {
    let t = Fixture::builder().on(Backend::Sqlite).build().await;
    let handler = t.recorder("billing");
    let refused = |binding| async {
        t.consumer()
            .bind_with(binding)
            .start()
            .await
            .expect_err("refused")
    };
    let two_phase = handler.clone().two_phase(Duration::from_secs(5));
    let error = refused(
        Binding::new(t.broker.classic_queue(), two_phase).batch(10, Duration::from_millis(5)),
    )
    .await;
    assert!(
        matches!(error.settings(), [SettingError::TwoPhaseBatch { .. }]),
        "{error:?}"
    );
    assert!(error.to_string().contains("without `batch`"), "{error}");
    let error =
        refused(Binding::new(t.broker.classic_queue(), handler.clone()).batch(0, Duration::ZERO))
            .await;
    assert!(
        matches!(error.settings(), [SettingError::Zero(_)]),
        "{error:?}"
    );
    let error =
        refused(Binding::new(t.broker.classic_queue(), handler).batch(5000, Duration::ZERO)).await;
    assert!(
        matches!(
            error.settings(),
            [SettingError::BatchTooLarge { max: 1000, .. }]
        ),
        "{error:?}"
    );
}

/// A consumer binding `handler` to the fixture's queue in batches of five, quick to requeue,
/// giving a message up at its second failed delivery.
async fn start_quick_batches(t: &Fixture, handler: Script) -> Consumer {
    t.consumer()
        .prefetch(50)
        .max_deliveries(2)
        .retry_backoff(Duration::from_millis(20), Duration::from_millis(200))
        .without_cleaner()
        .bind_with(t.binding(handler).batch(5, Duration::from_millis(20)))
        .start()
        .await
        .expect("consumer starts")
}

/// A database that takes no writes for some keys (as a failover's demoted primary, still in the
/// pool, takes none while other connections reach the new one) requeues their deliveries without
/// counting them, however often they come back, while other deliveries reach the database: far
/// past the delivery limit nothing is dead-lettered, and once it takes writes every message is
/// processed once. (The keys' claims are refused with the server's read-only error by a
/// trigger.)
async fn a_batching_consumer_never_counts_a_database_that_takes_no_writes(backend: Backend) {
    let t = Fixture::builder().on(backend).declared().build().await;
    let table = t.inbox.table().as_str().to_owned();
    let refuse = match backend {
        Backend::Postgres => vec![
            format!(
                "CREATE FUNCTION {table}_ro() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
                 IF NEW.message_key LIKE 'ro-%' THEN RAISE EXCEPTION 'read-only' \
                 USING ERRCODE = 'read_only_sql_transaction'; END IF; RETURN NEW; END $$"
            ),
            format!(
                "CREATE TRIGGER {table}_ro BEFORE INSERT ON {table} \
                 FOR EACH ROW EXECUTE FUNCTION {table}_ro()"
            ),
        ],
        _ => vec![format!(
            "CREATE TRIGGER {table}_ro BEFORE INSERT ON {table} FOR EACH ROW \
             BEGIN IF NEW.message_key LIKE 'ro-%' THEN \
             SIGNAL SQLSTATE '25006' SET MYSQL_ERRNO = 1792, MESSAGE_TEXT = 'read-only'; \
             END IF; END"
        )],
    };
    for sql in &refuse {
        t.db.exec(sql).await;
    }
    // The fixture's queue takes the keys the database refuses; another one, the others.
    let (read_only, healthy) = (t.topology.clone(), t.broker.classic_queue());
    t.broker.declare(&healthy).await;
    let others = healthy.queue().to_owned();
    for i in 0..5 {
        let id = format!("ro-{i}");
        t.send(&Msg::new(&id, "ok"), with_id(&id)).await;
    }
    let consumer = t
        .consumer()
        .prefetch(50)
        .max_deliveries(2)
        .retry_backoff(Duration::from_millis(20), Duration::from_millis(100))
        .without_cleaner()
        .bind_with(
            Binding::new(read_only, Script::new(&t.effects)).batch(5, Duration::from_millis(20)),
        )
        .bind_with(
            Binding::new(healthy, Script::new(&t.effects)).batch(5, Duration::from_millis(5)),
        )
        .start()
        .await
        .expect("consumer starts");
    // Other deliveries reach the database all along.
    let mut sent = 0;
    while consumer.stats().requeued < 25 {
        assert!(sent < 2000, "requeued {:?}", consumer.stats());
        let id = format!("ok-{sent}");
        t.broker
            .send(&others, &Msg::new(&id, "ok"), with_id(&id))
            .await;
        sent += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(consumer.stats().dead_lettered, 0, "{:?}", consumer.stats());
    let drop = match backend {
        Backend::Postgres => format!("DROP FUNCTION {table}_ro() CASCADE"),
        _ => format!("DROP TRIGGER {table}_ro"),
    };
    t.db.exec(&drop).await;
    t.broker
        .eventually("every delivery acked", WAIT, || async {
            consumer.stats().acked == sent + 5
        })
        .await;
    assert_eq!(consumer.stats().dead_lettered, 0);
    assert_eq!(t.effects("message_key LIKE 'ro-%'").await, 5);
    assert!(t.dead_letters().await.is_empty());
    consumer.shutdown().await;
}

/// A handler whose error says its own database is unreachable (another database it reads is
/// down) is requeued without counting, as it would be alone; the other messages of its batches
/// are acknowledged at once, and it is processed once that database is back.
async fn a_handler_whose_own_database_is_down_holds_up_no_other_delivery(backend: Backend) {
    let t = Fixture::builder().on(backend).declared().build().await;
    let (other, proxy) = another_database_that_is_down().await;
    let handler = Script::new(&t.effects).reading(other);
    for (id, body) in [("a", "ok"), ("b", "ok"), ("p", "other-db"), ("c", "ok")] {
        t.send(&Msg::new(id, body), with_id(id)).await;
    }
    // Requeued messages come back after three seconds: the others are committed long before p
    // is delivered again, with the batch that held p (they would have been requeued with p, had
    // p's outage been the batch's).
    let consumer = t
        .consumer()
        .prefetch(50)
        .retry_backoff(Duration::from_secs(3), Duration::from_secs(3))
        .without_cleaner()
        .bind_with(
            t.binding(handler.clone())
                .batch(5, Duration::from_millis(50)),
        )
        .start()
        .await
        .expect("consumer starts");
    t.broker
        .eventually(
            "the others committed before p is back",
            Duration::from_secs(2),
            || async { t.effects("1=1").await == 3 },
        )
        .await;
    assert_eq!(t.effects("message_key = 'p'").await, 0);
    proxy.restore();
    t.broker
        .eventually("p acked once its database is back", WAIT, || async {
            consumer.stats().acked == 4
        })
        .await;
    assert_eq!(t.effects("1=1").await, 4);
    assert!(t.dead_letters().await.is_empty());
    consumer.shutdown().await;
}

/// An output larger than MySQL/MariaDB's `max_allowed_packet`, which resets the connection that
/// sends it: its delivery is dead-lettered as `output-not-storable`, and the others of its batch
/// are acknowledged.
async fn an_output_larger_than_a_packet_is_dead_lettered_alone(backend: Backend) {
    let t = Fixture::builder().on(backend).declared().build().await;
    let row =
        t.db.db
            .query_one_raw(Statement::from_string(
                t.db.db.get_database_backend(),
                "SELECT CAST(@@max_allowed_packet AS SIGNED)",
            ))
            .await
            .unwrap()
            .unwrap();
    let packet = usize::try_from(row.try_get_by_index::<i64>(0).unwrap()).unwrap();
    let handler = Script::new(&t.effects).with_huge_outputs(packet + (1 << 20));
    for (id, body) in [("a", "ok"), ("big", "huge"), ("b", "ok")] {
        t.send(&Msg::new(id, body), with_id(id)).await;
    }
    let consumer = start_quick_batches(&t, handler).await;
    t.broker
        .eventually("every delivery settled", WAIT, || async {
            let stats = consumer.stats();
            stats.acked + stats.dead_lettered == 3
        })
        .await;
    let stats = consumer.stats();
    assert_eq!((stats.acked, stats.dead_lettered), (2, 1), "{stats:?}");
    assert_eq!(t.dead_letter_reasons().await, ["output-not-storable"]);
    assert_eq!(t.effects("1=1").await, 2);
    consumer.shutdown().await;
}

/// A slice handler bound in slices: each delivery settles as it would alone, whatever else its
/// slice holds (a producer's retries, a payload that is not JSON, a reused key, a message that
/// always fails).
async fn a_slicing_binding_settles_each_delivery_as_it_would_alone(backend: Backend) {
    let t = Fixture::builder().on(backend).declared().build().await;
    let mut published = 0;
    for i in 0..110 {
        // Every eleventh a producer's retry of an earlier order.
        let order = if i % 11 == 10 { i - 5 } else { i };
        let id = format!("o-{order}");
        t.send(&Msg::new(&id, "charge"), with_id(&id)).await;
        published += 1;
    }
    t.send_bytes(b"{not json", with_id("bad")).await;
    t.send(&Msg::new("o-1", "charge 99"), with_id("o-1")).await;
    t.send(&Msg::new("f-1", "fail"), with_id("f-1")).await;
    published += 3;
    let slicer = Slicer::new(&t.effects);
    let consumer = t
        .consumer()
        .prefetch(100)
        .max_deliveries(3)
        .retry_backoff(Duration::from_millis(50), Duration::from_millis(200))
        .bind_with(
            t.binding(slicer.clone())
                .slices(25, Duration::from_millis(20)),
        )
        .start()
        .await
        .expect("consumer starts");
    t.broker
        .eventually("every delivery settled", WAIT, || async {
            let stats = consumer.stats();
            stats.acked + stats.duplicates + stats.dead_lettered == published
        })
        .await;
    let stats = consumer.stats();
    assert_eq!(stats.acked, 100, "{stats:?}");
    assert_eq!(stats.duplicates, 10, "{stats:?}");
    assert_eq!(stats.dead_lettered, 3, "{stats:?}");
    assert_eq!(t.effects("1=1").await, 100);
    // Slices: far fewer calls than messages.
    assert!(slicer.calls().len() < 60, "{} calls", slicer.calls().len());
    assert_eq!(
        t.dead_letter_reasons().await,
        ["delivery-limit", "fingerprint-mismatch", "undecodable"]
    );
    assert_eq!(t.depth().await, 0);
    consumer.shutdown().await;
}

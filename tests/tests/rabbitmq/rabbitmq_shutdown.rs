//! The RabbitMQ adapter's consumer stopping, and messages that wait: a shutdown with messages in
//! flight, one past its deadline, one while a message waits out its back-off; a waiting message
//! or an idle binding that must hold up no other; the inbox's cleaner, run from the consumer's
//! start to its shutdown. The real broker on 127.0.0.1:5672 and the real PostgreSQL; each test
//! makes its own queues and tables.
//!
//! Run: `cargo test -p idem-tests --test rabbitmq rabbitmq_shutdown::` with RabbitMQ and PostgreSQL up (see
//! README).

use std::time::Duration;

use idem_rabbitmq::{Consumer, ConsumerBuilder, PublishOptions};
use idem_runtime::RetentionPolicy;
use idem_tests::{Fixture, Msg, TestDb, unique};

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_with_messages_in_flight_settles_all_and_loses_none() {
    let t = Fixture::new().await;
    let handler = t.recorder("billing").slow(Duration::from_millis(150));
    let consumer = t
        .start_with(|c| c.prefetch(10).max_in_flight(5), handler.clone())
        .await;
    for key in 0..40 {
        t.send(
            &Msg::new(format!("o-{key}"), "x"),
            PublishOptions::default(),
        )
        .await;
    }
    t.broker
        .eventually("some processed", WAIT, || async {
            consumer.stats().acked >= 5
        })
        .await;
    let started = handler.attempts().len();
    let report = consumer.shutdown().await;
    assert_eq!(report.abandoned, 0);
    assert!(report.completed > 0, "{report:?}");

    // Everything started was finished and acked; the rest is back on the queue.
    let processed = t.effects("1=1").await;
    assert!(processed as usize >= started, "{processed} < {started}");
    assert_eq!(processed as u32 + t.depth().await, 40);

    // A new consumer takes the rest: each message exactly once.
    let rest = t.start(handler.clone().slow(Duration::ZERO)).await;
    t.broker
        .eventually("the rest processed", WAIT, || async {
            t.effects("1=1").await == 40
        })
        .await;
    assert_eq!(rest.stats().duplicates, 0);
    rest.shutdown().await;
    assert_eq!(t.depth().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_deadline_abandons_handlers_whose_messages_are_redelivered() {
    let t = Fixture::new().await;
    let handler = t.recorder("billing").slow(Duration::from_secs(5));
    let consumer = t
        .start_with(
            |c| c.shutdown_timeout(Duration::from_millis(200)),
            handler.clone(),
        )
        .await;
    for key in 0..3 {
        t.send(
            &Msg::new(format!("o-{key}"), "x"),
            PublishOptions::default(),
        )
        .await;
    }
    let runs = handler.clone();
    t.broker
        .eventually("handlers running", WAIT, || {
            let runs = runs.clone();
            async move { runs.attempts().len() == 3 }
        })
        .await;
    let report = consumer.shutdown().await;
    assert_eq!(report.abandoned, 3);
    // The stopped transactions were rolled back and the messages are back on the queue.
    assert_eq!(t.effects("1=1").await, 0);
    t.broker
        .eventually("messages back on the queue", WAIT, || async {
            t.depth().await == 3
        })
        .await;
    let rest = t.start(handler.slow(Duration::ZERO)).await;
    t.broker
        .eventually("redelivered and processed", WAIT, || async {
            t.effects("1=1").await == 3
        })
        .await;
    rest.shutdown().await;
}

/// A consumer on a fresh classic queue whose first message, `o-1`, failed once and now waits
/// out a back-off of `backoff` before it is requeued. Returns the fixture and the consumer.
async fn o1_in_back_off(
    backoff: Duration,
    configure: impl FnOnce(ConsumerBuilder) -> ConsumerBuilder,
) -> (Fixture, Consumer) {
    let t = Fixture::new().await;
    let handler = t.recorder("billing");
    handler.fail_next(1);
    let consumer = t
        .start_with(
            |c| configure(c.retry_backoff(backoff, backoff)),
            handler.clone(),
        )
        .await;
    t.send(&Msg::new("o-1", "x"), PublishOptions::default())
        .await;
    t.broker
        .eventually("o-1 failed once", WAIT, || async {
            handler.attempts().len() == 1
        })
        .await;
    (t, consumer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_waiting_out_its_back_off_leaves_room_for_others() {
    let backoff = Duration::from_secs(10);
    let (t, consumer) = o1_in_back_off(backoff, |builder| builder.max_in_flight(1)).await;
    // o-1 now waits 10 s before it is requeued; the one handler slot is free meanwhile.
    t.send(&Msg::new("o-2", "x"), PublishOptions::default())
        .await;
    t.broker
        .eventually(
            "o-2 processed during o-1's back-off",
            backoff / 2,
            || async { consumer.stats().acked == 1 },
        )
        .await;
    assert_eq!(t.effects("message_key = 'o-2'").await, 1);
    assert_eq!(consumer.stats().requeued, 0, "o-1 is still waiting");
    t.broker
        .eventually("o-1 processed after its back-off", WAIT, || async {
            consumer.stats().acked == 2
        })
        .await;
    assert_eq!(t.effects("1=1").await, 2);
    consumer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_requeues_a_message_in_back_off_at_once() {
    let (t, consumer) = o1_in_back_off(Duration::from_secs(60), |b| {
        b.shutdown_timeout(Duration::from_secs(5))
    })
    .await;
    // The message would wait a minute; the shutdown requeues it within its 5 s deadline, rather
    // than abandon it there.
    let report = consumer.shutdown().await;
    assert_eq!(report.abandoned, 0, "{report:?}");
    t.broker
        .eventually("o-1 back on the queue", WAIT, || async {
            t.depth().await == 1
        })
        .await;
    assert_eq!(t.effects("1=1").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_binding_does_not_starve_a_busy_one() {
    let t = Fixture::new().await;
    let (idle, busy) = (t.broker.classic_queue(), t.topology.clone());
    let consumer = t
        .consumer()
        .max_in_flight(1)
        .bind(idle, t.recorder("idle"))
        .bind(busy, t.recorder("busy"))
        .start()
        .await
        .unwrap();
    for key in 0..5 {
        t.send(
            &Msg::new(format!("o-{key}"), "x"),
            PublishOptions::default(),
        )
        .await;
    }
    t.broker
        .eventually("the busy queue consumed", WAIT, || async {
            consumer.stats().acked == 5
        })
        .await;
    assert_eq!(t.effects("consumer = 'busy'").await, 5);
    consumer.shutdown().await;
}

/// Inserts `count` completed records of `consumer` into the inbox `table`, expired a minute ago.
async fn seed_expired(db: &TestDb, table: &str, consumer: &str, count: usize) {
    let expired = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        - 60_000;
    let rows: Vec<String> = (0..count)
        .map(|i| {
            format!(
                "('{consumer}', '{}', 'completed', NULL, NULL, 1, 0, 1, 1, NULL, 1, {expired})",
                unique(&format!("key-{i}"))
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

/// The consumer runs its inbox's cleaner from its start to its shutdown, unless told not to.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_consumer_runs_the_inbox_cleaner_until_shutdown_unless_told_not_to() {
    let policy = RetentionPolicy::default().with_cleanup_interval(Duration::from_millis(200));
    let t = Fixture::builder()
        .inbox(|inbox| inbox.retention(policy))
        .build()
        .await;
    let table = t.inbox.table().to_string();
    seed_expired(&t.db, &table, "old", 10).await;

    let consumer = t.start(t.recorder("c")).await;
    t.broker
        .eventually("expired records deleted", WAIT, || async {
            t.db.count(&table, "1=1").await == 0
        })
        .await;
    let report = consumer.shutdown().await;
    assert_eq!(report.cleanup.map(|cleanup| cleanup.deleted), Some(10));

    // Stopped with the consumer: records that expired since stay.
    seed_expired(&t.db, &table, "old", 10).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(t.db.count(&table, "1=1").await, 10);

    // A consumer told not to run it does not.
    let consumer = t
        .consumer()
        .without_cleaner()
        .bind(t.broker.classic_queue(), t.recorder("c"))
        .start()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(t.db.count(&table, "1=1").await, 10);
    assert_eq!(consumer.shutdown().await.cleanup, None);
}

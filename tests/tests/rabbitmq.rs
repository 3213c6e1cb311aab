//! The RabbitMQ adapter end to end: the real broker on 127.0.0.1:5672 and the real PostgreSQL
//! (SQLite for one test). Each test makes its own queues and tables.
//!
//! Run: `cargo test -p idem-tests --test rabbitmq` with RabbitMQ and PostgreSQL up (see README).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_rabbitmq::lapin::ExchangeKind;
use idem_rabbitmq::{Consumer, ConsumerBuilder, PublishOptions, Publisher, QueueTopology, headers};
use idem_runtime::{Handler, Inbox, RetentionPolicy};
use idem_tests::proxy::Proxy;
use idem_tests::rabbit::{
    amqp_addr, amqp_url, amqp_url_through, close_connections, connections_named, consumer_builder,
    consumer_builder_at, consumers_on, rabbitmqctl,
};
use idem_tests::{
    Backend, Msg, Recorder, TestBroker, TestDb, inbox_and_effects, inbox_and_effects_with, unique,
};
use sea_orm::{ConnectOptions, Database};

const WAIT: Duration = Duration::from_secs(30);

async fn start<H>(inbox: &Inbox, topology: QueueTopology, handler: H) -> Consumer
where
    H: Handler<Message = Msg> + 'static,
{
    consumer_builder(inbox, &unique("idem-test"))
        .bind(topology, handler)
        .start()
        .await
        .expect("consumer starts")
}

fn with_id(id: &str) -> PublishOptions {
    PublishOptions::default().message_id(id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn producer_retry_publishing_twice_has_one_effect() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let topology = broker.classic_queue();
    let queue = topology.queue().to_owned();
    let handler = Recorder::new(&db, &effects, "billing").keyed_by_message_id();
    let consumer = start(&inbox, topology, handler).await;

    // The producer did not get its confirm and published again, with the same message id.
    let msg = Msg::new("order-1", "charge 10");
    broker.send(&queue, &msg, with_id("m-1")).await;
    broker.send(&queue, &msg, with_id("m-1")).await;

    broker
        .eventually("both copies settled", WAIT, || async {
            let stats = consumer.stats();
            stats.acked + stats.duplicates == 2
        })
        .await;
    assert_eq!(db.count(&effects, "1=1").await, 1);
    let stats = consumer.stats();
    assert_eq!((stats.acked, stats.duplicates), (1, 1));
    assert_eq!(broker.depth(&queue).await, 0);
    consumer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nacked_and_redelivered_message_has_one_effect() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let topology = broker.classic_queue();
    let queue = topology.queue().to_owned();
    let handler = Recorder::new(&db, &effects, "billing");
    handler.fail_next(2);
    let consumer = start(&inbox, topology, handler.clone()).await;

    broker
        .send(&queue, &Msg::new("order-2", "x"), PublishOptions::default())
        .await;
    broker
        .eventually("processed after two requeues", WAIT, || async {
            consumer.stats().acked == 1
        })
        .await;
    assert_eq!(consumer.stats().requeued, 2);
    assert_eq!(handler.attempts().len(), 3);
    // The two failed runs were rolled back with their claims.
    assert_eq!(db.count(&effects, "1=1").await, 1);
    consumer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_after_commit_before_ack_is_redelivered_and_recognised() {
    crash_after_commit_before_ack(Duration::from_secs(30)).await;
}

/// The same when lapin's recovery is not waited for: the consumer opens a new connection itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_after_commit_before_ack_with_a_replaced_connection() {
    crash_after_commit_before_ack(Duration::from_millis(1)).await;
}

async fn crash_after_commit_before_ack(recovery_timeout: Duration) {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let topology = broker.classic_queue();
    let queue = topology.queue().to_owned();
    let name = unique("idem-crash");
    // The broker drops the consumer's connection while the first run is in its handler: the
    // handler's transaction still commits, but its ack can no longer reach the broker.
    let cut = name.clone();
    let handler = Recorder::new(&db, &effects, "billing").after_first_effect(move || {
        let cut = cut.clone();
        async move {
            assert!(close_connections(&cut).await >= 1, "no connection to close");
        }
    });
    let consumer = consumer_builder(&inbox, &name)
        .recovery_timeout(recovery_timeout)
        .reconnect_delay(Duration::from_millis(100))
        .bind(topology, handler.clone())
        .start()
        .await
        .unwrap();

    broker
        .send(&queue, &Msg::new("order-3", "x"), PublishOptions::default())
        .await;
    broker
        .eventually("the redelivery acked as a duplicate", WAIT, || async {
            consumer.stats().duplicates == 1
        })
        .await;
    let stats = consumer.stats();
    assert_eq!(stats.settle_lost, 1, "{stats:?}");
    assert_eq!(stats.acked, 0, "{stats:?}");
    assert_eq!(handler.attempts().len(), 1, "the handler ran once");
    if recovery_timeout < Duration::from_millis(10) {
        // Either lapin won the race or the connection was replaced: the session survived.
        assert!(stats.recoveries + stats.reconnections >= 1, "{stats:?}");
    } else {
        assert_eq!((stats.recoveries, stats.reconnections), (1, 0), "{stats:?}");
    }
    assert_eq!(db.count(&effects, "1=1").await, 1);

    // After recovery, consuming continues by itself.
    broker
        .send(&queue, &Msg::new("order-4", "y"), PublishOptions::default())
        .await;
    broker
        .eventually("a new message after recovery", WAIT, || async {
            consumer.stats().acked == 1
        })
        .await;
    assert_eq!(db.count(&effects, "1=1").await, 2);
    assert_eq!(broker.depth(&queue).await, 0);
    consumer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_consumer_connections_with_a_burst_of_duplicates_have_one_effect_per_key() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let topology = broker.quorum_queue();
    let queue = topology.queue().to_owned();
    let handler = Recorder::new(&db, &effects, "billing").keyed_by_message_id();
    let first = start(&inbox, topology.clone(), handler.clone()).await;
    let second = start(&inbox, topology, handler).await;

    for copy in 0..3 {
        for key in 0..100 {
            let options = with_id(&format!("m-{key}")).correlation_id(format!("copy-{copy}"));
            broker
                .send(&queue, &Msg::new(format!("o-{key}"), "x"), options)
                .await;
        }
    }
    broker
        .eventually("300 deliveries settled", WAIT, || async {
            let (a, b) = (first.stats(), second.stats());
            a.acked + a.duplicates + b.acked + b.duplicates == 300
        })
        .await;
    let (a, b) = (first.stats(), second.stats());
    assert_eq!(a.acked + b.acked, 100, "{a:?} {b:?}");
    assert_eq!(db.count(&effects, "1=1").await, 100);
    assert_eq!(
        db.count(
            &effects,
            "message_key IN (SELECT message_key FROM (SELECT message_key, COUNT(*) AS n FROM \
             (SELECT message_key FROM effects_dummy) d GROUP BY message_key) g WHERE n > 1)"
                .replace("effects_dummy", &effects)
                .as_str()
        )
        .await,
        0,
        "no key has two effects"
    );
    first.shutdown().await;
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fanout_to_two_consumers_each_processes_once() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let exchange = unique("idem_fanout");
    broker.track_exchange(&exchange);
    let billing_queue = broker.track(QueueTopology::classic(unique("idem_billing")).bind(
        &exchange,
        ExchangeKind::Fanout,
        "",
    ));
    let shipping_queue = broker.track(QueueTopology::classic(unique("idem_shipping")).bind(
        &exchange,
        ExchangeKind::Fanout,
        "",
    ));
    // Both consumers share one inbox table; their records do not collide.
    let billing = start(
        &inbox,
        billing_queue,
        Recorder::new(&db, &effects, "billing").keyed_by_message_id(),
    )
    .await;
    let shipping = start(
        &inbox,
        shipping_queue,
        Recorder::new(&db, &effects, "shipping").keyed_by_message_id(),
    )
    .await;

    for key in 0..20 {
        let msg = Msg::new(format!("o-{key}"), "placed");
        for _ in 0..2 {
            broker
                .publisher
                .publish(&exchange, "", &msg, with_id(&format!("m-{key}")))
                .await
                .unwrap();
        }
    }
    broker
        .eventually("each consumer settled 40 deliveries", WAIT, || async {
            let (a, b) = (billing.stats(), shipping.stats());
            a.acked + a.duplicates == 40 && b.acked + b.duplicates == 40
        })
        .await;
    assert_eq!(db.count(&effects, "consumer = 'billing'").await, 20);
    assert_eq!(db.count(&effects, "consumer = 'shipping'").await, 20);
    billing.shutdown().await;
    shipping.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_ends_in_the_dead_letter_queue_with_its_reason() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let topology = broker.classic_queue();
    let (queue, dlq) = (
        topology.queue().to_owned(),
        topology.dead_letter_queue().to_owned(),
    );
    let handler = Recorder::new(&db, &effects, "billing").keyed_by_message_id();
    let consumer = start(&inbox, topology, handler).await;

    // No message id, or an empty one: nothing to deduplicate on.
    broker
        .send_without_id(&queue, br#"{"id":"o-0","body":"x"}"#)
        .await;
    broker
        .send_bytes(
            &queue,
            br#"{"id":"o-1","body":"x"}"#,
            PublishOptions::default().message_id(""),
        )
        .await;
    // Not JSON.
    broker
        .send_bytes(&queue, b"{not json", with_id("m-bad-json"))
        .await;
    // Not the content type the codec reads.
    broker
        .send_bytes(
            &queue,
            b"<order/>",
            with_id("m-xml").content_type("application/xml"),
        )
        .await;
    // A reused id with different content: the first is processed, the second refused.
    broker
        .send(&queue, &Msg::new("o-2", "charge 10"), with_id("m-2"))
        .await;
    broker
        .eventually("the first m-2 processed", WAIT, || async {
            consumer.stats().acked == 1
        })
        .await;
    broker
        .send(&queue, &Msg::new("o-2", "charge 99"), with_id("m-2"))
        .await;

    broker
        .eventually("five messages dead-lettered", WAIT, || async {
            consumer.stats().dead_lettered == 5
        })
        .await;
    let mut reasons: Vec<(String, Option<String>)> = broker
        .drain(&dlq)
        .await
        .into_iter()
        .map(|m| (m.reason().to_owned(), m.message_id))
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        vec![
            ("fingerprint-mismatch".into(), Some("m-2".into())),
            ("invalid-key".into(), None),
            ("invalid-key".into(), Some("".into())),
            ("undecodable".into(), Some("m-bad-json".into())),
            ("undecodable".into(), Some("m-xml".into())),
        ]
    );
    assert_eq!(broker.depth(&queue).await, 0);
    assert_eq!(db.count(&effects, "1=1").await, 1);
    assert_eq!(db.count(&effects, "body = 'charge 99'").await, 0);
    consumer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_lettered_copy_carries_consumer_key_and_detail() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let topology = broker.classic_queue();
    let (queue, dlq) = (
        topology.queue().to_owned(),
        topology.dead_letter_queue().to_owned(),
    );
    let mut handler = Recorder::new(&db, &effects, "billing");
    handler.permanent = true;
    handler.fail_next(1);
    let consumer = start(&inbox, topology, handler).await;
    broker
        .send(
            &queue,
            &Msg::new("o-9", "x"),
            with_id("m-9").correlation_id("c-9"),
        )
        .await;
    broker
        .eventually("dead-lettered", WAIT, || async {
            consumer.stats().dead_lettered == 1
        })
        .await;
    let letters = broker.drain(&dlq).await;
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert_eq!(letter.reason(), "handler-permanent-error");
    assert_eq!(letter.headers[headers::CONSUMER], "billing");
    assert_eq!(letter.headers[headers::KEY], "o-9");
    assert_eq!(letter.headers[headers::QUEUE], queue);
    assert!(letter.headers[headers::DETAIL].contains("failing on purpose"));
    assert_eq!(
        serde_json::from_slice::<Msg>(&letter.body).unwrap(),
        Msg::new("o-9", "x")
    );
    assert_eq!(db.count(&effects, "1=1").await, 0);
    consumer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn message_failing_every_time_ends_in_the_dead_letter_queue() {
    for quorum in [false, true] {
        let broker = TestBroker::connect().await;
        let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
        let topology = if quorum {
            broker.quorum_queue().delivery_limit(10)
        } else {
            broker.classic_queue()
        };
        let (queue, dlq) = (
            topology.queue().to_owned(),
            topology.dead_letter_queue().to_owned(),
        );
        let handler = Recorder::new(&db, &effects, "billing");
        handler.fail_next(u32::MAX);
        let consumer = consumer_builder(&inbox, &unique("idem-test"))
            .max_deliveries(4)
            .bind(topology, handler.clone())
            .start()
            .await
            .unwrap();
        broker
            .send(&queue, &Msg::new("o-5", "x"), PublishOptions::default())
            .await;
        broker
            .eventually("dead-lettered at the limit", WAIT, || async {
                consumer.stats().dead_lettered == 1
            })
            .await;
        assert_eq!(consumer.stats().requeued, 3, "quorum: {quorum}");
        assert_eq!(handler.attempts().len(), 4);
        let letters = broker.drain(&dlq).await;
        assert_eq!(letters.len(), 1);
        assert_eq!(letters[0].reason(), "delivery-limit");
        assert!(letters[0].headers[headers::DETAIL].contains("handler-error"));
        assert_eq!(broker.depth(&queue).await, 0);
        assert_eq!(db.count(&effects, "1=1").await, 0);
        consumer.shutdown().await;
    }
}

/// A message re-published with the `x-delivery-count` a quorum queue once gave it (resubmitted
/// from a dead-letter queue, say) is at its first delivery on a classic queue, which counts
/// nothing: one transient failure requeues it, it is not dead-lettered at the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_delivery_count_on_a_classic_queue_is_not_trusted() {
    use idem_rabbitmq::lapin::BasicProperties;
    use idem_rabbitmq::lapin::options::BasicPublishOptions;
    use idem_rabbitmq::lapin::types::{AMQPValue, FieldTable};

    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let topology = broker.classic_queue();
    let (queue, dlq) = (
        topology.queue().to_owned(),
        topology.dead_letter_queue().to_owned(),
    );
    let handler = Recorder::new(&db, &effects, "billing");
    handler.fail_next(1);
    let consumer = consumer_builder(&inbox, &unique("idem-test"))
        .max_deliveries(3)
        .bind(topology, handler.clone())
        .start()
        .await
        .unwrap();
    let mut headers = FieldTable::default();
    headers.insert("x-delivery-count".into(), AMQPValue::LongLongInt(50));
    let properties = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_message_id("m-stale".into())
        .with_headers(headers);
    let body = serde_json::to_vec(&Msg::new("o-stale", "x")).unwrap();
    broker_channel()
        .await
        .basic_publish(
            "".into(),
            queue.as_str().into(),
            BasicPublishOptions::default(),
            &body,
            properties,
        )
        .await
        .unwrap()
        .await
        .unwrap();
    broker
        .eventually("processed after one requeue", WAIT, || async {
            let stats = consumer.stats();
            stats.acked + stats.dead_lettered == 1
        })
        .await;
    let stats = consumer.stats();
    assert_eq!(
        (stats.acked, stats.requeued, stats.dead_lettered),
        (1, 1, 0),
        "{stats:?}"
    );
    assert_eq!(handler.attempts().len(), 2);
    assert_eq!(broker.depth(&dlq).await, 0);
    assert_eq!(db.count(&effects, "message_key = 'o-stale'").await, 1);
    consumer.shutdown().await;
}

/// An inbox on a fresh table of `db` (PostgreSQL) reached through a proxy that can cut it off.
async fn inbox_behind_a_proxy(db: &TestDb) -> (Proxy, Inbox) {
    let target = std::env::var("IDEM_TEST_POSTGRES_ADDR").unwrap_or("127.0.0.1:5432".into());
    let proxy = Proxy::start(&target).await;
    let mut options = ConnectOptions::new(format!(
        "postgres://postgres@127.0.0.1:{}/test",
        proxy.port()
    ));
    options
        .max_connections(4)
        .connect_timeout(Duration::from_secs(2))
        .acquire_timeout(Duration::from_secs(2))
        .sqlx_logging(false);
    let proxied = Database::connect(options).await.unwrap();
    let inbox = Inbox::builder(proxied)
        .table(db.table("inbox"))
        .build()
        .await
        .unwrap();
    (proxy, inbox)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn database_unavailable_requeues_and_processes_once_it_is_back() {
    let broker = TestBroker::connect().await;
    let db = TestDb::connect(Backend::Postgres).await;
    let effects = db.effects_table().await;
    let (proxy, inbox) = inbox_behind_a_proxy(&db).await;
    // An outage does not count against the message: more requeues than `max_deliveries`, or
    // than a quorum queue's delivery limit, must not dead-letter it.
    for (quorum, key) in [(false, "o-7"), (true, "o-8")] {
        let topology = if quorum {
            broker.quorum_queue().delivery_limit(2)
        } else {
            broker.classic_queue()
        };
        let (queue, dlq) = (
            topology.queue().to_owned(),
            topology.dead_letter_queue().to_owned(),
        );
        let consumer = consumer_builder(&inbox, &unique("idem-test"))
            .max_deliveries(2)
            .bind(topology, Recorder::new(&db, &effects, "billing"))
            .start()
            .await
            .unwrap();

        proxy.cut().await;
        broker
            .send(&queue, &Msg::new(key, "x"), PublishOptions::default())
            .await;
        broker
            .eventually("requeued while the database is down", WAIT, || async {
                consumer.stats().requeued >= 4
            })
            .await;
        let stats = consumer.stats();
        assert_eq!(
            (stats.acked, stats.dead_lettered),
            (0, 0),
            "quorum: {quorum}"
        );
        assert_eq!(broker.depth(&dlq).await, 0, "quorum: {quorum}");
        assert_eq!(db.count(&effects, "1=1").await, i64::from(quorum));

        proxy.restore();
        broker
            .eventually("processed once the database is back", WAIT, || async {
                consumer.stats().acked == 1
            })
            .await;
        let filter = format!("message_key = '{key}'");
        assert_eq!(db.count(&effects, &filter).await, 1);
        assert_eq!(broker.depth(&queue).await, 0);
        assert_eq!(broker.depth(&dlq).await, 0);
        consumer.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_with_messages_in_flight_settles_all_and_loses_none() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let topology = broker.classic_queue();
    let queue = topology.queue().to_owned();
    let handler = Recorder::new(&db, &effects, "billing").slow(Duration::from_millis(150));
    let consumer = consumer_builder(&inbox, &unique("idem-test"))
        .prefetch(10)
        .max_in_flight(5)
        .bind(topology.clone(), handler.clone())
        .start()
        .await
        .unwrap();
    for key in 0..40 {
        broker
            .send(
                &queue,
                &Msg::new(format!("o-{key}"), "x"),
                PublishOptions::default(),
            )
            .await;
    }
    broker
        .eventually("some processed", WAIT, || async {
            consumer.stats().acked >= 5
        })
        .await;
    let started = handler.attempts().len();
    let report = consumer.shutdown().await;
    assert_eq!(report.abandoned, 0);
    assert!(report.completed > 0, "{report:?}");

    // Everything started was finished and acked; the rest is back on the queue.
    let processed = db.count(&effects, "1=1").await;
    assert!(processed as usize >= started, "{processed} < {started}");
    assert_eq!(processed as u32 + broker.depth(&queue).await, 40);

    // A new consumer takes the rest: each message exactly once.
    let rest = start(&inbox, topology, handler.clone().slow(Duration::ZERO)).await;
    broker
        .eventually("the rest processed", WAIT, || async {
            db.count(&effects, "1=1").await == 40
        })
        .await;
    assert_eq!(rest.stats().duplicates, 0);
    rest.shutdown().await;
    assert_eq!(broker.depth(&queue).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_deadline_abandons_handlers_whose_messages_are_redelivered() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let topology = broker.classic_queue();
    let queue = topology.queue().to_owned();
    let handler = Recorder::new(&db, &effects, "billing").slow(Duration::from_secs(5));
    let consumer = consumer_builder(&inbox, &unique("idem-test"))
        .shutdown_timeout(Duration::from_millis(200))
        .bind(topology.clone(), handler.clone())
        .start()
        .await
        .unwrap();
    for key in 0..3 {
        broker
            .send(
                &queue,
                &Msg::new(format!("o-{key}"), "x"),
                PublishOptions::default(),
            )
            .await;
    }
    let runs = handler.clone();
    broker
        .eventually("handlers running", WAIT, || {
            let runs = runs.clone();
            async move { runs.attempts().len() == 3 }
        })
        .await;
    let report = consumer.shutdown().await;
    assert_eq!(report.abandoned, 3);
    // The stopped transactions were rolled back and the messages are back on the queue.
    assert_eq!(db.count(&effects, "1=1").await, 0);
    broker
        .eventually("messages back on the queue", WAIT, || async {
            broker.depth(&queue).await == 3
        })
        .await;
    let rest = start(&inbox, topology, handler.slow(Duration::ZERO)).await;
    broker
        .eventually("redelivered and processed", WAIT, || async {
            db.count(&effects, "1=1").await == 3
        })
        .await;
    rest.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_progress_elsewhere_is_requeued_until_the_other_worker_completes() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let topology = broker.classic_queue();
    let queue = topology.queue().to_owned();
    let handler = Recorder::new(&db, &effects, "mailer")
        .two_phase(Duration::from_secs(30))
        .slow(Duration::from_millis(500))
        .keyed_by_message_id();
    let consumer = consumer_builder(&inbox, &unique("idem-test"))
        .max_in_flight(4)
        .bind(topology, handler)
        .start()
        .await
        .unwrap();
    broker
        .send(&queue, &Msg::new("mail-1", "hi"), with_id("m-1"))
        .await;
    broker
        .send(&queue, &Msg::new("mail-1", "hi"), with_id("m-1"))
        .await;
    broker
        .eventually("one processed, one duplicate", WAIT, || async {
            let stats = consumer.stats();
            stats.acked == 1 && stats.duplicates == 1
        })
        .await;
    assert!(consumer.stats().requeued >= 1);
    assert_eq!(db.count(&effects, "1=1").await, 1);
    consumer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_inbox_behind_a_cloud_events_key() {
    let broker = TestBroker::connect().await;
    let db = TestDb::connect(Backend::Sqlite).await;
    let inbox = Inbox::builder(db.db.clone()).build().await.unwrap();
    let effects = db.effects_table().await;
    let topology = broker.classic_queue();
    let queue = topology.queue().to_owned();
    let seen = Arc::new(AtomicUsize::new(0));
    let handler = CloudEventRecorder {
        inner: Recorder::new(&db, &effects, "audit"),
        seen: seen.clone(),
    };
    let consumer = start(&inbox, topology, handler).await;
    // Same id, two sources: two events. Same source and id again: a duplicate.
    for (source, id) in [("/orders", "1"), ("/refunds", "1"), ("/orders", "1")] {
        let options = PublishOptions::default().cloud_event(source, id, "com.acme.event");
        broker
            .send(&queue, &Msg::new("ignored", source), options)
            .await;
    }
    broker
        .eventually("three deliveries settled", WAIT, || async {
            let stats = consumer.stats();
            stats.acked + stats.duplicates == 3
        })
        .await;
    assert_eq!(consumer.stats().duplicates, 1);
    assert_eq!(db.count(&effects, "1=1").await, 2);
    assert_eq!(seen.load(Ordering::SeqCst), 2);
    consumer.shutdown().await;
}

/// A recorder keyed on the CloudEvents source and id from the AMQP headers.
#[derive(Debug, Clone)]
struct CloudEventRecorder {
    inner: Recorder,
    seen: Arc<AtomicUsize>,
}

impl Handler for CloudEventRecorder {
    type Message = Msg;
    type Output = String;
    type Error = idem_tests::recorder::RecorderError;

    fn consumer(&self) -> &str {
        self.inner.consumer()
    }
    fn key(
        &self,
        _: &Msg,
        metadata: &idem_runtime::Metadata,
    ) -> Result<idem_runtime::MessageKey, idem_runtime::KeyError> {
        metadata.cloud_event_key()
    }
    fn fingerprint(
        &self,
        message: &Msg,
        metadata: &idem_runtime::Metadata,
    ) -> Result<Option<idem_runtime::Fingerprint>, idem_runtime::FingerprintError> {
        self.inner.fingerprint(message, metadata)
    }
    async fn handle(
        &self,
        cx: &idem_runtime::Context<'_>,
        message: Msg,
    ) -> Result<String, Self::Error> {
        self.seen.fetch_add(1, Ordering::SeqCst);
        self.inner.handle(cx, message).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn publisher_ids_and_unroutable_messages() {
    let broker = TestBroker::connect().await;
    let topology = broker.classic_queue();
    let channel_queue = topology.queue().to_owned();
    let db = TestDb::connect(Backend::Sqlite).await;
    let inbox = Inbox::builder(db.db.clone()).build().await.unwrap();
    let effects = db.effects_table().await;
    // Declares the queue.
    let consumer = start(&inbox, topology, Recorder::new(&db, &effects, "c")).await;
    consumer.shutdown().await;

    let generated = broker
        .send(
            &channel_queue,
            &Msg::new("a", "b"),
            PublishOptions::default(),
        )
        .await;
    let parsed = uuid::Uuid::parse_str(&generated).expect("a UUID");
    assert_eq!(parsed.get_version_num(), 7);
    let chosen = broker
        .send(&channel_queue, &Msg::new("a", "b"), with_id("mine"))
        .await;
    assert_eq!(chosen, "mine");
    let letters = broker.drain(&channel_queue).await;
    let ids: Vec<_> = letters
        .iter()
        .map(|l| l.message_id.clone().unwrap())
        .collect();
    assert_eq!(ids, vec![generated, chosen]);

    let unroutable = broker
        .publisher
        .publish(
            "",
            &unique("no_such_queue"),
            &Msg::new("a", "b"),
            PublishOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(unroutable, idem_rabbitmq::Error::Unroutable { .. }),
        "{unroutable:?}"
    );
}

/// Passwords with each reserved character, raw (the URL then cannot be read) and percent-encoded
/// (a wrong password for the broker): neither the consumer's error nor the publisher's shows any
/// part of them. (Raw passwords that the URL reads as a port, such as `4242/secret`, send lapin
/// to another host: the unit tests of `redact_url` cover them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wrong_credentials_fail_start_without_showing_the_password() {
    let db = TestDb::connect(Backend::Sqlite).await;
    let inbox = Inbox::builder(db.db.clone()).build().await.unwrap();
    let effects = db.effects_table().await;
    let passwords = [
        "hunter2-secret",
        "hunter2/secret",
        "hunter2#secret",
        "hunter2?secret",
        "hunter2@secret",
        "hunter2%secret",
        "hunter2%2Fsecret%23%3F%40%25",
    ];
    for password in passwords {
        let url = format!("amqp://guest:{password}@127.0.0.1:5672/%2f");
        let error = Consumer::builder(url.as_str(), inbox.clone())
            .bind(
                QueueTopology::classic(unique("idem_q")),
                Recorder::new(&db, &effects, "c"),
            )
            .start()
            .await
            .unwrap_err();
        let published = idem_rabbitmq::Publisher::connect(url.as_str())
            .await
            .unwrap_err();
        for shown in [
            format!("{error} {error:?}"),
            format!("{published} {published:?}"),
        ] {
            for part in ["hunter2", "secret"] {
                assert!(!shown.contains(part), "{password}: {shown}");
            }
            assert!(shown.contains("***@127.0.0.1"), "{password}: {shown}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn existing_topology_and_a_second_binding_in_one_consumer() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    // The application's own topology: a queue whose dead-letter exchange is named its way.
    let own = broker.track(
        QueueTopology::classic(unique("idem_own"))
            .dead_letter(unique("idem_own_dlx"), unique("idem_own_dlq")),
    );
    let channel = broker_channel().await;
    own.declare(&channel).await.unwrap();
    let (own_queue, own_dlq) = (own.queue().to_owned(), own.dead_letter_queue().to_owned());
    let declared_by_idem = broker.classic_queue();
    let idem_queue = declared_by_idem.queue().to_owned();

    // idem does not declare an existing topology: a queue that is not there fails the start.
    let missing = consumer_builder(&inbox, &unique("idem-test"))
        .bind(
            QueueTopology::existing(unique("idem_absent"), "amq.fanout"),
            Recorder::new(&db, &effects, "a"),
        )
        .start()
        .await
        .unwrap_err();
    assert!(missing.to_string().contains("basic.consume"), "{missing}");

    // Nor one whose dead-letter exchange is not there: the copies would have nowhere to go.
    let no_dlx = consumer_builder(&inbox, &unique("idem-test"))
        .bind(
            QueueTopology::existing(&own_queue, unique("idem_no_such_dlx")),
            Recorder::new(&db, &effects, "a"),
        )
        .start()
        .await
        .unwrap_err();
    assert!(
        no_dlx.to_string().contains("dead-letter exchange"),
        "{no_dlx}"
    );

    let consumer = consumer_builder(&inbox, &unique("idem-test"))
        .bind(
            QueueTopology::existing(&own_queue, own.dead_letter_exchange()),
            Recorder::new(&db, &effects, "own"),
        )
        .bind(declared_by_idem, Recorder::new(&db, &effects, "declared"))
        .start()
        .await
        .unwrap();
    broker
        .send(&own_queue, &Msg::new("o-1", "x"), PublishOptions::default())
        .await;
    broker
        .send(
            &idem_queue,
            &Msg::new("o-1", "x"),
            PublishOptions::default(),
        )
        .await;
    broker
        .send_bytes(&own_queue, b"{", PublishOptions::default())
        .await;
    broker
        .eventually("both queues consumed", WAIT, || async {
            let stats = consumer.stats();
            stats.acked == 2 && stats.dead_lettered == 1
        })
        .await;
    assert_eq!(db.count(&effects, "consumer = 'own'").await, 1);
    assert_eq!(db.count(&effects, "consumer = 'declared'").await, 1);
    let letters = broker.drain(&own_dlq).await;
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].reason(), "undecodable");
    consumer.shutdown().await;
}

/// An operator's layout: a direct dead-letter exchange, its queue bound with the key `dead`, and
/// a work queue that dead-letters with that key. Returns the work queue, the exchange and the
/// dead-letter queue, which is bound only if `bound`.
async fn ops_dead_letter_layout(broker: &TestBroker, bound: bool) -> (String, String, String) {
    let (queue, dlx, dlq) = (
        unique("idem_ops"),
        unique("idem_ops_dlx"),
        unique("idem_ops_dlq"),
    );
    broker.declare_exchange(&dlx, ExchangeKind::Direct).await;
    broker.declare_queue(&dlq, &[]).await;
    if bound {
        broker.bind(&dlq, &dlx, "dead").await;
    }
    let arguments = [
        ("x-dead-letter-exchange", dlx.as_str()),
        ("x-dead-letter-routing-key", "dead"),
    ];
    broker.declare_queue(&queue, &arguments).await;
    (queue, dlx, dlq)
}

/// The consumer's dead-letter copy is routed as the broker routes dead letters: by the queue's
/// `x-dead-letter-routing-key`, which a direct dead-letter exchange needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_letter_copies_honour_the_queues_dead_letter_routing_key() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let (queue, dlx, dlq) = ops_dead_letter_layout(&broker, true).await;
    let topology = QueueTopology::existing(&queue, &dlx).dead_letter_routing_key("dead");
    let consumer = start(&inbox, topology, Recorder::new(&db, &effects, "c")).await;
    broker
        .send_bytes(&queue, b"{not json", with_id("m-bad"))
        .await;
    broker
        .eventually("dead-lettered", WAIT, || async {
            consumer.stats().dead_lettered == 1
        })
        .await;
    let letters = broker.drain(&dlq).await;
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].reason(), "undecodable");
    assert_eq!(letters[0].message_id.as_deref(), Some("m-bad"));
    assert_eq!(consumer.stats().dead_letter_failed, 0);
    assert_eq!(broker.depth(&queue).await, 0);
    consumer.shutdown().await;
}

/// A dead-letter exchange that routes the copy to no queue: the message is neither lost nor
/// requeued in a loop. It gets three quick tries, then one per pause; once the operator binds a
/// dead-letter queue, the next try lands there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unroutable_dead_letter_copy_is_retried_at_a_bounded_pace_and_never_lost() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let (queue, dlx, dlq) = ops_dead_letter_layout(&broker, false).await;
    let topology = QueueTopology::existing(&queue, &dlx).dead_letter_routing_key("dead");
    let pause = Duration::from_secs(4);
    let consumer = consumer_builder(&inbox, &unique("idem-test"))
        .dead_letter_retry(3, pause)
        .bind(topology, Recorder::new(&db, &effects, "c"))
        .start()
        .await
        .unwrap();
    broker
        .send_bytes(&queue, b"{not json", with_id("m-bad"))
        .await;
    // A try is counted once its message is back on the queue: the first two after the usual
    // back-off, the third after the pause.
    broker
        .eventually("two quick tries", WAIT, || async {
            consumer.stats().dead_letter_failed >= 2
        })
        .await;
    // Well inside the pause: no fourth try, nothing dead-lettered, nothing else requeued.
    tokio::time::sleep(pause / 2).await;
    let stats = consumer.stats();
    assert_eq!(
        (
            stats.dead_letter_failed,
            stats.dead_lettered,
            stats.requeued
        ),
        (2, 0, 0),
        "{stats:?}"
    );
    // The operator binds the dead-letter queue: the next try, after the pause, lands there.
    broker.bind(&dlq, &dlx, "dead").await;
    broker
        .eventually("dead-lettered after the pause", WAIT, || async {
            consumer.stats().dead_lettered == 1
        })
        .await;
    let letters = broker.drain(&dlq).await;
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].reason(), "undecodable");
    assert_eq!(consumer.stats().dead_letter_failed, 3);
    assert_eq!(broker.depth(&queue).await, 0);
    consumer.shutdown().await;
}

/// An operator's quorum queue with a delivery limit of 3 and a fanout dead-letter exchange
/// bound to a dead-letter queue; returns the queue, the exchange and the dead-letter queue.
async fn ops_quorum_queue(broker: &TestBroker) -> (String, String, String) {
    let (queue, dlx, dlq) = (
        unique("idem_ops_qq"),
        unique("idem_ops_qq_dlx"),
        unique("idem_ops_qq_dlq"),
    );
    broker.declare_exchange(&dlx, ExchangeKind::Fanout).await;
    broker.declare_queue(&dlq, &[]).await;
    broker.bind(&dlq, &dlx, "").await;
    broker
        .declare_quorum_queue(&queue, &[("x-dead-letter-exchange", dlx.as_str())], 3)
        .await;
    (queue, dlx, dlq)
}

/// An operator's quorum queue (delivery limit 3) consumed as `existing`, its type not stated:
/// the consumer learns it from the broker, so that requeues that must not count (a claim held
/// elsewhere for longer than three requeues, then a database outage) go back as fresh copies,
/// which RabbitMQ before 4.3 does not count. Nothing is dead-lettered; each message has one
/// effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_existing_quorum_queue_requeues_uncounted_past_its_delivery_limit() {
    let broker = TestBroker::connect().await;
    let db = TestDb::connect(Backend::Postgres).await;
    let effects = db.effects_table().await;
    let (proxy, inbox) = inbox_behind_a_proxy(&db).await;
    let (queue, dlx, dlq) = ops_quorum_queue(&broker).await;
    let handler = Recorder::new(&db, &effects, "mailer")
        .two_phase(Duration::from_secs(30))
        .slow(Duration::from_millis(1500))
        .keyed_by_message_id();
    let consumer = start(&inbox, QueueTopology::existing(&queue, &dlx), handler).await;

    // Two copies of m-1: one holds the claim for 1.5 s, the other is requeued meanwhile, every
    // 200 ms at most.
    for _ in 0..2 {
        broker
            .send(&queue, &Msg::new("mail-1", "hi"), with_id("m-1"))
            .await;
    }
    broker
        .eventually("m-1 processed once, its copy a duplicate", WAIT, || async {
            let stats = consumer.stats();
            stats.acked + stats.dead_lettered == 1 && stats.duplicates == 1
        })
        .await;
    let claimed = consumer.stats().requeued;
    assert!(
        claimed > 3,
        "only {claimed} requeues while the claim was held"
    );

    // The database goes away while m-2 arrives: more requeues than the limit again.
    proxy.cut().await;
    broker
        .send(&queue, &Msg::new("mail-2", "hi"), with_id("m-2"))
        .await;
    broker
        .eventually("m-2 requeued while the database is down", WAIT, || async {
            consumer.stats().requeued >= claimed + 4
        })
        .await;
    proxy.restore();
    broker
        .eventually("m-2 processed once the database is back", WAIT, || async {
            let stats = consumer.stats();
            stats.acked + stats.dead_lettered == 2
        })
        .await;
    let stats = consumer.stats();
    assert_eq!((stats.acked, stats.dead_lettered), (2, 0), "{stats:?}");
    assert_eq!(broker.depth(&dlq).await, 0, "the broker dead-lettered");
    assert_eq!(broker.depth(&queue).await, 0);
    assert_eq!(db.count(&effects, "message_key = 'm-1'").await, 1);
    assert_eq!(db.count(&effects, "message_key = 'm-2'").await, 1);
    consumer.shutdown().await;
}

/// A stated queue type that the broker contradicts refuses the start, either way, and leaves no
/// connection behind; a stated type that matches, or none, starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_existing_queue_of_another_type_than_stated_refuses_to_start() {
    use idem_rabbitmq::QueueKind;

    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let (quorum, quorum_dlx, _) = ops_quorum_queue(&broker).await;
    let (classic, classic_dlx, _) = ops_dead_letter_layout(&broker, true).await;
    let cases = [
        (
            &quorum,
            &quorum_dlx,
            QueueKind::Classic,
            "is a quorum queue",
        ),
        (
            &classic,
            &classic_dlx,
            QueueKind::Quorum,
            "is a classic queue",
        ),
    ];
    for (queue, dlx, stated, expected) in cases {
        let name = unique("idem-kind");
        let refused = consumer_builder(&inbox, &name)
            .bind(
                QueueTopology::existing(queue, dlx).queue_kind(stated),
                Recorder::new(&db, &effects, "c"),
            )
            .start()
            .await
            .unwrap_err();
        assert!(
            matches!(
                &refused,
                idem_rabbitmq::Error::Config(idem_rabbitmq::ConfigError::QueueKindMismatch { .. })
            ) && refused.to_string().contains(expected),
            "{refused}"
        );
        broker
            .eventually("no connection left", WAIT, || async {
                !rabbitmqctl(&["list_connections", "client_properties"])
                    .await
                    .contains(&name)
            })
            .await;
    }
    for (queue, dlx, kind) in [
        (&quorum, &quorum_dlx, Some(QueueKind::Quorum)),
        (&classic, &classic_dlx, Some(QueueKind::Classic)),
        (&quorum, &quorum_dlx, None),
    ] {
        let mut topology = QueueTopology::existing(queue, dlx);
        if let Some(kind) = kind {
            topology = topology.queue_kind(kind);
        }
        let consumer = start(&inbox, topology, Recorder::new(&db, &effects, "c")).await;
        consumer.shutdown().await;
    }
}

/// Fails the test if, any time within `window`, the broker has more than `connections`
/// connections named `name` or more than `consumers` consumers on `queue`.
async fn never_more_than(
    name: &str,
    queue: &str,
    connections: usize,
    consumers: usize,
    window: Duration,
) {
    let deadline = tokio::time::Instant::now() + window;
    while tokio::time::Instant::now() < deadline {
        let seen = (connections_named(name).await, consumers_on(queue).await);
        assert!(
            seen.0 <= connections && seen.1 <= consumers,
            "{} connections and {} consumers of ours on the broker",
            seen.0,
            seen.1
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The consumer reaches the broker through a proxy, which is cut for longer than the recovery
/// and retire timeouts (1 s each, while lapin would keep reconnecting for minutes). The session
/// is replaced, and the replaced connections never come back to hold deliveries nobody reads:
/// after the outage the broker has the consumer's two connections and one consumer, which takes
/// every message. Then the proxy is cut again and the consumer shut down during the outage: once
/// the broker is reachable again, nothing of the consumer's appears on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_broker_outage_leaves_no_zombie_connection_or_consumer() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let topology = broker.classic_queue();
    let queue = topology.queue().to_owned();
    let proxy = Proxy::start(&amqp_addr()).await;
    let url = amqp_url_through(&proxy);
    let name = unique("idem-outage");
    let consumer = consumer_builder_at(&url, &inbox, &name)
        .recovery_timeout(Duration::from_secs(1))
        .retire_timeout(Duration::from_secs(1))
        .reconnect_delay(Duration::from_millis(200))
        .prefetch(5)
        .bind(topology, Recorder::new(&db, &effects, "billing"))
        .start()
        .await
        .unwrap();
    assert_eq!(connections_named(&name).await, 2);
    assert_eq!(consumers_on(&queue).await, 1);

    proxy.cut().await;
    broker
        .eventually("the broker dropped the connections", WAIT, || async {
            connections_named(&name).await == 0
        })
        .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    proxy.restore();
    broker
        .eventually("a new session", WAIT, || async {
            consumer.stats().reconnections >= 1 && consumers_on(&queue).await == 1
        })
        .await;
    // lapin retries a lost connection 1, 3, 7 and 15 s after the loss.
    never_more_than(&name, &queue, 2, 1, Duration::from_secs(10)).await;
    assert_eq!(connections_named(&name).await, 2);
    for key in 0..15 {
        broker
            .send(
                &queue,
                &Msg::new(format!("o-{key}"), "x"),
                PublishOptions::default(),
            )
            .await;
    }
    broker
        .eventually("every message processed", WAIT, || async {
            consumer.stats().acked == 15
        })
        .await;

    // Shut down during an outage: the connections lapin is recovering are not ours to leave.
    proxy.cut().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    consumer.shutdown().await;
    proxy.restore();
    never_more_than(&name, &queue, 0, 0, Duration::from_secs(10)).await;
    assert_eq!(broker.depth(&queue).await, 0);
    assert_eq!(db.count(&effects, "1=1").await, 15);
}

/// A broker that accepts connections and never answers (a host gone behind a load balancer):
/// each attempt to open a session gives up after the open timeout and the next one is made,
/// so the consumer is back once the broker answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_that_never_answers_is_given_up_on_and_retried() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let topology = broker.classic_queue();
    let queue = topology.queue().to_owned();
    let proxy = Proxy::start(&amqp_addr()).await;
    let url = amqp_url_through(&proxy);
    let consumer = consumer_builder_at(&url, &inbox, &unique("idem-silent"))
        .recovery_timeout(Duration::from_secs(1))
        .open_timeout(Duration::from_secs(2))
        .retire_timeout(Duration::from_secs(1))
        .reconnect_delay(Duration::from_millis(200))
        .bind(topology, Recorder::new(&db, &effects, "billing"))
        .start()
        .await
        .unwrap();

    proxy.silence().await;
    // Long enough for lapin's recovery to give up and for sessions to be opened into silence.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let waiting = proxy.silent_links();
    tokio::time::sleep(Duration::from_secs(6)).await;
    // Each attempt given up on (about three meanwhile) closed its connection: the connections
    // left waiting do not grow with the attempts.
    let later = proxy.silent_links();
    assert!(
        later <= waiting + 1,
        "{waiting} then {later} silent connections"
    );
    proxy.restore();
    broker
        .send(&queue, &Msg::new("o-1", "x"), PublishOptions::default())
        .await;
    broker
        .eventually(
            "the message processed once the broker answers",
            WAIT,
            || async { db.count(&effects, "1=1").await == 1 },
        )
        .await;
    let stats = consumer.stats();
    assert!(stats.reconnections >= 1, "{stats:?}");
    // Sessions were opened into the silence and given up on.
    assert!(stats.failed_reconnections >= 1, "{stats:?}");
    consumer.shutdown().await;
    proxy.cut().await;
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
    let broker = TestBroker::connect().await;
    let policy = RetentionPolicy::default().with_cleanup_interval(Duration::from_millis(200));
    let (db, inbox, effects) =
        inbox_and_effects_with(Backend::Postgres, |inbox| inbox.retention(policy)).await;
    let table = inbox.table().to_string();
    seed_expired(&db, &table, "old", 10).await;

    let consumer = start(
        &inbox,
        broker.classic_queue(),
        Recorder::new(&db, &effects, "c"),
    )
    .await;
    broker
        .eventually("expired records deleted", WAIT, || async {
            db.count(&table, "1=1").await == 0
        })
        .await;
    let report = consumer.shutdown().await;
    assert_eq!(report.cleanup.map(|cleanup| cleanup.deleted), Some(10));

    // Stopped with the consumer: records that expired since stay.
    seed_expired(&db, &table, "old", 10).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(db.count(&table, "1=1").await, 10);

    // A consumer told not to run it does not.
    let consumer = consumer_builder(&inbox, &unique("idem-test"))
        .without_cleaner()
        .bind(broker.classic_queue(), Recorder::new(&db, &effects, "c"))
        .start()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(db.count(&table, "1=1").await, 10);
    assert_eq!(consumer.shutdown().await.cleanup, None);
}

/// What a test's thread logs, in memory.
#[derive(Debug, Clone, Default)]
struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// A pool that leaves handlers no connection while the cleaner runs (on PostgreSQL the cleaner
/// holds two) is warned about at start; a pool with room, or a consumer that does not run the
/// cleaner, is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pool_too_small_for_the_cleaner_is_warned_about_at_start() {
    use tracing_subscriber::util::SubscriberInitExt;

    let broker = TestBroker::connect().await;
    for (pool, cleaner, warned) in [(2, true, true), (3, true, false), (2, false, false)] {
        let db = TestDb::connect_with_pool(Backend::Postgres, pool).await;
        let effects = db.effects_table().await;
        let inbox = Inbox::builder(db.db.clone())
            .table(db.table("inbox"))
            .build()
            .await
            .unwrap();
        let logs = Logs::default();
        let _capture = tracing_subscriber::fmt()
            .with_writer(logs.clone())
            .with_ansi(false)
            .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
            .finish()
            .set_default();
        let mut builder = consumer_builder(&inbox, &unique("idem-test"))
            .bind(broker.classic_queue(), Recorder::new(&db, &effects, "c"));
        if !cleaner {
            builder = builder.without_cleaner();
        }
        let consumer = builder.start().await.unwrap();
        let text = logs.text();
        assert_eq!(
            text.contains("too small for its cleaner"),
            warned,
            "pool {pool}, cleaner {cleaner}: {text}"
        );
        consumer.shutdown().await;
    }
}

async fn broker_channel() -> idem_rabbitmq::lapin::Channel {
    let connection = idem_rabbitmq::connect(&amqp_url().into(), "idem-test setup")
        .await
        .unwrap();
    connection.create_channel().await.unwrap()
}

/// Messages as `id|body` text.
#[derive(Debug, Clone, Copy)]
struct PipeText;

impl idem_rabbitmq::Codec for PipeText {
    fn decode<M: serde::de::DeserializeOwned>(
        &self,
        content_type: Option<&str>,
        payload: &[u8],
    ) -> Result<M, idem_rabbitmq::DecodeError> {
        if content_type != Some("text/plain") {
            return Err(idem_rabbitmq::DecodeError::UnsupportedContentType(
                content_type.unwrap_or_default().to_owned(),
            ));
        }
        let text = std::str::from_utf8(payload)
            .map_err(|e| idem_rabbitmq::DecodeError::Malformed(e.to_string()))?;
        let (id, body) = text
            .split_once('|')
            .ok_or_else(|| idem_rabbitmq::DecodeError::Malformed("no `|`".into()))?;
        serde_json::from_value(serde_json::json!({ "id": id, "body": body }))
            .map_err(|e| idem_rabbitmq::DecodeError::Malformed(e.to_string()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_swapped_codec_decodes_payloads() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let topology = broker.classic_queue();
    let (queue, dlq) = (
        topology.queue().to_owned(),
        topology.dead_letter_queue().to_owned(),
    );
    let binding = idem_rabbitmq::Binding::new(topology, Recorder::new(&db, &effects, "text"))
        .with_codec(PipeText);
    let consumer = consumer_builder(&inbox, &unique("idem-test"))
        .bind_with(binding)
        .start()
        .await
        .unwrap();
    let text = PublishOptions::default().content_type("text/plain");
    broker.send_bytes(&queue, b"o-1|hello", text.clone()).await;
    broker.send_bytes(&queue, b"o-1|hello", text.clone()).await;
    broker.send_bytes(&queue, b"no separator", text).await;
    broker
        .send(&queue, &Msg::new("o-2", "json"), PublishOptions::default())
        .await;
    broker
        .eventually("four settled", WAIT, || async {
            let stats = consumer.stats();
            stats.acked + stats.duplicates + stats.dead_lettered == 4
        })
        .await;
    let stats = consumer.stats();
    assert_eq!(
        (stats.acked, stats.duplicates, stats.dead_lettered),
        (1, 1, 2)
    );
    assert_eq!(db.count(&effects, "body = 'hello'").await, 1);
    let mut reasons: Vec<String> = broker
        .drain(&dlq)
        .await
        .iter()
        .map(|letter| letter.headers[headers::DETAIL].clone())
        .collect();
    reasons.sort();
    assert!(
        reasons[0].contains("malformed payload: no `|`"),
        "{reasons:?}"
    );
    assert!(
        reasons[1].contains("unsupported content type \"application/json\""),
        "{reasons:?}"
    );
    consumer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_publish_is_retried_with_the_same_message_id() {
    use idem_rabbitmq::lapin::options::{QueueDeclareOptions, QueuePurgeOptions};
    use idem_rabbitmq::lapin::types::{AMQPValue, FieldTable};

    let broker = TestBroker::connect().await;
    let channel = broker_channel().await;
    // A queue that holds one message and refuses (nacks) publishes beyond it.
    let queue = unique("idem_full");
    broker.track(QueueTopology::classic(queue.clone()));
    let mut arguments = FieldTable::default();
    arguments.insert("x-max-length".into(), AMQPValue::LongLongInt(1));
    arguments.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    let options = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.as_str().into(), options, arguments)
        .await
        .unwrap();
    broker
        .send(&queue, &Msg::new("blocker", "x"), PublishOptions::default())
        .await;

    let publisher = idem_rabbitmq::Publisher::connect(amqp_url().as_str())
        .await
        .unwrap()
        .with_max_attempts(3);
    let refused = publisher
        .publish("", &queue, &Msg::new("o-1", "x"), with_id("m-1"))
        .await;
    assert!(
        matches!(&refused, Err(idem_rabbitmq::Error::NotConfirmed { attempts: 3, last, .. }) if last.contains("refused")),
        "{refused:?}"
    );

    // Room appears while the publisher is retrying: a later attempt is confirmed, with the id
    // the caller gave.
    let purge = {
        let channel = channel.clone();
        let queue = queue.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            channel
                .queue_purge(queue.as_str().into(), QueuePurgeOptions::default())
                .await
                .unwrap();
        })
    };
    let accepted = publisher
        .publish("", &queue, &Msg::new("o-2", "x"), with_id("m-2"))
        .await
        .expect("confirmed after a retry");
    purge.await.unwrap();
    assert_eq!(accepted, "m-2");
    let stored = broker.drain(&queue).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].message_id.as_deref(), Some("m-2"));
    publisher.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_binding_does_not_starve_a_busy_one() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let (idle, busy) = (broker.classic_queue(), broker.classic_queue());
    let busy_queue = busy.queue().to_owned();
    let consumer = consumer_builder(&inbox, &unique("idem-test"))
        .max_in_flight(1)
        .bind(idle, Recorder::new(&db, &effects, "idle"))
        .bind(busy, Recorder::new(&db, &effects, "busy"))
        .start()
        .await
        .unwrap();
    for key in 0..5 {
        broker
            .send(
                &busy_queue,
                &Msg::new(format!("o-{key}"), "x"),
                PublishOptions::default(),
            )
            .await;
    }
    broker
        .eventually("the busy queue consumed", WAIT, || async {
            consumer.stats().acked == 5
        })
        .await;
    assert_eq!(db.count(&effects, "consumer = 'busy'").await, 5);
    consumer.shutdown().await;
}

/// A codec that panics on a payload saying so.
#[derive(Debug, Clone, Copy)]
struct PanickyJson;

impl idem_rabbitmq::Codec for PanickyJson {
    fn decode<M: serde::de::DeserializeOwned>(
        &self,
        content_type: Option<&str>,
        payload: &[u8],
    ) -> Result<M, idem_rabbitmq::DecodeError> {
        assert!(payload != b"\"panic\"", "codec panics on purpose");
        idem_rabbitmq::Json.decode(content_type, payload)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_panic_outside_the_handler_still_settles_the_delivery() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let topology = broker.classic_queue();
    let (queue, dlq) = (
        topology.queue().to_owned(),
        topology.dead_letter_queue().to_owned(),
    );
    let binding = idem_rabbitmq::Binding::new(topology, Recorder::new(&db, &effects, "c"))
        .with_codec(PanickyJson);
    let consumer = consumer_builder(&inbox, &unique("idem-test"))
        .max_deliveries(2)
        .bind_with(binding)
        .start()
        .await
        .unwrap();
    broker.send(&queue, &"panic", with_id("m-panic")).await;
    broker
        .send(&queue, &Msg::new("o-1", "x"), PublishOptions::default())
        .await;
    broker
        .eventually(
            "the panicking message dead-lettered, the other processed",
            WAIT,
            || async {
                let stats = consumer.stats();
                stats.dead_lettered == 1 && stats.acked == 1
            },
        )
        .await;
    assert_eq!(consumer.stats().requeued, 1);
    let letters = broker.drain(&dlq).await;
    assert_eq!(letters[0].reason(), "delivery-limit");
    assert!(letters[0].headers[headers::DETAIL].contains("codec panics on purpose"));
    consumer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_letter_copy_is_persistent_and_does_not_expire() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let topology = broker.classic_queue();
    let (queue, dlq) = (
        topology.queue().to_owned(),
        topology.dead_letter_queue().to_owned(),
    );
    let consumer = start(&inbox, topology, Recorder::new(&db, &effects, "c")).await;
    let options = with_id("m-ttl").expiration(Duration::from_secs(600));
    broker.send_bytes(&queue, b"{not json", options).await;
    broker
        .eventually("dead-lettered", WAIT, || async {
            consumer.stats().dead_lettered == 1
        })
        .await;
    let letters = broker.drain(&dlq).await;
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].expiration, None);
    assert_eq!(letters[0].delivery_mode, Some(2));
    assert_eq!(letters[0].message_id.as_deref(), Some("m-ttl"));
    consumer.shutdown().await;
}

/// Another handler that claims the name `billing`, which the `Recorder`s here use.
#[idem_runtime::idempotent(key = msg.id.clone(), consumer = "billing", mode = two_phase)]
async fn other_billing(msg: Msg) -> Result<(), std::convert::Infallible> {
    let _ = msg;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_handlers_under_one_consumer_name_are_refused_one_handler_on_two_queues_is_not() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let (first, second) = (broker.classic_queue(), broker.classic_queue());
    let recorder = Recorder::new(&db, &effects, "billing");

    let refused = consumer_builder(&inbox, &unique("idem-test"))
        .bind(first.clone(), recorder.clone())
        .bind(second.clone(), other_billing_handler())
        .start()
        .await;
    match refused {
        Err(idem_rabbitmq::Error::Config(idem_rabbitmq::ConfigError::SharedConsumerName {
            consumer,
            ..
        })) => assert_eq!(consumer, "billing"),
        other => panic!("expected a configuration error, got {other:?}"),
    }

    // One handler on two queues: a message that reaches it through both is processed once.
    let consumer = consumer_builder(&inbox, &unique("idem-test"))
        .bind(first.clone(), recorder.clone())
        .bind(second.clone(), recorder)
        .start()
        .await
        .expect("one handler binds to two queues");
    for topology in [&first, &second] {
        broker
            .send(topology.queue(), &Msg::new("o-1", "x"), with_id("m-1"))
            .await;
    }
    broker
        .eventually("both copies settled", WAIT, || async {
            let stats = consumer.stats();
            stats.acked + stats.duplicates == 2
        })
        .await;
    assert_eq!(consumer.stats().duplicates, 1);
    assert_eq!(db.count(&effects, "1=1").await, 1);
    consumer.shutdown().await;
}

/// A consumer on a fresh classic queue whose first message, `o-1`, failed once and now waits
/// out a back-off of `backoff` before it is requeued. Returns the database, its effects table,
/// the queue and the consumer.
async fn o1_in_back_off(
    broker: &TestBroker,
    backoff: Duration,
    configure: impl FnOnce(ConsumerBuilder) -> ConsumerBuilder,
) -> (TestDb, String, String, Consumer) {
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let topology = broker.classic_queue();
    let queue = topology.queue().to_owned();
    let handler = Recorder::new(&db, &effects, "billing");
    handler.fail_next(1);
    let builder = consumer_builder(&inbox, &unique("idem-test")).retry_backoff(backoff, backoff);
    let consumer = configure(builder)
        .bind(topology, handler.clone())
        .start()
        .await
        .unwrap();
    broker
        .send(&queue, &Msg::new("o-1", "x"), PublishOptions::default())
        .await;
    broker
        .eventually("o-1 failed once", WAIT, || async {
            handler.attempts().len() == 1
        })
        .await;
    (db, effects, queue, consumer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_waiting_out_its_back_off_leaves_room_for_others() {
    let broker = TestBroker::connect().await;
    let backoff = Duration::from_secs(10);
    let (db, effects, queue, consumer) =
        o1_in_back_off(&broker, backoff, |builder| builder.max_in_flight(1)).await;
    // o-1 now waits 10 s before it is requeued; the one handler slot is free meanwhile.
    broker
        .send(&queue, &Msg::new("o-2", "x"), PublishOptions::default())
        .await;
    broker
        .eventually(
            "o-2 processed during o-1's back-off",
            backoff / 2,
            || async { consumer.stats().acked == 1 },
        )
        .await;
    assert_eq!(db.count(&effects, "message_key = 'o-2'").await, 1);
    assert_eq!(consumer.stats().requeued, 0, "o-1 is still waiting");
    broker
        .eventually("o-1 processed after its back-off", WAIT, || async {
            consumer.stats().acked == 2
        })
        .await;
    assert_eq!(db.count(&effects, "1=1").await, 2);
    consumer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_requeues_a_message_in_back_off_at_once() {
    let broker = TestBroker::connect().await;
    let (db, effects, queue, consumer) = o1_in_back_off(&broker, Duration::from_secs(60), |b| {
        b.shutdown_timeout(Duration::from_secs(5))
    })
    .await;
    // The message would wait a minute; the shutdown requeues it within its 5 s deadline, rather
    // than abandon it there.
    let report = consumer.shutdown().await;
    assert_eq!(report.abandoned, 0, "{report:?}");
    broker
        .eventually("o-1 back on the queue", WAIT, || async {
            broker.depth(&queue).await == 1
        })
        .await;
    assert_eq!(db.count(&effects, "1=1").await, 0);
}

/// Dead-letter copies published side by side on the consumer's confirm channel, some routed by
/// the operator's direct dead-letter exchange and some routed to no queue: each copy's fate is
/// its own. A copy the exchange returned never passes for taken (its original acked, the
/// message lost), and a copy taken never passes for returned (its original dead-lettered twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_letter_copies_in_flight_together_are_each_told_their_own_fate() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let (queue, dlx, dlq, orders) = ops_orders_layout(&broker, None).await;
    let producer = Publisher::connect(amqp_url()).await.unwrap();
    const EACH: usize = 60;
    for i in 0..EACH {
        for key in ["placed", "cancelled"] {
            producer
                .publish_bytes(&orders, key, b"{not json", with_id(&format!("{key}-{i}")))
                .await
                .unwrap();
        }
    }
    // Room for every message at once, and a short pause between tries of a copy that has no
    // queue: the routed ones are never held up behind them.
    let consumer = consumer_builder(&inbox, &unique("idem-test"))
        .prefetch(500)
        .dead_letter_retry(1, Duration::from_secs(1))
        .bind(
            QueueTopology::existing(&queue, &dlx),
            Recorder::new(&db, &effects, "c"),
        )
        .start()
        .await
        .unwrap();
    broker
        .eventually("every copy tried", WAIT, || async {
            let stats = consumer.stats();
            stats.dead_lettered >= EACH as u64 && stats.dead_letter_failed >= EACH as u64
        })
        .await;
    consumer.shutdown().await;
    let mut letters: Vec<String> = broker
        .drain(&dlq)
        .await
        .into_iter()
        .map(|letter| letter.message_id.unwrap_or_default())
        .collect();
    letters.sort();
    let mut placed: Vec<String> = (0..EACH).map(|i| format!("placed-{i}")).collect();
    placed.sort();
    assert_eq!(
        letters, placed,
        "one copy of each placed order, none of the others"
    );
    // Every cancelled order is still on its queue, waiting for a dead-letter queue.
    assert_eq!(broker.depth(&queue).await, EACH as u32);
    assert_eq!(db.count(&effects, "1=1").await, 0);
}

/// A classic topology on a virtual host whose default queue type is quorum: its queue is
/// classic, as the consumer takes it to be (a quorum queue it took for classic would count the
/// requeues it means not to count, and dead-letter by the broker's limit without a reason), and
/// a classic queue an earlier version declared without its type is still consumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_classic_topology_is_classic_on_a_virtual_host_that_defaults_to_quorum() {
    let vhost = unique("idem_vhost_quorum");
    rabbitmqctl(&["add_vhost", &vhost, "--default-queue-type", "quorum"]).await;
    rabbitmqctl(&["set_permissions", "-p", &vhost, "guest", ".*", ".*", ".*"]).await;
    let base = amqp_url();
    let (server, _) = base.rsplit_once('/').expect("a virtual host in the URL");
    let url = format!("{server}/{vhost}");
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let queue = unique("idem_q");
    let start = || {
        start_on(
            &url,
            &inbox,
            QueueTopology::classic(&queue),
            Recorder::new(&db, &effects, "c"),
        )
    };
    let first = start().await.expect("consumer starts");
    let types = rabbitmqctl(&["list_queues", "-p", &vhost, "name", "type"]).await;
    first.shutdown().await;
    // Started again, it declares the same queue.
    let again = start().await;
    let again_ok = again.is_ok();
    if let Ok(consumer) = again {
        consumer.shutdown().await;
    }
    rabbitmqctl(&["delete_vhost", &vhost]).await;
    // On the default virtual host, a classic queue as an earlier version declared it: with its
    // dead-letter exchange, without its type.
    let broker = TestBroker::connect().await;
    let earlier = broker.track(QueueTopology::classic(unique("idem_q")));
    let dlx = earlier.dead_letter_exchange().to_owned();
    broker
        .declare_queue(earlier.queue(), &[("x-dead-letter-exchange", dlx.as_str())])
        .await;
    let consumed = start_on(
        &amqp_url(),
        &inbox,
        earlier,
        Recorder::new(&db, &effects, "c"),
    )
    .await;
    let line = types
        .lines()
        .find(|line| line.split_whitespace().next() == Some(queue.as_str()))
        .unwrap_or_else(|| panic!("{queue} not listed: {types}"));
    assert!(line.ends_with("classic"), "{line}");
    assert!(again_ok, "a second start fails");
    consumed
        .expect("a queue declared without its type is consumed")
        .shutdown()
        .await;
}

async fn start_on<H>(
    url: &str,
    inbox: &Inbox,
    topology: QueueTopology,
    handler: H,
) -> Result<Consumer, idem_rabbitmq::Error>
where
    H: Handler<Message = Msg> + 'static,
{
    consumer_builder_at(url, inbox, &unique("idem-test"))
        .bind(topology, handler)
        .start()
        .await
}

/// A message requeued uncounted on a quorum queue goes back as a fresh copy through the default
/// exchange. Dead-lettered later, it is still routed by the key it was published with (the
/// operator's direct dead-letter exchange has a queue for that key only), and its dead-letter
/// copy names the exchange and routing key it first came by, for a resubmission.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fresh_copy_is_dead_lettered_by_the_route_it_first_came_by() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let (queue, dlx, dlq, orders) = ops_orders_layout(&broker, Some(20)).await;
    // Each copy fails for good once it runs; while one runs (1.5 s), the other is requeued.
    let mut handler = Recorder::new(&db, &effects, "mailer")
        .two_phase(Duration::from_secs(30))
        .slow(Duration::from_millis(1500))
        .keyed_by_message_id();
    handler.permanent = true;
    handler.fail_next(2);
    let consumer = start(&inbox, QueueTopology::existing(&queue, &dlx), handler).await;
    let producer = Publisher::connect(amqp_url()).await.unwrap();
    for _ in 0..2 {
        producer
            .publish(&orders, "placed", &Msg::new("mail-1", "hi"), with_id("m-1"))
            .await
            .unwrap();
    }
    broker
        .eventually("both copies dead-lettered", WAIT, || async {
            consumer.stats().dead_lettered == 2
        })
        .await;
    let stats = consumer.stats();
    assert!(stats.requeued > 0, "{stats:?}");
    assert_eq!(stats.dead_letter_failed, 0, "{stats:?}");
    let letters = broker.drain(&dlq).await;
    assert_eq!(letters.len(), 2);
    for letter in &letters {
        assert_eq!(letter.reason(), "handler-permanent-error");
        let header = |name: &str| letter.headers.get(name).map(String::as_str);
        assert_eq!(header(headers::EXCHANGE), Some(orders.as_str()));
        assert_eq!(header(headers::ROUTING_KEY), Some("placed"));
    }
    consumer.shutdown().await;
}

/// An operator's quorum queue whose delivery limit (here 1) is below the consumer's
/// `max_deliveries`, stated on the topology: the consumer dead-letters a failing message itself,
/// with its reason and by the route it came by, at the delivery after which the broker would
/// have dead-lettered it without a reason (a fresh copy, by the queue's name, unroutable).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stated_broker_delivery_limit_is_reached_by_the_consumer_first() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let (queue, dlx, dlq, orders) = ops_orders_layout(&broker, Some(1)).await;
    let handler = Recorder::new(&db, &effects, "mailer").keyed_by_message_id();
    handler.fail_next(100);
    let topology = QueueTopology::existing(&queue, &dlx).delivery_limit(1);
    let consumer = start(&inbox, topology, handler).await;
    let producer = Publisher::connect(amqp_url()).await.unwrap();
    producer
        .publish(&orders, "placed", &Msg::new("mail-1", "hi"), with_id("m-1"))
        .await
        .unwrap();
    broker
        .eventually("the message dead-lettered", WAIT, || async {
            broker.depth(&dlq).await == 1
        })
        .await;
    let letters = broker.drain(&dlq).await;
    assert_eq!(
        letters[0].reason(),
        "delivery-limit",
        "{:?}",
        letters[0].headers
    );
    assert_eq!(consumer.stats().dead_lettered, 1);
    consumer.shutdown().await;
}

/// An operator's layout: a direct exchange of orders routing `placed` and `cancelled` to a work
/// queue (quorum with the broker's delivery limit `quorum_limit`, if given), whose direct
/// dead-letter exchange keeps the routing key and has a queue for `placed` only. Returns the
/// work queue, the dead-letter exchange, the dead-letter queue and the exchange of orders.
async fn ops_orders_layout(
    broker: &TestBroker,
    quorum_limit: Option<i64>,
) -> (String, String, String, String) {
    let (queue, dlx, dlq, orders) = (
        unique("idem_ops_routed"),
        unique("idem_ops_routed_dlx"),
        unique("idem_ops_routed_dlq"),
        unique("idem_ops_orders"),
    );
    broker.declare_exchange(&orders, ExchangeKind::Direct).await;
    broker.declare_exchange(&dlx, ExchangeKind::Direct).await;
    broker.declare_queue(&dlq, &[]).await;
    broker.bind(&dlq, &dlx, "placed").await;
    let arguments = [("x-dead-letter-exchange", dlx.as_str())];
    if let Some(limit) = quorum_limit {
        broker.declare_quorum_queue(&queue, &arguments, limit).await;
    } else {
        broker.declare_queue(&queue, &arguments).await;
    }
    for key in ["placed", "cancelled"] {
        broker.bind(&queue, &orders, key).await;
    }
    (queue, dlx, dlq, orders)
}

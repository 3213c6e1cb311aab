//! Copies of a message through the RabbitMQ adapter, each with one effect: a producer's retry, a
//! redelivery after a failure or after a crash between the commit and the acknowledgement,
//! competing consumers, a fanout, a claim held by another worker, a key taken from CloudEvents
//! headers, one handler bound to two queues. The real broker on 127.0.0.1:5672 and the real
//! PostgreSQL (SQLite for one test); each test makes its own queues and tables.
//!
//! Run: `cargo test -p idem-tests --test rabbitmq rabbitmq_duplicates::` with RabbitMQ and PostgreSQL up (see
//! README).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_rabbitmq::lapin::ExchangeKind;
use idem_rabbitmq::{PublishOptions, QueueTopology};
use idem_runtime::Handler;
use idem_tests::rabbit::{close_connections, consumer_builder, with_id};
use idem_tests::{Backend, Fixture, Msg, Recorder, unique};

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn producer_retry_publishing_twice_has_one_effect() {
    let t = Fixture::new().await;
    let consumer = t.start(t.recorder("billing").keyed_by_message_id()).await;

    // The producer did not get its confirm and published again, with the same message id.
    let msg = Msg::new("order-1", "charge 10");
    t.send(&msg, with_id("m-1")).await;
    t.send(&msg, with_id("m-1")).await;

    t.broker
        .eventually("both copies settled", WAIT, || async {
            let stats = consumer.stats();
            stats.acked + stats.duplicates == 2
        })
        .await;
    assert_eq!(t.effects("1=1").await, 1);
    let stats = consumer.stats();
    assert_eq!((stats.acked, stats.duplicates), (1, 1));
    assert_eq!(t.depth().await, 0);
    consumer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nacked_and_redelivered_message_has_one_effect() {
    let t = Fixture::new().await;
    let handler = t.recorder("billing");
    handler.fail_next(2);
    let consumer = t.start(handler.clone()).await;

    t.send(&Msg::new("order-2", "x"), PublishOptions::default())
        .await;
    t.broker
        .eventually("processed after two requeues", WAIT, || async {
            consumer.stats().acked == 1
        })
        .await;
    assert_eq!(consumer.stats().requeued, 2);
    assert_eq!(handler.attempts().len(), 3);
    // The two failed runs were rolled back with their claims.
    assert_eq!(t.effects("1=1").await, 1);
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
    let t = Fixture::new().await;
    let name = unique("idem-crash");
    // The broker drops the consumer's connection while the first run is in its handler: the
    // handler's transaction still commits, but its ack can no longer reach the broker.
    let cut = name.clone();
    let handler = t.recorder("billing").after_first_effect(move || {
        let cut = cut.clone();
        async move {
            assert!(close_connections(&cut).await >= 1, "no connection to close");
        }
    });
    let consumer = consumer_builder(&t.inbox, &name)
        .recovery_timeout(recovery_timeout)
        .reconnect_delay(Duration::from_millis(100))
        .bind(t.topology.clone(), handler.clone())
        .start()
        .await
        .unwrap();

    t.send(&Msg::new("order-3", "x"), PublishOptions::default())
        .await;
    t.broker
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
    assert_eq!(t.effects("1=1").await, 1);

    // After recovery, consuming continues by itself.
    t.send(&Msg::new("order-4", "y"), PublishOptions::default())
        .await;
    t.broker
        .eventually("a new message after recovery", WAIT, || async {
            consumer.stats().acked == 1
        })
        .await;
    assert_eq!(t.effects("1=1").await, 2);
    assert_eq!(t.depth().await, 0);
    consumer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_consumer_connections_with_a_burst_of_duplicates_have_one_effect_per_key() {
    let t = Fixture::builder().quorum().build().await;
    let handler = t.recorder("billing").keyed_by_message_id();
    let first = t.start(handler.clone()).await;
    let second = t.start(handler).await;

    for copy in 0..3 {
        for key in 0..100 {
            let options = with_id(&format!("m-{key}")).correlation_id(format!("copy-{copy}"));
            t.send(&Msg::new(format!("o-{key}"), "x"), options).await;
        }
    }
    t.broker
        .eventually("300 deliveries settled", WAIT, || async {
            let (a, b) = (first.stats(), second.stats());
            a.acked + a.duplicates + b.acked + b.duplicates == 300
        })
        .await;
    let (a, b) = (first.stats(), second.stats());
    assert_eq!(a.acked + b.acked, 100, "{a:?} {b:?}");
    assert_eq!(t.effects("1=1").await, 100);
    assert_eq!(
        t.effects(
            "message_key IN (SELECT message_key FROM (SELECT message_key, COUNT(*) AS n FROM \
             (SELECT message_key FROM effects_dummy) d GROUP BY message_key) g WHERE n > 1)"
                .replace("effects_dummy", &t.effects)
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
    let t = Fixture::new().await;
    let exchange = unique("idem_fanout");
    t.broker.track_exchange(&exchange);
    let billing_queue = t
        .broker
        .track(QueueTopology::classic(unique("idem_billing")).bind(
            &exchange,
            ExchangeKind::Fanout,
            "",
        ));
    let shipping_queue = t
        .broker
        .track(QueueTopology::classic(unique("idem_shipping")).bind(
            &exchange,
            ExchangeKind::Fanout,
            "",
        ));
    // Both consumers share one inbox table; their records do not collide.
    let billing = t
        .start_on(billing_queue, t.recorder("billing").keyed_by_message_id())
        .await;
    let shipping = t
        .start_on(shipping_queue, t.recorder("shipping").keyed_by_message_id())
        .await;

    for key in 0..20 {
        let msg = Msg::new(format!("o-{key}"), "placed");
        for _ in 0..2 {
            t.broker
                .publisher
                .publish(&exchange, "", &msg, with_id(&format!("m-{key}")))
                .await
                .unwrap();
        }
    }
    t.broker
        .eventually("each consumer settled 40 deliveries", WAIT, || async {
            let (a, b) = (billing.stats(), shipping.stats());
            a.acked + a.duplicates == 40 && b.acked + b.duplicates == 40
        })
        .await;
    assert_eq!(t.effects("consumer = 'billing'").await, 20);
    assert_eq!(t.effects("consumer = 'shipping'").await, 20);
    billing.shutdown().await;
    shipping.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_progress_elsewhere_is_requeued_until_the_other_worker_completes() {
    let t = Fixture::new().await;
    let handler = t
        .recorder("mailer")
        .two_phase(Duration::from_secs(30))
        .slow(Duration::from_millis(500))
        .keyed_by_message_id();
    let consumer = t.start_with(|c| c.max_in_flight(4), handler).await;
    t.send(&Msg::new("mail-1", "hi"), with_id("m-1")).await;
    t.send(&Msg::new("mail-1", "hi"), with_id("m-1")).await;
    t.broker
        .eventually("one processed, one duplicate", WAIT, || async {
            let stats = consumer.stats();
            stats.acked == 1 && stats.duplicates == 1
        })
        .await;
    assert!(consumer.stats().requeued >= 1);
    assert_eq!(t.effects("1=1").await, 1);
    consumer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_inbox_behind_a_cloud_events_key() {
    let t = Fixture::builder().on(Backend::Sqlite).build().await;
    let seen = Arc::new(AtomicUsize::new(0));
    let handler = CloudEventRecorder {
        inner: t.recorder("audit"),
        seen: seen.clone(),
    };
    let consumer = t.start(handler).await;
    // Same id, two sources: two events. Same source and id again: a duplicate.
    for (source, id) in [("/orders", "1"), ("/refunds", "1"), ("/orders", "1")] {
        let options = PublishOptions::default().cloud_event(source, id, "com.acme.event");
        t.send(&Msg::new("ignored", source), options).await;
    }
    t.broker
        .eventually("three deliveries settled", WAIT, || async {
            let stats = consumer.stats();
            stats.acked + stats.duplicates == 3
        })
        .await;
    assert_eq!(consumer.stats().duplicates, 1);
    assert_eq!(t.effects("1=1").await, 2);
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
    ) -> Result<
        Option<idem_runtime::fingerprint::Fingerprint>,
        idem_runtime::fingerprint::FingerprintError,
    > {
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

/// Another handler that claims the name `billing`, which the `Recorder`s here use.
#[idem_runtime::idempotent(key = msg.id.clone(), consumer = "billing", mode = two_phase)]
async fn other_billing(msg: Msg) -> Result<(), std::convert::Infallible> {
    let _ = msg;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_handlers_under_one_consumer_name_are_refused_one_handler_on_two_queues_is_not() {
    let t = Fixture::new().await;
    let (first, second) = (t.topology.clone(), t.broker.classic_queue());
    let recorder = t.recorder("billing");

    let refused = t
        .consumer()
        .bind(first.clone(), recorder.clone())
        .bind(second.clone(), other_billing_handler())
        .start()
        .await;
    let refused = refused.expect_err("refused");
    match refused.settings() {
        [idem_rabbitmq::SettingError::SharedConsumerName { consumer, .. }] => {
            assert_eq!(consumer, "billing")
        }
        _ => panic!("expected a configuration error, got {refused:?}"),
    }

    // One handler on two queues: a message that reaches it through both is processed once.
    let consumer = t
        .consumer()
        .bind(first.clone(), recorder.clone())
        .bind(second.clone(), recorder)
        .start()
        .await
        .expect("one handler binds to two queues");
    for topology in [&first, &second] {
        t.broker
            .send(topology.queue(), &Msg::new("o-1", "x"), with_id("m-1"))
            .await;
    }
    t.broker
        .eventually("both copies settled", WAIT, || async {
            let stats = consumer.stats();
            stats.acked + stats.duplicates == 2
        })
        .await;
    assert_eq!(consumer.stats().duplicates, 1);
    assert_eq!(t.effects("1=1").await, 1);
    consumer.shutdown().await;
}

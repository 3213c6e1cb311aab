//! Messages the RabbitMQ adapter cannot process, dead-lettered with their reason and never
//! lost: bad input, a handler that fails for good or every time, a codec that panics, a delivery
//! count that cannot be trusted, and the operator's dead-letter routing (a routing key, an
//! exchange that routes the copy nowhere, a quorum queue's own delivery limit). The real broker
//! on 127.0.0.1:5672 and the real PostgreSQL; each test makes its own queues and tables.
//!
//! Run: `cargo test -p idem-tests --test rabbitmq rabbitmq_dead_letter::` with RabbitMQ and PostgreSQL up
//! (see README).

use std::time::Duration;

use idem_rabbitmq::{PublishOptions, Publisher, headers};
use idem_tests::rabbit::{amqp_url, setup_channel, with_id};
use idem_tests::{Fixture, Layout, Msg};

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_ends_in_the_dead_letter_queue_with_its_reason() {
    let t = Fixture::new().await;
    let consumer = t.start(t.recorder("billing").keyed_by_message_id()).await;

    // No message id, or an empty one: nothing to deduplicate on.
    t.broker
        .send_without_id(&t.queue, br#"{"id":"o-0","body":"x"}"#)
        .await;
    t.send_bytes(
        br#"{"id":"o-1","body":"x"}"#,
        PublishOptions::default().message_id(""),
    )
    .await;
    // Not JSON.
    t.send_bytes(b"{not json", with_id("m-bad-json")).await;
    // Not the content type the codec reads.
    t.send_bytes(
        b"<order/>",
        with_id("m-xml").content_type("application/xml"),
    )
    .await;
    // A reused id with different content: the first is processed, the second refused.
    t.send(&Msg::new("o-2", "charge 10"), with_id("m-2")).await;
    t.broker
        .eventually("the first m-2 processed", WAIT, || async {
            consumer.stats().acked == 1
        })
        .await;
    t.send(&Msg::new("o-2", "charge 99"), with_id("m-2")).await;

    t.broker
        .eventually("five messages dead-lettered", WAIT, || async {
            consumer.stats().dead_lettered == 5
        })
        .await;
    let mut reasons: Vec<(String, Option<String>)> = t
        .dead_letters()
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
    assert_eq!(t.depth().await, 0);
    assert_eq!(t.effects("1=1").await, 1);
    assert_eq!(t.effects("body = 'charge 99'").await, 0);
    consumer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_lettered_copy_carries_consumer_key_and_detail() {
    let t = Fixture::new().await;
    let mut handler = t.recorder("billing");
    handler.permanent = true;
    handler.fail_next(1);
    let consumer = t.start(handler).await;
    t.send(&Msg::new("o-9", "x"), with_id("m-9").correlation_id("c-9"))
        .await;
    t.broker
        .eventually("dead-lettered", WAIT, || async {
            consumer.stats().dead_lettered == 1
        })
        .await;
    let letters = t.dead_letters().await;
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert_eq!(letter.reason(), "handler-permanent-error");
    assert_eq!(letter.headers[headers::CONSUMER], "billing");
    assert_eq!(letter.headers[headers::KEY], "o-9");
    assert_eq!(letter.headers[headers::QUEUE], t.queue);
    assert!(letter.headers[headers::DETAIL].contains("failing on purpose"));
    assert_eq!(
        serde_json::from_slice::<Msg>(&letter.body).unwrap(),
        Msg::new("o-9", "x")
    );
    assert_eq!(t.effects("1=1").await, 0);
    consumer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn message_failing_every_time_ends_in_the_dead_letter_queue() {
    for quorum in [false, true] {
        let t = if quorum {
            Fixture::builder().quorum().delivery_limit(10).build().await
        } else {
            Fixture::new().await
        };
        let handler = t.recorder("billing");
        handler.fail_next(u32::MAX);
        let consumer = t.start_with(|c| c.max_deliveries(4), handler.clone()).await;
        t.send(&Msg::new("o-5", "x"), PublishOptions::default())
            .await;
        t.broker
            .eventually("dead-lettered at the limit", WAIT, || async {
                consumer.stats().dead_lettered == 1
            })
            .await;
        assert_eq!(consumer.stats().requeued, 3, "quorum: {quorum}");
        assert_eq!(handler.attempts().len(), 4);
        let letters = t.dead_letters().await;
        assert_eq!(letters.len(), 1);
        assert_eq!(letters[0].reason(), "delivery-limit");
        assert!(letters[0].headers[headers::DETAIL].contains("handler-error"));
        assert_eq!(t.depth().await, 0);
        assert_eq!(t.effects("1=1").await, 0);
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

    let t = Fixture::new().await;
    let handler = t.recorder("billing");
    handler.fail_next(1);
    let consumer = t.start_with(|c| c.max_deliveries(3), handler.clone()).await;
    let mut headers = FieldTable::default();
    headers.insert("x-delivery-count".into(), AMQPValue::LongLongInt(50));
    let properties = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_message_id("m-stale".into())
        .with_headers(headers);
    let body = serde_json::to_vec(&Msg::new("o-stale", "x")).unwrap();
    setup_channel()
        .await
        .basic_publish(
            "".into(),
            t.queue.as_str().into(),
            BasicPublishOptions::default(),
            &body,
            properties,
        )
        .await
        .unwrap()
        .await
        .unwrap();
    t.broker
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
    assert_eq!(t.broker.depth(&t.dlq).await, 0);
    assert_eq!(t.effects("message_key = 'o-stale'").await, 1);
    consumer.shutdown().await;
}

/// The consumer's dead-letter copy is routed as the broker routes dead letters: by the queue's
/// `x-dead-letter-routing-key`, which a direct dead-letter exchange needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_letter_copies_honour_the_queues_dead_letter_routing_key() {
    let t = Fixture::builder()
        .layout(Layout::DeadLetterByKey { bound: true })
        .build()
        .await;
    let consumer = t.start(t.recorder("c")).await;
    t.send_bytes(b"{not json", with_id("m-bad")).await;
    t.broker
        .eventually("dead-lettered", WAIT, || async {
            consumer.stats().dead_lettered == 1
        })
        .await;
    let letters = t.dead_letters().await;
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].reason(), "undecodable");
    assert_eq!(letters[0].message_id.as_deref(), Some("m-bad"));
    assert_eq!(consumer.stats().dead_letter_failed, 0);
    assert_eq!(t.depth().await, 0);
    consumer.shutdown().await;
}

/// A dead-letter exchange that routes the copy to no queue: the message is neither lost nor
/// requeued in a loop. It gets three quick tries, then one per pause; once the operator binds a
/// dead-letter queue, the next try lands there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unroutable_dead_letter_copy_is_retried_at_a_bounded_pace_and_never_lost() {
    let t = Fixture::builder()
        .layout(Layout::DeadLetterByKey { bound: false })
        .build()
        .await;
    let pause = Duration::from_secs(4);
    let consumer = t
        .start_with(|c| c.dead_letter_retry(3, pause), t.recorder("c"))
        .await;
    t.send_bytes(b"{not json", with_id("m-bad")).await;
    // A try is counted once its message is back on the queue: the first two after the usual
    // back-off, the third after the pause.
    t.broker
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
    t.broker.bind(&t.dlq, &t.dlx, "dead").await;
    t.broker
        .eventually("dead-lettered after the pause", WAIT, || async {
            consumer.stats().dead_lettered == 1
        })
        .await;
    let letters = t.dead_letters().await;
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].reason(), "undecodable");
    assert_eq!(consumer.stats().dead_letter_failed, 3);
    assert_eq!(t.depth().await, 0);
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
    let t = Fixture::new().await;
    let binding = t.binding(t.recorder("c")).with_codec(PanickyJson);
    let consumer = t
        .consumer()
        .max_deliveries(2)
        .bind_with(binding)
        .start()
        .await
        .unwrap();
    t.send(&"panic", with_id("m-panic")).await;
    t.send(&Msg::new("o-1", "x"), PublishOptions::default())
        .await;
    t.broker
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
    let letters = t.dead_letters().await;
    assert_eq!(letters[0].reason(), "delivery-limit");
    assert!(letters[0].headers[headers::DETAIL].contains("codec panics on purpose"));
    consumer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_letter_copy_is_persistent_and_does_not_expire() {
    let t = Fixture::new().await;
    let consumer = t.start(t.recorder("c")).await;
    let options = with_id("m-ttl").expiration(Duration::from_secs(600));
    t.send_bytes(b"{not json", options).await;
    t.broker
        .eventually("dead-lettered", WAIT, || async {
            consumer.stats().dead_lettered == 1
        })
        .await;
    let letters = t.dead_letters().await;
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].expiration, None);
    assert_eq!(letters[0].delivery_mode, Some(2));
    assert_eq!(letters[0].message_id.as_deref(), Some("m-ttl"));
    consumer.shutdown().await;
}

/// Dead-letter copies published side by side on the consumer's confirm channel, some routed by
/// the operator's direct dead-letter exchange and some routed to no queue: each copy's fate is
/// its own. A copy the exchange returned never passes for taken (its original acked, the
/// message lost), and a copy taken never passes for returned (its original dead-lettered twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_letter_copies_in_flight_together_are_each_told_their_own_fate() {
    let t = Fixture::builder()
        .layout(Layout::Orders { quorum_limit: None })
        .build()
        .await;
    let producer = Publisher::connect(amqp_url()).await.unwrap();
    const EACH: usize = 60;
    for i in 0..EACH {
        for key in ["placed", "cancelled"] {
            producer
                .publish_bytes(
                    t.exchange(),
                    key,
                    b"{not json",
                    with_id(&format!("{key}-{i}")),
                )
                .await
                .unwrap();
        }
    }
    // Room for every message at once, and a short pause between tries of a copy that has no
    // queue: the routed ones are never held up behind them.
    let consumer = t
        .start_with(
            |c| c.prefetch(500).dead_letter_retry(1, Duration::from_secs(1)),
            t.recorder("c"),
        )
        .await;
    t.broker
        .eventually("every copy tried", WAIT, || async {
            let stats = consumer.stats();
            stats.dead_lettered >= EACH as u64 && stats.dead_letter_failed >= EACH as u64
        })
        .await;
    consumer.shutdown().await;
    let mut letters: Vec<String> = t
        .dead_letters()
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
    assert_eq!(t.depth().await, EACH as u32);
    assert_eq!(t.effects("1=1").await, 0);
}

/// A message requeued uncounted on a quorum queue goes back as a fresh copy through the default
/// exchange. Dead-lettered later, it is still routed by the key it was published with (the
/// operator's direct dead-letter exchange has a queue for that key only), and its dead-letter
/// copy names the exchange and routing key it first came by, for a resubmission.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fresh_copy_is_dead_lettered_by_the_route_it_first_came_by() {
    let t = Fixture::builder()
        .layout(Layout::Orders {
            quorum_limit: Some(20),
        })
        .build()
        .await;
    // Each copy fails for good once it runs; while one runs (1.5 s), the other is requeued.
    let mut handler = t
        .recorder("mailer")
        .two_phase(Duration::from_secs(30))
        .slow(Duration::from_millis(1500))
        .keyed_by_message_id();
    handler.permanent = true;
    handler.fail_next(2);
    let consumer = t.start(handler).await;
    let producer = Publisher::connect(amqp_url()).await.unwrap();
    for _ in 0..2 {
        producer
            .publish(
                t.exchange(),
                "placed",
                &Msg::new("mail-1", "hi"),
                with_id("m-1"),
            )
            .await
            .unwrap();
    }
    t.broker
        .eventually("both copies dead-lettered", WAIT, || async {
            consumer.stats().dead_lettered == 2
        })
        .await;
    let stats = consumer.stats();
    assert!(stats.requeued > 0, "{stats:?}");
    assert_eq!(stats.dead_letter_failed, 0, "{stats:?}");
    let letters = t.dead_letters().await;
    assert_eq!(letters.len(), 2);
    for letter in &letters {
        assert_eq!(letter.reason(), "handler-permanent-error");
        let header = |name: &str| letter.headers.get(name).map(String::as_str);
        assert_eq!(header(headers::EXCHANGE), Some(t.exchange()));
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
    let t = Fixture::builder()
        .layout(Layout::Orders {
            quorum_limit: Some(1),
        })
        .delivery_limit(1)
        .build()
        .await;
    let handler = t.recorder("mailer").keyed_by_message_id();
    handler.fail_next(100);
    let consumer = t.start(handler).await;
    let producer = Publisher::connect(amqp_url()).await.unwrap();
    producer
        .publish(
            t.exchange(),
            "placed",
            &Msg::new("mail-1", "hi"),
            with_id("m-1"),
        )
        .await
        .unwrap();
    // The copy reaches the dead-letter queue before the consumer counts it: wait for both.
    t.broker
        .eventually(
            "the message dead-lettered by the consumer",
            WAIT,
            || async { t.broker.depth(&t.dlq).await == 1 && consumer.stats().dead_lettered == 1 },
        )
        .await;
    let letters = t.dead_letters().await;
    assert_eq!(
        letters[0].reason(),
        "delivery-limit",
        "{:?}",
        letters[0].headers
    );
    assert_eq!(consumer.stats().dead_lettered, 1);
    consumer.shutdown().await;
}

//! A broker restart while a message is in flight: the consumer comes back by itself, the message
//! whose ack was lost is redelivered and recognised, and new messages are processed; an outbox
//! relay publishes what was staged while the broker was down, once it is back.
//!
//! It stops and starts the RabbitMQ application (`rabbitmqctl stop_app` / `start_app`), which cuts
//! every connection: it is the only test in this binary, and cargo runs test binaries one at a time
//! (nextest runs it alone: `.config/nextest.toml`). Run: `cargo test -p idem-tests --test
//! rabbitmq_restart`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idem_rabbitmq::{PublishOptions, Relay};
use idem_runtime::OutboxMessage;
use idem_runtime::outbox::Outbox;
use idem_tests::rabbit::{amqp_url, consumer_builder, rabbitmqctl};
use idem_tests::{Fixture, Msg, TestBroker, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_survives_a_broker_restart_with_a_message_in_flight() {
    let t = Fixture::new().await;
    let queue = t.queue.as_str();
    // The broker goes away while the handler runs, before it returns: its transaction commits,
    // its ack is lost.
    let stopped = Arc::new(AtomicBool::new(false));
    let handler = t.recorder("billing").after_first_effect({
        let stopped = Arc::clone(&stopped);
        move || {
            let stopped = Arc::clone(&stopped);
            async move {
                rabbitmqctl(&["stop_app"]).await;
                stopped.store(true, Ordering::SeqCst);
            }
        }
    });
    let consumer = consumer_builder(&t.inbox, &unique("idem-restart"))
        // Shorter than the outage: the consumer replaces the connection itself rather than wait
        // for lapin's recovery, which can wait forever after a broker restart.
        .recovery_timeout(Duration::from_secs(1))
        .reconnect_delay(Duration::from_millis(500))
        .bind(t.topology.clone(), handler.clone())
        .start()
        .await
        .unwrap();
    // A relay beside it, publishing to a queue of its own through the default exchange.
    let events = t.broker.classic_queue();
    t.broker.declare(&events).await;
    let outbox = Outbox::builder(t.db.db.clone())
        .table(t.db.table("outbox"))
        .build()
        .await
        .unwrap();
    let relay = Relay::builder(amqp_url(), outbox.clone())
        .connection_name(unique("idem-restart-relay"))
        .retry_backoff(Duration::from_millis(200), Duration::from_secs(1))
        .start()
        .await
        .unwrap();

    t.send(&Msg::new("o-1", "x"), PublishOptions::default())
        .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !stopped.load(Ordering::SeqCst) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the handler stopped the broker"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Messages committed while the broker is away wait in the outbox.
    let staged: Vec<String> = (0..5).map(|i| format!("event-{i}")).collect();
    for id in &staged {
        let event = OutboxMessage::new("", events.queue(), id.clone().into_bytes()).message_id(id);
        outbox.stage(&t.db.db, event).await.unwrap();
    }
    outbox.notify_staged();
    tokio::time::sleep(Duration::from_secs(3)).await;
    rabbitmqctl(&["start_app"]).await;

    // The test's own connections died too.
    let after = TestBroker::connect().await;
    after
        .eventually(
            "the lost ack's message recognised as a duplicate",
            Duration::from_secs(90),
            || async { consumer.stats().duplicates >= 1 },
        )
        .await;
    after
        .send(queue, &Msg::new("o-2", "y"), PublishOptions::default())
        .await;
    after
        .eventually(
            "a new message processed after the restart",
            Duration::from_secs(60),
            || async { t.effects("1=1").await == 2 },
        )
        .await;
    assert_eq!(t.effects("message_key = 'o-1'").await, 1);
    assert_eq!(after.depth(queue).await, 0);
    let stats = consumer.stats();
    assert!(stats.reconnections >= 1, "{stats:?}");
    assert!(stats.settle_lost >= 1, "the first ack was lost: {stats:?}");
    consumer.shutdown().await;
    after
        .eventually(
            "the staged events published after the restart",
            Duration::from_secs(60),
            || async { after.depth(events.queue()).await >= 5 },
        )
        .await;
    let mut published: Vec<String> = after
        .drain(events.queue())
        .await
        .into_iter()
        .filter_map(|event| event.message_id)
        .collect();
    published.sort();
    published.dedup();
    assert_eq!(published, staged, "every staged event, each once");
    relay.shutdown().await;
    drop(after);
    drop(t);
}

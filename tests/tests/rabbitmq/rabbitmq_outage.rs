//! Outages under the RabbitMQ adapter: a database that goes away requeues its messages
//! uncounted, past any delivery limit, and they are processed once it is back; a broker lost for
//! long, or that stops answering, is reconnected to and leaves no connection or consumer behind.
//! The real broker on 127.0.0.1:5672 (through a proxy that cuts it off) and the real PostgreSQL;
//! each test makes its own queues and tables. (A broker restart and a broker alarm disturb every
//! other test: they have binaries of their own, `rabbitmq_restart` and `rabbitmq_alarm`.)
//!
//! Run: `cargo test -p idem-tests --test rabbitmq rabbitmq_outage::` with RabbitMQ and PostgreSQL up (see
//! README).

use std::time::Duration;

use idem_rabbitmq::{ConsumerBuilder, PublishOptions};
use idem_tests::proxy::Proxy;
use idem_tests::rabbit::{
    amqp_addr, amqp_url_through, connections_named, consumer_builder_at, consumers_on, with_id,
};
use idem_tests::{Fixture, Layout, Msg, unique};

const WAIT: Duration = Duration::from_secs(30);

/// A consumer named `name` at `url` that replaces a session lapin has not recovered within a
/// second, and forgets the replaced one a second later.
fn quick_to_replace(t: &Fixture, url: &str, name: &str) -> ConsumerBuilder {
    consumer_builder_at(url, &t.inbox, name)
        .recovery_timeout(Duration::from_secs(1))
        .retire_timeout(Duration::from_secs(1))
        .reconnect_delay(Duration::from_millis(200))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn database_unavailable_requeues_and_processes_once_it_is_back() {
    let t = Fixture::builder().database_behind_proxy().build().await;
    // An outage does not count against the message: more requeues than `max_deliveries`, or
    // than a quorum queue's delivery limit, must not dead-letter it.
    for (quorum, key) in [(false, "o-7"), (true, "o-8")] {
        let topology = if quorum {
            t.broker.quorum_queue().delivery_limit(2)
        } else {
            t.topology.clone()
        };
        let (queue, dlq) = (
            topology.queue().to_owned(),
            topology.dead_letter_queue().to_owned(),
        );
        let consumer = t
            .consumer()
            .max_deliveries(2)
            .bind(topology, t.recorder("billing"))
            .start()
            .await
            .unwrap();

        t.db_proxy().cut().await;
        t.broker
            .send(&queue, &Msg::new(key, "x"), PublishOptions::default())
            .await;
        t.broker
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
        assert_eq!(t.broker.depth(&dlq).await, 0, "quorum: {quorum}");
        assert_eq!(t.effects("1=1").await, i64::from(quorum));

        t.db_proxy().restore();
        t.broker
            .eventually("processed once the database is back", WAIT, || async {
                consumer.stats().acked == 1
            })
            .await;
        let filter = format!("message_key = '{key}'");
        assert_eq!(t.effects(&filter).await, 1);
        assert_eq!(t.broker.depth(&queue).await, 0);
        assert_eq!(t.broker.depth(&dlq).await, 0);
        consumer.shutdown().await;
    }
}

/// An operator's quorum queue (delivery limit 3) consumed as `existing`, its type not stated:
/// the consumer learns it from the broker, so that requeues that must not count (a claim held
/// elsewhere for longer than three requeues, then a database outage) go back as fresh copies,
/// which RabbitMQ before 4.3 does not count. Nothing is dead-lettered; each message has one
/// effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_existing_quorum_queue_requeues_uncounted_past_its_delivery_limit() {
    let t = Fixture::builder()
        .database_behind_proxy()
        .layout(Layout::QuorumQueue)
        .build()
        .await;
    let handler = t
        .recorder("mailer")
        .two_phase(Duration::from_secs(30))
        .slow(Duration::from_millis(1500))
        .keyed_by_message_id();
    let consumer = t.start(handler).await;

    // Two copies of m-1: one holds the claim for 1.5 s, the other is requeued meanwhile, every
    // 200 ms at most.
    for _ in 0..2 {
        t.send(&Msg::new("mail-1", "hi"), with_id("m-1")).await;
    }
    t.broker
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
    t.db_proxy().cut().await;
    t.send(&Msg::new("mail-2", "hi"), with_id("m-2")).await;
    t.broker
        .eventually("m-2 requeued while the database is down", WAIT, || async {
            consumer.stats().requeued >= claimed + 4
        })
        .await;
    t.db_proxy().restore();
    t.broker
        .eventually("m-2 processed once the database is back", WAIT, || async {
            let stats = consumer.stats();
            stats.acked + stats.dead_lettered == 2
        })
        .await;
    let stats = consumer.stats();
    assert_eq!((stats.acked, stats.dead_lettered), (2, 0), "{stats:?}");
    assert_eq!(t.broker.depth(&t.dlq).await, 0, "the broker dead-lettered");
    assert_eq!(t.depth().await, 0);
    assert_eq!(t.effects("message_key = 'm-1'").await, 1);
    assert_eq!(t.effects("message_key = 'm-2'").await, 1);
    consumer.shutdown().await;
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
    let t = Fixture::new().await;
    let queue = t.queue.as_str();
    let proxy = Proxy::start(&amqp_addr()).await;
    let url = amqp_url_through(&proxy);
    let name = unique("idem-outage");
    let consumer = quick_to_replace(&t, &url, &name)
        .prefetch(5)
        .bind(t.topology.clone(), t.recorder("billing"))
        .start()
        .await
        .unwrap();
    assert_eq!(connections_named(&name).await, 2);
    assert_eq!(consumers_on(queue).await, 1);

    proxy.cut().await;
    t.broker
        .eventually("the broker dropped the connections", WAIT, || async {
            connections_named(&name).await == 0
        })
        .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    proxy.restore();
    t.broker
        .eventually("a new session", WAIT, || async {
            consumer.stats().reconnections >= 1 && consumers_on(queue).await == 1
        })
        .await;
    // lapin retries a lost connection 1, 3, 7 and 15 s after the loss.
    never_more_than(&name, queue, 2, 1, Duration::from_secs(10)).await;
    assert_eq!(connections_named(&name).await, 2);
    for key in 0..15 {
        t.send(
            &Msg::new(format!("o-{key}"), "x"),
            PublishOptions::default(),
        )
        .await;
    }
    t.broker
        .eventually("every message processed", WAIT, || async {
            consumer.stats().acked == 15
        })
        .await;

    // Shut down during an outage: the connections lapin is recovering are not ours to leave.
    proxy.cut().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    consumer.shutdown().await;
    proxy.restore();
    never_more_than(&name, queue, 0, 0, Duration::from_secs(10)).await;
    assert_eq!(t.depth().await, 0);
    assert_eq!(t.effects("1=1").await, 15);
}

/// A connection that stops carrying frames without closing (the far end gone without a FIN, a
/// NAT entry dropped) is found by the consumer's probe and replaced within its recovery timeout,
/// not after lapin's missed heartbeats (two minutes at RabbitMQ's default of 60 s). What the
/// broker had pushed to the silent connection goes back to the queue once the broker drops it,
/// and every message is processed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_that_stops_carrying_frames_is_replaced() {
    let t = Fixture::new().await;
    let queue = t.queue.as_str();
    let proxy = Proxy::start(&amqp_addr()).await;
    let url = amqp_url_through(&proxy);
    let consumer = quick_to_replace(&t, &url, &unique("idem-frozen"))
        .prefetch(5)
        .bind(t.topology.clone(), t.recorder("billing"))
        .start()
        .await
        .unwrap();
    t.send(&Msg::new("o-first", "x"), PublishOptions::default())
        .await;
    t.broker
        .eventually("the first message processed", WAIT, || async {
            consumer.stats().acked == 1
        })
        .await;

    proxy.freeze();
    t.broker
        .eventually("a new session beside the silent one", WAIT, || async {
            consumer.stats().reconnections >= 1 && consumers_on(queue).await == 2
        })
        .await;
    for key in 0..20 {
        t.send(
            &Msg::new(format!("o-{key}"), "x"),
            PublishOptions::default(),
        )
        .await;
    }
    // The broker still counts the silent connection's consumer, and pushes it what its
    // prefetch allows: the rest goes to the new session.
    t.broker
        .eventually("the new session consumes", WAIT, || async {
            consumer.stats().acked >= 16
        })
        .await;
    // The broker drops the silent connection (here at once, by the proxy; on a real network
    // after its missed heartbeats), and its deliveries go back to the queue.
    proxy.cut().await;
    proxy.restore();
    t.broker
        .eventually("every message processed", WAIT, || async {
            t.effects("1=1").await == 21 && t.depth().await == 0
        })
        .await;
    consumer.shutdown().await;
    assert_eq!(t.effects("1=1").await, 21, "each message once");
    proxy.cut().await;
}

/// A broker that accepts connections and never answers (a host gone behind a load balancer):
/// each attempt to open a session gives up after the open timeout and the next one is made,
/// so the consumer is back once the broker answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_that_never_answers_is_given_up_on_and_retried() {
    let t = Fixture::new().await;
    let proxy = Proxy::start(&amqp_addr()).await;
    let url = amqp_url_through(&proxy);
    let consumer = quick_to_replace(&t, &url, &unique("idem-silent"))
        .open_timeout(Duration::from_secs(2))
        .bind(t.topology.clone(), t.recorder("billing"))
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
    t.send(&Msg::new("o-1", "x"), PublishOptions::default())
        .await;
    t.broker
        .eventually(
            "the message processed once the broker answers",
            WAIT,
            || async { t.effects("1=1").await == 1 },
        )
        .await;
    let stats = consumer.stats();
    assert!(stats.reconnections >= 1, "{stats:?}");
    // Sessions were opened into the silence and given up on.
    assert!(stats.failed_reconnections >= 1, "{stats:?}");
    consumer.shutdown().await;
    proxy.cut().await;
}

/// A broker whose connections are accepted and closed at once while the consumer starts (a load
/// balancer with no live node behind it, a node killed during the handshake): the broker's
/// state, tried again, so `start` succeeds once a node takes the connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_closed_during_the_handshake_at_start_are_tried_again() {
    let t = Fixture::new().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = closed.local_addr().unwrap().to_string();
    drop(closed);
    // The proxy accepts each connection, fails to reach its target, and closes it.
    let proxy = Proxy::start(&nowhere).await;
    starts_once_the_broker_answers(&t, &proxy, |proxy| proxy.point_at(&amqp_addr())).await;
}

/// A broker that does not answer while the consumer starts (as a node killed under the session
/// being opened leaves it waiting on a recovery): the attempt is given up after the open timeout
/// and made again, so `start` succeeds once the broker answers instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_silent_at_start_is_waited_for() {
    let t = Fixture::new().await;
    let proxy = Proxy::start(&amqp_addr()).await;
    proxy.silence().await;
    starts_once_the_broker_answers(&t, &proxy, Proxy::restore).await;
}

/// Starts a consumer through `proxy`, giving up on each opening after a second, while the broker
/// behind it answers only once `answer` is done to the proxy, 3 s on; then checks that the
/// consumer processes a message, and cuts the proxy.
async fn starts_once_the_broker_answers(t: &Fixture, proxy: &Proxy, answer: fn(&Proxy)) {
    let answering = {
        let proxy = proxy.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            answer(&proxy);
        })
    };
    let url = amqp_url_through(proxy);
    let consumer = consumer_builder_at(&url, &t.inbox, &unique("idem-start"))
        .open_timeout(Duration::from_secs(1))
        .reconnect_delay(Duration::from_millis(200))
        .bind(t.topology.clone(), t.recorder("billing"))
        .start()
        .await
        .expect("started once the broker answers");
    answering.await.unwrap();
    t.send(&Msg::new("o-1", "x"), PublishOptions::default())
        .await;
    t.broker
        .eventually("the message processed", WAIT, || async {
            t.effects("1=1").await == 1 && t.depth().await == 0
        })
        .await;
    consumer.shutdown().await;
    proxy.cut().await;
}

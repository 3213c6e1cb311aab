//! Connections given several broker nodes (a cluster's, as `AMQP_URL` holds them separated by
//! commas): a node that cannot be reached is passed over, a node that goes away is left for the
//! next, and when none can be reached the error names them all, passwords hidden. The nodes are
//! TCP proxies in front of the real broker on 127.0.0.1:5672, cut as a node dies; effects are
//! counted in the real PostgreSQL.
//!
//! Run: `cargo test -p idem-tests --test rabbitmq rabbitmq_nodes::` with RabbitMQ and PostgreSQL up (see
//! README).

use std::time::Duration;

use idem_rabbitmq::{AmqpUrl, PublishOptions, Publisher};
use idem_tests::proxy::Proxy;
use idem_tests::rabbit::{amqp_addr, amqp_url_through, consumer_builder_at};
use idem_tests::{Fixture, Msg, unique};

const WAIT: Duration = Duration::from_secs(30);

/// A node nobody listens on: connecting to it is refused at once.
fn dead_node() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("amqp://guest:guest@127.0.0.1:{port}/%2f")
}

async fn send_orders(t: &Fixture, keys: std::ops::Range<u32>) {
    for key in keys {
        t.send(
            &Msg::new(format!("o-{key}"), "x"),
            PublishOptions::default(),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_that_cannot_be_reached_is_passed_over() {
    let t = Fixture::new().await;
    let proxy = Proxy::start(&amqp_addr()).await;
    let nodes = format!("{},{}", dead_node(), amqp_url_through(&proxy));

    let consumer = consumer_builder_at(&nodes, &t.inbox, &unique("idem-nodes"))
        .bind(t.topology.clone(), t.recorder("billing"))
        .start()
        .await
        .expect("started on the second node");
    send_orders(&t, 0..10).await;
    t.broker
        .eventually("every order processed", WAIT, || async {
            consumer.stats().acked == 10
        })
        .await;
    assert_eq!(t.effects("1=1").await, 10);
    consumer.shutdown().await;

    // The publisher too.
    let publisher = Publisher::connect(nodes.as_str()).await.unwrap();
    publisher
        .publish(
            "",
            &t.queue,
            &Msg::new("o-p", "x"),
            PublishOptions::default(),
        )
        .await
        .expect("published through the second node");
    publisher.close().await;
    assert_eq!(t.depth().await, 1);
}

/// A node that accepts connections and never answers (a host gone behind a load balancer) is
/// given up on after the open timeout, and the next try goes to the next node, not back to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_that_accepts_and_never_answers_is_passed_over() {
    let t = Fixture::new().await;
    let (silent, answering) = (
        Proxy::start(&amqp_addr()).await,
        Proxy::start(&amqp_addr()).await,
    );
    silent.silence().await;
    let nodes = format!(
        "{},{}",
        amqp_url_through(&silent),
        amqp_url_through(&answering)
    );
    let starting = consumer_builder_at(&nodes, &t.inbox, &unique("idem-nodes"))
        .open_timeout(Duration::from_secs(1))
        .reconnect_delay(Duration::from_millis(200))
        .bind(t.topology.clone(), t.recorder("billing"))
        .start();
    let consumer = tokio::time::timeout(Duration::from_secs(20), starting)
        .await
        .expect("started on the second node without waiting out the start's patience")
        .expect("started on the second node");
    send_orders(&t, 0..5).await;
    t.broker
        .eventually("every order processed", WAIT, || async {
            consumer.stats().acked == 5
        })
        .await;
    assert_eq!(t.effects("1=1").await, 5);
    consumer.shutdown().await;
    // The abandoned opening's socket was shut down: nothing of it waits on the silent node.
    t.broker
        .eventually("no connection left on the silent node", WAIT, || async {
            silent.silent_links() == 0
        })
        .await;
    silent.cut().await;
    answering.cut().await;
}

/// A consumer whose node dies mid-run (its proxy cut for good): lapin's recovery reaches the
/// next node, and every order is charged once, none lost, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consumer_whose_node_goes_away_moves_to_the_next() {
    let t = Fixture::new().await;
    let (first, second) = (
        Proxy::start(&amqp_addr()).await,
        Proxy::start(&amqp_addr()).await,
    );
    let nodes = AmqpUrl::nodes([amqp_url_through(&first), amqp_url_through(&second)]);
    let consumer = consumer_builder_at(nodes.expose(), &t.inbox, &unique("idem-nodes"))
        .recovery_timeout(Duration::from_secs(5))
        .reconnect_delay(Duration::from_millis(200))
        .bind(t.topology.clone(), t.recorder("billing"))
        .start()
        .await
        .unwrap();
    send_orders(&t, 0..20).await;
    t.broker
        .eventually("the first orders processed", WAIT, || async {
            consumer.stats().acked == 20
        })
        .await;

    // The node dies for good.
    first.cut().await;
    send_orders(&t, 20..60).await;
    t.broker
        .eventually("every order processed on the other node", WAIT, || async {
            t.effects("1=1").await == 60 && t.depth().await == 0
        })
        .await;
    let stats = consumer.stats();
    consumer.shutdown().await;
    // Each order once, none lost.
    assert_eq!(t.effects("1=1").await, 60, "{stats:?}");
    assert!(stats.reconnections + stats.recoveries >= 1, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn when_no_node_can_be_reached_the_error_names_each_without_its_password() {
    let t = Fixture::new().await;
    let nodes = format!("{},{}", dead_node(), dead_node());
    let refused = consumer_builder_at(&nodes, &t.inbox, &unique("idem-nodes"))
        .open_timeout(Duration::from_secs(5))
        .bind(t.topology.clone(), t.recorder("billing"))
        .start()
        .await
        .expect_err("no node to reach");
    // Refused, not silent: the reason, at once rather than after the start's patience.
    assert!(
        matches!(refused, idem_rabbitmq::Error::Connect { .. }),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("refused"), "{refused}");
    let shown = format!("{refused} {refused:?}");
    assert!(!shown.contains("guest:guest"), "{shown}");
    for node in AmqpUrl::new(nodes.as_str()).node_urls() {
        let port = node.rsplit(':').next().unwrap().trim_end_matches("/%2f");
        assert!(shown.contains(port), "{port} in {shown}");
    }
}

//! The RabbitMQ adapter's publisher against the real broker on 127.0.0.1:5672: the message ids
//! it gives or keeps, a message no queue takes, and a publish the broker refuses, retried with the
//! same id. Each test makes its own queues.
//!
//! Run: `cargo test -p idem-tests --test rabbitmq rabbitmq_publisher::` with RabbitMQ up (see README).

use std::time::Duration;

use idem_rabbitmq::{PublishOptions, Publisher, QueueTopology};
use idem_tests::proxy::Proxy;
use idem_tests::rabbit::{
    amqp_addr, amqp_url, amqp_url_through, connections_named, setup_channel, with_id,
};
use idem_tests::{Backend, Fixture, Msg, TestBroker, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn publisher_ids_and_unroutable_messages() {
    let t = Fixture::builder()
        .on(Backend::Sqlite)
        .declared()
        .build()
        .await;

    let generated = t.send(&Msg::new("a", "b"), PublishOptions::default()).await;
    let parsed = uuid::Uuid::parse_str(&generated).expect("a UUID");
    assert_eq!(parsed.get_version_num(), 7);
    let chosen = t.send(&Msg::new("a", "b"), with_id("mine")).await;
    assert_eq!(chosen, "mine");
    let letters = t.broker.drain(&t.queue).await;
    let ids: Vec<_> = letters
        .iter()
        .map(|l| l.message_id.clone().unwrap())
        .collect();
    assert_eq!(ids, vec![generated, chosen]);

    let unroutable = t
        .broker
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_publish_is_retried_with_the_same_message_id() {
    use idem_rabbitmq::lapin::options::{QueueDeclareOptions, QueuePurgeOptions};
    use idem_rabbitmq::lapin::types::{AMQPValue, FieldTable};

    let broker = TestBroker::connect().await;
    let channel = setup_channel().await;
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

    let publisher = idem_rabbitmq::Publisher::builder(amqp_url().as_str())
        .max_attempts(3)
        .connect()
        .await
        .unwrap();
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

/// The publisher configures like the other builders: every setting that cannot work is named at
/// once, and the connection carries the name it is given.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_publisher_builder_names_its_connection_and_refuses_zero_settings() {
    let refused = idem_rabbitmq::Publisher::builder(amqp_url().as_str())
        .confirm_timeout(Duration::ZERO)
        .max_attempts(0)
        .connect()
        .await
        .expect_err("refused");
    assert_eq!(
        refused.settings(),
        [
            idem_rabbitmq::SettingError::Zero("the confirm timeout"),
            idem_rabbitmq::SettingError::Zero("max_attempts"),
        ],
        "{refused}"
    );

    let name = unique("idem-publisher");
    let publisher = idem_rabbitmq::Publisher::builder(amqp_url().as_str())
        .connection_name(&name)
        .connect()
        .await
        .unwrap();
    let broker = TestBroker::connect().await;
    broker
        .eventually("the named connection", Duration::from_secs(30), || async {
            connections_named(&name).await == 1
        })
        .await;
    publisher.close().await;
}

/// A declaration whose connection is cut under it, its recovery meeting a broker that accepts
/// and never answers (a node gone behind a load balancer, a killed cluster node), is given up on
/// after the publisher's timeout and made again on a new connection once the broker answers: it
/// never waits on the dead one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_declaration_on_a_connection_gone_silent_is_made_again_on_a_new_one() {
    let proxy = Proxy::start(&amqp_addr()).await;
    let publisher = Publisher::builder(amqp_url_through(&proxy).as_str())
        .confirm_timeout(Duration::from_secs(1))
        .connect()
        .await
        .expect("the publisher connects");
    let publisher = std::sync::Arc::new(publisher);
    proxy.silence().await;
    let exchange = unique("idem_silent_x");
    let declaring = tokio::spawn({
        let (publisher, exchange) = (std::sync::Arc::clone(&publisher), exchange.clone());
        async move {
            let kind = idem_rabbitmq::lapin::ExchangeKind::Topic;
            publisher.declare_exchange(&exchange, kind).await
        }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.restore();
    let declared = tokio::time::timeout(Duration::from_secs(30), declaring).await;
    assert!(matches!(declared, Ok(Ok(Ok(())))), "declared: {declared:?}");
    let broker = TestBroker::connect().await;
    broker.track_exchange(&exchange);
    let passive = idem_rabbitmq::lapin::options::ExchangeDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let channel = setup_channel().await;
    channel
        .exchange_declare(
            exchange.as_str().into(),
            idem_rabbitmq::lapin::ExchangeKind::Topic,
            passive,
            Default::default(),
        )
        .await
        .expect("the exchange exists on the broker");
    if let Ok(publisher) = std::sync::Arc::try_unwrap(publisher) {
        publisher.close().await;
    }
}

/// A publisher connecting to a broker that accepts connections and never answers (a node gone
/// behind a load balancer, a killed cluster node) is given up on after its timeout with an error
/// that says so, instead of waiting for good; once the broker answers, the next try connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connecting_to_a_silent_broker_is_given_up_on_after_the_timeout() {
    let proxy = Proxy::start(&amqp_addr()).await;
    proxy.silence().await;
    let builder = Publisher::builder(amqp_url_through(&proxy).as_str())
        .confirm_timeout(Duration::from_secs(1));
    let tried = tokio::time::timeout(Duration::from_secs(10), builder.clone().connect()).await;
    let error = tried
        .expect("connect gives up")
        .expect_err("a silent broker");
    assert!(
        matches!(error, idem_rabbitmq::Error::TimedOut { .. }),
        "{error:?}"
    );
    // The abandoned opening's socket was shut down: no thread of lapin's waits on it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while proxy.silent_links() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a connection left waiting"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxy.restore();
    let publisher = builder
        .confirm_timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("connects once the broker answers");
    publisher.close().await;
    proxy.cut().await;
}

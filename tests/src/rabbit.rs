//! The real RabbitMQ for tests: unique queues deleted afterwards, queue depths and dead-letter
//! contents, and closing a consumer's connection from the broker side.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::StreamExt;
use idem_rabbitmq::lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions,
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions, QueuePurgeOptions,
};
use idem_rabbitmq::lapin::types::{AMQPValue, FieldTable};
use idem_rabbitmq::lapin::{BasicProperties, Channel, Connection, ExchangeKind};
use idem_rabbitmq::{Consumer, ConsumerBuilder, PublishOptions, Publisher, QueueTopology};
use idem_runtime::Inbox;

use crate::db::unique;
use crate::proxy::Proxy;

/// The broker tests use: `IDEM_TEST_AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`.
pub fn amqp_url() -> String {
    std::env::var("IDEM_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// The broker's address for a proxy in front of it: `IDEM_TEST_AMQP_ADDR`, default
/// `127.0.0.1:5672`.
pub fn amqp_addr() -> String {
    std::env::var("IDEM_TEST_AMQP_ADDR").unwrap_or_else(|_| "127.0.0.1:5672".to_owned())
}

/// The broker's URL through `proxy` (started in front of [`amqp_addr`]).
pub fn amqp_url_through(proxy: &Proxy) -> String {
    format!("amqp://guest:guest@127.0.0.1:{}/%2f", proxy.port())
}

/// The broker's management API for tests: `IDEM_TEST_MANAGEMENT_URL`, default
/// `http://127.0.0.1:15672`.
pub fn management_url() -> String {
    std::env::var("IDEM_TEST_MANAGEMENT_URL")
        .unwrap_or_else(|_| "http://127.0.0.1:15672".to_owned())
}

/// Makes sure the broker's management API answers: on the local broker, its plugin is enabled
/// when it is not (a fresh machine has it off), and waited for. Fails the test when it cannot be.
pub async fn ensure_management() {
    // One enabling at a time, for the tests of a binary that run side by side.
    static ENABLING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _turn = ENABLING.lock().await;
    let address = management_url()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let answers = || tokio::net::TcpStream::connect(address.clone());
    if answers().await.is_ok() {
        return;
    }
    let enabled = tokio::process::Command::new("rabbitmq-plugins")
        .args(["enable", "--quiet", "rabbitmq_management"])
        .output()
        .await
        .unwrap_or_else(|e| panic!("rabbitmq-plugins cannot run: {e}"));
    assert!(
        enabled.status.success(),
        "enabling the management plugin failed: {enabled:?}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while answers().await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the management API at {address} did not come up"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The arguments the local broker holds for `queue` (`x-queue-type`, `x-delivery-limit`...),
/// as `rabbitmqctl` lists them.
pub async fn queue_arguments(queue: &str) -> BTreeMap<String, serde_json::Value> {
    let listed = rabbitmqctl(&["list_queues", "name", "arguments", "--formatter", "json"]).await;
    let queues: Vec<serde_json::Value> = serde_json::from_str(&listed).expect("JSON queues");
    let found = (queues.iter())
        .find(|q| q["name"] == queue)
        .unwrap_or_else(|| panic!("no queue {queue}"));
    (found["arguments"].as_array().into_iter().flatten())
        .filter_map(|argument| {
            let name = argument[0].as_str()?.to_owned();
            Some((name, argument[2].clone()))
        })
        .collect()
}

/// Publish options with the message id `id`.
pub fn with_id(id: &str) -> PublishOptions {
    PublishOptions::default().message_id(id)
}

/// A channel on a connection of its own, for what [`TestBroker`] has no method for.
pub async fn setup_channel() -> Channel {
    let connection = idem_rabbitmq::amqp::connect(&amqp_url().into(), "idem-test setup")
        .await
        .expect("the broker is reachable");
    connection.create_channel().await.expect("a channel")
}

/// A consumer of `inbox` for a test: its connections named `name` (which
/// [`close_connections`] finds), short retry back-offs and a 10 s shutdown deadline.
pub fn consumer_builder(inbox: &Inbox, name: &str) -> ConsumerBuilder {
    consumer_builder_at(&amqp_url(), inbox, name)
}

/// Like [`consumer_builder`], for the broker at `url` (a proxy in front of it, say).
pub fn consumer_builder_at(url: &str, inbox: &Inbox, name: &str) -> ConsumerBuilder {
    Consumer::builder(url, inbox.clone())
        .connection_name(name)
        .retry_backoff(Duration::from_millis(20), Duration::from_millis(200))
        .shutdown_timeout(Duration::from_secs(10))
}

/// Runs `rabbitmqctl -q <args>` on the local broker; returns what it printed. Fails the test if
/// it fails.
pub async fn rabbitmqctl(args: &[&str]) -> String {
    let output = tokio::process::Command::new("rabbitmqctl")
        .arg("-q")
        .args(args)
        .output()
        .await
        .expect("rabbitmqctl runs");
    assert!(output.status.success(), "rabbitmqctl {args:?} failed");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A dead-lettered message as read back from the dead-letter queue.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// Its text headers (`x-idem-reason`, ...).
    pub headers: BTreeMap<String, String>,
    /// Its payload.
    pub body: Vec<u8>,
    /// Its message id.
    pub message_id: Option<String>,
    /// Its per-message time-to-live, if any.
    pub expiration: Option<String>,
    /// 2 when persistent.
    pub delivery_mode: Option<u8>,
    /// Its content type.
    pub content_type: Option<String>,
}

impl DeadLetter {
    /// The `x-idem-reason` header.
    pub fn reason(&self) -> &str {
        self.headers
            .get(idem_rabbitmq::headers::REASON)
            .map(String::as_str)
            .unwrap_or_default()
    }
}

/// Queues an operator declared before any consumer ran, consumed as
/// [`QueueTopology::existing`]; deleted with the [`TestBroker`] that declared them.
#[derive(Debug, Clone)]
pub struct OperatorQueue {
    /// The work queue.
    pub queue: String,
    /// Its dead-letter exchange.
    pub dlx: String,
    /// The queue its dead letters go to.
    pub dlq: String,
    /// The exchange that routes to the work queue, in layouts that have one.
    pub exchange: Option<String>,
}

impl OperatorQueue {
    fn named(prefix: &str) -> Self {
        Self {
            queue: unique(prefix),
            dlx: unique(&format!("{prefix}_dlx")),
            dlq: unique(&format!("{prefix}_dlq")),
            exchange: None,
        }
    }

    /// The work queue as a consumer binds it: existing, with its dead-letter exchange.
    pub fn topology(&self) -> QueueTopology {
        QueueTopology::existing(&self.queue, &self.dlx)
    }
}

/// A test's view of the broker: a connection to inspect queues, a publisher, and the queues and
/// exchanges it made, deleted when it is dropped.
pub struct TestBroker {
    url: String,
    connection: Connection,
    channel: Channel,
    /// A publisher with confirms.
    pub publisher: Publisher,
    queues: Mutex<Vec<String>>,
    exchanges: Mutex<Vec<String>>,
}

impl std::fmt::Debug for TestBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestBroker").finish_non_exhaustive()
    }
}

impl TestBroker {
    /// Connects. A broker that does not answer fails the test.
    pub async fn connect() -> Self {
        Self::connect_to(&amqp_url()).await
    }

    /// Connects to the broker at `url` (a cluster's nodes, comma-separated).
    pub async fn connect_to(url: &str) -> Self {
        crate::watchdog::start();
        let url = url.to_owned();
        let fail = |error: &dyn std::fmt::Display| -> ! {
            panic!(
                "RabbitMQ is not reachable at {}: {error}. The tests need the real broker: start it \
                 (see README) or point IDEM_TEST_AMQP_URL at one.",
                idem_rabbitmq::AmqpUrl::new(url.clone())
            )
        };
        let connection = idem_rabbitmq::amqp::connect(&url.as_str().into(), "idem-test broker")
            .await
            .unwrap_or_else(|e| fail(&e));
        let channel = connection.create_channel().await.unwrap();
        let publisher = Publisher::connect(url.as_str())
            .await
            .unwrap_or_else(|e| fail(&e));
        Self {
            url,
            connection,
            channel,
            publisher,
            queues: Mutex::new(Vec::new()),
            exchanges: Mutex::new(Vec::new()),
        }
    }

    /// A fresh classic work queue with its dead-letter exchange and queue, deleted afterwards.
    pub fn classic_queue(&self) -> QueueTopology {
        self.track(QueueTopology::classic(unique("idem_q")))
    }

    /// A fresh quorum work queue, deleted afterwards.
    pub fn quorum_queue(&self) -> QueueTopology {
        self.track(QueueTopology::quorum(unique("idem_qq")))
    }

    /// Records a topology's queues and exchanges for deletion.
    pub fn track(&self, topology: QueueTopology) -> QueueTopology {
        let mut queues = self.queues.lock().unwrap();
        queues.push(topology.queue().to_owned());
        queues.push(topology.dead_letter_queue().to_owned());
        self.exchanges
            .lock()
            .unwrap()
            .push(topology.dead_letter_exchange().to_owned());
        topology
    }

    /// Records an exchange for deletion.
    pub fn track_exchange(&self, name: &str) {
        self.exchanges.lock().unwrap().push(name.to_owned());
    }

    /// Publishes `body` as JSON to `queue` through the default exchange.
    pub async fn send<T: serde::Serialize>(
        &self,
        queue: &str,
        body: &T,
        options: PublishOptions,
    ) -> String {
        self.publisher
            .publish("", queue, body, options)
            .await
            .expect("publish")
    }

    /// Publishes raw bytes to `queue`.
    pub async fn send_bytes(&self, queue: &str, body: &[u8], options: PublishOptions) -> String {
        self.publisher
            .publish_bytes("", queue, body, options)
            .await
            .expect("publish")
    }

    /// Publishes JSON `body` to `queue` with no properties but its content type: no message id,
    /// as a producer that does not set one sends it.
    pub async fn send_without_id(&self, queue: &str, body: &[u8]) {
        let properties = BasicProperties::default().with_content_type("application/json".into());
        self.channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                body,
                properties,
            )
            .await
            .expect("publish")
            .await
            .expect("publish");
    }

    /// Declares `topology` (not recorded for deletion: see [`TestBroker::track`]).
    pub async fn declare(&self, topology: &QueueTopology) {
        topology.declare(&self.channel).await.expect("declare");
    }

    /// Declares, as an operator would, a durable `queue` with text `arguments`
    /// (`x-dead-letter-exchange`, `x-queue-type`...), deleted afterwards.
    pub async fn declare_queue(&self, queue: &str, arguments: &[(&str, &str)]) {
        self.declare_queue_with(queue, arguments, None).await;
    }

    /// Like [`TestBroker::declare_queue`], a quorum queue with `x-delivery-limit`.
    pub async fn declare_quorum_queue(&self, queue: &str, arguments: &[(&str, &str)], limit: i64) {
        let mut with_type = arguments.to_vec();
        with_type.push(("x-queue-type", "quorum"));
        self.declare_queue_with(queue, &with_type, Some(limit))
            .await;
    }

    async fn declare_queue_with(
        &self,
        queue: &str,
        arguments: &[(&str, &str)],
        limit: Option<i64>,
    ) {
        let mut table = FieldTable::default();
        for (name, value) in arguments {
            table.insert((*name).into(), AMQPValue::LongString((*value).into()));
        }
        if let Some(limit) = limit {
            table.insert("x-delivery-limit".into(), AMQPValue::LongLongInt(limit));
        }
        let options = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        self.queues.lock().unwrap().push(queue.to_owned());
        self.channel
            .queue_declare(queue.into(), options, table)
            .await
            .unwrap_or_else(|e| panic!("declare {queue}: {e}"));
    }

    /// Declares a durable `exchange` of `kind`, deleted afterwards.
    pub async fn declare_exchange(&self, exchange: &str, kind: ExchangeKind) {
        let options = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        self.track_exchange(exchange);
        self.channel
            .exchange_declare(exchange.into(), kind, options, FieldTable::default())
            .await
            .unwrap_or_else(|e| panic!("declare {exchange}: {e}"));
    }

    /// Binds `queue` to `exchange` with `routing_key`.
    pub async fn bind(&self, queue: &str, exchange: &str, routing_key: &str) {
        self.channel
            .queue_bind(
                queue.into(),
                exchange.into(),
                routing_key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("bind {queue} to {exchange}: {e}"));
    }

    /// Removes every ready message from `queue`.
    pub async fn purge(&self, queue: &str) {
        self.channel
            .queue_purge(queue.into(), QueuePurgeOptions::default())
            .await
            .unwrap_or_else(|e| panic!("purge {queue}: {e}"));
    }

    /// How many messages are ready in `queue` (not counting unacknowledged ones).
    pub async fn depth(&self, queue: &str) -> u32 {
        let options = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        self.channel
            .queue_declare(queue.into(), options, FieldTable::default())
            .await
            .unwrap_or_else(|e| panic!("queue {queue}: {e}"))
            .message_count()
    }

    /// Takes every message out of `queue` (a dead-letter queue, usually).
    pub async fn drain(&self, queue: &str) -> Vec<DeadLetter> {
        let mut messages = Vec::new();
        while let Some(message) = self
            .channel
            .basic_get(queue.into(), BasicGetOptions::default())
            .await
            .unwrap()
        {
            let metadata = idem_rabbitmq::amqp::metadata_of(&message.delivery.properties, false);
            let properties = &message.delivery.properties;
            messages.push(DeadLetter {
                headers: metadata.headers,
                body: message.delivery.data.clone(),
                message_id: metadata.message_id,
                expiration: properties.expiration().as_ref().map(|e| e.to_string()),
                delivery_mode: *properties.delivery_mode(),
                content_type: properties.content_type().as_ref().map(|c| c.to_string()),
            });
            message
                .delivery
                .acker
                .ack(BasicAckOptions::default())
                .await
                .unwrap();
        }
        messages
    }

    /// Takes every message out of `queue` through a consumer without acknowledgements (the
    /// broker lets each go as it delivers it), until the queue is empty and none arrived for
    /// `quiet`: a large queue in seconds, where [`TestBroker::drain`] asks for one message at a
    /// time. Returns each message's id and body, in the order they arrived.
    pub async fn consume_all(
        &self,
        queue: &str,
        quiet: Duration,
    ) -> Vec<(Option<String>, Vec<u8>)> {
        let channel = self.connection.create_channel().await.unwrap();
        let options = BasicConsumeOptions {
            no_ack: true,
            ..BasicConsumeOptions::default()
        };
        let mut consumer = channel
            .basic_consume(queue.into(), "".into(), options, FieldTable::default())
            .await
            .unwrap_or_else(|e| panic!("consume {queue}: {e}"));
        let mut messages = Vec::new();
        loop {
            match tokio::time::timeout(quiet, consumer.next()).await {
                Ok(Some(delivery)) => {
                    let delivery = delivery.unwrap_or_else(|e| panic!("consume {queue}: {e}"));
                    let id = delivery.properties.message_id().as_ref();
                    messages.push((id.map(ToString::to_string), delivery.data));
                }
                Ok(None) => panic!("the consumer of {queue} was cancelled"),
                Err(_quiet) if self.depth(queue).await == 0 => break,
                Err(_quiet) => {}
            }
        }
        let _ = channel.close(200, "done".into()).await;
        messages
    }

    /// An operator's layout: a direct dead-letter exchange, its queue bound with the key `dead`
    /// only if `bound`, and a work queue that dead-letters with that key.
    pub async fn dead_letter_by_key(&self, bound: bool) -> OperatorQueue {
        let layout = OperatorQueue::named("idem_ops");
        self.declare_exchange(&layout.dlx, ExchangeKind::Direct)
            .await;
        self.declare_queue(&layout.dlq, &[]).await;
        if bound {
            self.bind(&layout.dlq, &layout.dlx, "dead").await;
        }
        let arguments = [
            ("x-dead-letter-exchange", layout.dlx.as_str()),
            ("x-dead-letter-routing-key", "dead"),
        ];
        self.declare_queue(&layout.queue, &arguments).await;
        layout
    }

    /// An operator's quorum queue with a delivery limit of 3 and a fanout dead-letter exchange
    /// bound to a dead-letter queue.
    pub async fn operator_quorum_queue(&self) -> OperatorQueue {
        let layout = OperatorQueue::named("idem_ops_qq");
        self.declare_exchange(&layout.dlx, ExchangeKind::Fanout)
            .await;
        self.declare_queue(&layout.dlq, &[]).await;
        self.bind(&layout.dlq, &layout.dlx, "").await;
        self.declare_quorum_queue(
            &layout.queue,
            &[("x-dead-letter-exchange", layout.dlx.as_str())],
            3,
        )
        .await;
        layout
    }

    /// An operator's layout: a direct exchange of orders routing `placed` and `cancelled` to a
    /// work queue (quorum with the broker's delivery limit `quorum_limit`, if given), whose
    /// direct dead-letter exchange keeps the routing key and has a queue for `placed` only.
    pub async fn orders_layout(&self, quorum_limit: Option<i64>) -> OperatorQueue {
        let mut layout = OperatorQueue::named("idem_ops_routed");
        let orders = unique("idem_ops_orders");
        self.declare_exchange(&orders, ExchangeKind::Direct).await;
        self.declare_exchange(&layout.dlx, ExchangeKind::Direct)
            .await;
        self.declare_queue(&layout.dlq, &[]).await;
        self.bind(&layout.dlq, &layout.dlx, "placed").await;
        let arguments = [("x-dead-letter-exchange", layout.dlx.as_str())];
        if let Some(limit) = quorum_limit {
            self.declare_quorum_queue(&layout.queue, &arguments, limit)
                .await;
        } else {
            self.declare_queue(&layout.queue, &arguments).await;
        }
        for key in ["placed", "cancelled"] {
            self.bind(&layout.queue, &orders, key).await;
        }
        layout.exchange = Some(orders);
        layout
    }

    /// Waits until `condition` holds, polling; fails the test after `timeout`.
    pub async fn eventually<F, Fut>(&self, what: &str, timeout: Duration, mut condition: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        while !condition().await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        let queues = std::mem::take(&mut *self.queues.lock().unwrap());
        let exchanges = std::mem::take(&mut *self.exchanges.lock().unwrap());
        let url = self.url.clone();
        crate::clean_up(async move {
            let Ok(connection) =
                idem_rabbitmq::amqp::connect(&url.as_str().into(), "idem-test cleanup").await
            else {
                return;
            };
            let Ok(channel) = connection.create_channel().await else {
                return;
            };
            for queue in queues {
                let _ = channel
                    .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                    .await;
            }
            for exchange in exchanges {
                let _ = channel
                    .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
                    .await;
            }
            let _ = idem_rabbitmq::amqp::close_within(&connection, "done", Duration::from_secs(5))
                .await;
        });
    }
}

/// How many connections the broker has whose client-provided name contains `name`.
pub async fn connections_named(name: &str) -> usize {
    rabbitmqctl(&["list_connections", "client_properties"])
        .await
        .lines()
        .filter(|line| line.contains(name))
        .count()
}

/// How many consumers the broker has on `queue`.
pub async fn consumers_on(queue: &str) -> usize {
    rabbitmqctl(&["list_consumers", "queue_name"])
        .await
        .lines()
        .filter(|line| line.trim() == queue)
        .count()
}

/// Closes, from the broker side, every connection whose client-provided name contains `name`
/// (`rabbitmqctl close_connection`), as a broker restart or a network cut would. Returns how
/// many were closed.
pub async fn close_connections(name: &str) -> usize {
    let listing = rabbitmqctl(&["list_connections", "pid", "client_properties"]).await;
    let pids: Vec<&str> = listing
        .lines()
        .filter(|line| line.contains(name))
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    for pid in &pids {
        rabbitmqctl(&["close_connection", pid, "closed by test"]).await;
    }
    pids.len()
}

//! Where a test through the broker starts: a database with an inbox and an effects table, the
//! broker with a fresh work queue, and the steps such a test takes on them (a recording handler,
//! a consumer on the queue, a message sent to it, what was dead-lettered).
//!
//! ```ignore
//! let t = Fixture::new().await; // PostgreSQL, a fresh classic queue
//! let consumer = t.start(t.recorder("billing")).await;
//! t.send(&Msg::new("o-1", "x"), PublishOptions::default()).await;
//! t.broker.eventually("processed", WAIT, || async { consumer.stats().acked == 1 }).await;
//! assert_eq!(t.effects("1=1").await, 1);
//! ```
//!
//! [`Fixture::builder`] covers the variations: another backend, an inbox configured or reached
//! through a proxy that cuts it off, a quorum queue or an operator's layout, a queue declared
//! before any consumer starts (to publish first), an outbox the inbox stages into and an
//! exchange routing to the queue.

use std::time::Duration;

use idem_rabbitmq::lapin::ExchangeKind;
use idem_rabbitmq::{Binding, Consumer, ConsumerBuilder, PublishOptions, QueueTopology};
use idem_runtime::outbox::Outbox;
use idem_runtime::{Handler, Inbox, InboxBuilder};
use sea_orm::{ConnectOptions, Database};
use serde::de::DeserializeOwned;

use crate::proxy::Proxy;
use crate::rabbit::{DeadLetter, OperatorQueue, consumer_builder};
use crate::{Backend, Recorder, TestBroker, TestDb, unique};

/// A broker test's database, inbox, effects table and work queue. Everything it made is
/// deleted when it is dropped (see [`TestDb`] and [`TestBroker`]).
#[derive(Debug)]
pub struct Fixture {
    /// The broker, with a publisher.
    pub broker: TestBroker,
    /// The database.
    pub db: TestDb,
    /// The inbox, on a fresh table.
    pub inbox: Inbox,
    /// A fresh effects table for [`Recorder`]s and scripts.
    pub effects: String,
    /// The work queue as consumers bind it.
    pub topology: QueueTopology,
    /// The work queue.
    pub queue: String,
    /// Its dead-letter exchange.
    pub dlx: String,
    /// Its dead-letter queue.
    pub dlq: String,
    exchange: Option<String>,
    outbox: Option<Outbox>,
    db_proxy: Option<Proxy>,
}

/// The work queue a [`Fixture`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    /// A fresh classic queue with its dead-letter exchange and queue, which the consumer
    /// declares.
    Classic,
    /// A fresh quorum queue, likewise.
    Quorum,
    /// An operator's layout, declared by the fixture and consumed as `existing`.
    Layout(Layout),
}

/// The queues an operator declared before any consumer ran (see [`TestBroker`]'s layouts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// [`TestBroker::dead_letter_by_key`]: a direct dead-letter exchange that routes by the
    /// key `dead`, its queue bound only if `bound`; consumed with that routing key.
    DeadLetterByKey {
        /// Whether the dead-letter queue is bound.
        bound: bool,
    },
    /// [`TestBroker::operator_quorum_queue`]: a quorum queue with a delivery limit of 3.
    QuorumQueue,
    /// [`TestBroker::orders_layout`]: an exchange of orders routing two keys to the queue, whose
    /// dead-letter queue takes one; a quorum queue with that delivery limit, if given.
    Orders {
        /// The broker's delivery limit of a quorum queue; a classic queue without one.
        quorum_limit: Option<i64>,
    },
}

/// Builds a [`Fixture`]. Each setting's default is what most broker tests need.
#[must_use]
pub struct FixtureBuilder {
    backend: Backend,
    pool: u32,
    queue: Queue,
    delivery_limit: Option<u32>,
    declared: bool,
    routed: Option<&'static str>,
    outbox: bool,
    behind_proxy: bool,
    configure: Box<dyn FnOnce(InboxBuilder) -> InboxBuilder>,
}

impl std::fmt::Debug for FixtureBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FixtureBuilder")
            .field("backend", &self.backend)
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

impl Fixture {
    /// PostgreSQL and a fresh classic queue: where most broker tests start.
    pub async fn new() -> Self {
        Self::builder().build().await
    }

    /// A fixture other than [`Fixture::new`]'s.
    pub fn builder() -> FixtureBuilder {
        FixtureBuilder {
            // A broker test tests the adapter, whatever the backend: one server is enough.
            backend: Backend::Postgres,
            // `TestDb::connect`'s pool.
            pool: 16,
            queue: Queue::Classic,
            delivery_limit: None,
            // The consumer declares its topology when it starts.
            declared: false,
            routed: None,
            outbox: false,
            behind_proxy: false,
            configure: Box::new(|inbox| inbox),
        }
    }

    /// A transactional [`Recorder`] of `consumer` writing into the effects table.
    pub fn recorder(&self, consumer: &str) -> Recorder {
        Recorder::new(&self.db, &self.effects, consumer)
    }

    /// A consumer of the inbox for a test ([`consumer_builder`]), under a fresh connection name.
    pub fn consumer(&self) -> ConsumerBuilder {
        consumer_builder(&self.inbox, &unique("idem-test"))
    }

    /// A binding of `handler` to the work queue.
    pub fn binding<H>(&self, handler: H) -> Binding<H>
    where
        H: Handler,
    {
        Binding::new(self.topology.clone(), handler)
    }

    /// Starts a consumer binding `handler` to the work queue.
    pub async fn start<H>(&self, handler: H) -> Consumer
    where
        H: Handler + 'static,
        H::Message: DeserializeOwned,
    {
        self.start_with(|consumer| consumer, handler).await
    }

    /// Starts a consumer binding `handler` to another queue than the fixture's.
    pub async fn start_on<H>(&self, topology: QueueTopology, handler: H) -> Consumer
    where
        H: Handler + 'static,
        H::Message: DeserializeOwned,
    {
        self.consumer()
            .bind(topology, handler)
            .start()
            .await
            .expect("consumer starts")
    }

    /// Starts a consumer, configured by `configure`, binding `handler` to the work queue.
    pub async fn start_with<H>(
        &self,
        configure: impl FnOnce(ConsumerBuilder) -> ConsumerBuilder,
        handler: H,
    ) -> Consumer
    where
        H: Handler + 'static,
        H::Message: DeserializeOwned,
    {
        configure(self.consumer())
            .bind(self.topology.clone(), handler)
            .start()
            .await
            .expect("consumer starts")
    }

    /// Publishes `body` as JSON to the work queue; returns its message id.
    pub async fn send<T: serde::Serialize>(&self, body: &T, options: PublishOptions) -> String {
        self.broker.send(&self.queue, body, options).await
    }

    /// Publishes raw bytes to the work queue; returns its message id.
    pub async fn send_bytes(&self, body: &[u8], options: PublishOptions) -> String {
        self.broker.send_bytes(&self.queue, body, options).await
    }

    /// How many messages are ready in the work queue.
    pub async fn depth(&self) -> u32 {
        self.broker.depth(&self.queue).await
    }

    /// Counts the effects matching `filter` (a SQL condition, `1=1` for all).
    pub async fn effects(&self, filter: &str) -> i64 {
        self.db.count(&self.effects, filter).await
    }

    /// Takes every message out of the dead-letter queue.
    pub async fn dead_letters(&self) -> Vec<DeadLetter> {
        self.broker.drain(&self.dlq).await
    }

    /// Takes every message out of the dead-letter queue; returns their reasons, sorted.
    pub async fn dead_letter_reasons(&self) -> Vec<String> {
        let mut reasons: Vec<String> = self
            .dead_letters()
            .await
            .iter()
            .map(|letter| letter.reason().to_owned())
            .collect();
        reasons.sort();
        reasons
    }

    /// The proxy between the inbox and its database.
    ///
    /// # Panics
    /// Unless built with [`FixtureBuilder::database_behind_proxy`].
    pub fn db_proxy(&self) -> &Proxy {
        self.db_proxy
            .as_ref()
            .expect("a fixture built with database_behind_proxy")
    }

    /// The exchange that routes to the work queue.
    ///
    /// # Panics
    /// Unless built with [`FixtureBuilder::routed`] or [`Layout::Orders`].
    pub fn exchange(&self) -> &str {
        self.exchange
            .as_deref()
            .expect("a fixture with an exchange routing to its queue")
    }

    /// The outbox the inbox stages into.
    ///
    /// # Panics
    /// Unless built with [`FixtureBuilder::outbox`].
    pub fn outbox(&self) -> &Outbox {
        self.outbox.as_ref().expect("a fixture built with outbox")
    }
}

impl FixtureBuilder {
    /// The database's backend.
    pub fn on(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// A pool of `max_connections` for the database.
    pub fn pool(mut self, max_connections: u32) -> Self {
        self.pool = max_connections;
        self
    }

    /// The inbox configured by `configure` (retention, claim wait...).
    pub fn inbox(mut self, configure: impl FnOnce(InboxBuilder) -> InboxBuilder + 'static) -> Self {
        self.configure = Box::new(configure);
        self
    }

    /// The inbox reaches its database (PostgreSQL) through a proxy that a test cuts
    /// ([`Fixture::db_proxy`]): four connections, each given up on after 2 s. The fixture's
    /// own `db`, which counts effects, stays connected directly.
    pub fn database_behind_proxy(mut self) -> Self {
        self.behind_proxy = true;
        self
    }

    /// A fresh quorum queue rather than a classic one.
    pub fn quorum(mut self) -> Self {
        self.queue = Queue::Quorum;
        self
    }

    /// An operator's layout, consumed as `existing`, rather than a queue the consumer declares.
    pub fn layout(mut self, layout: Layout) -> Self {
        self.queue = Queue::Layout(layout);
        self
    }

    /// The work queue's delivery limit, as its topology states it.
    pub fn delivery_limit(mut self, limit: u32) -> Self {
        self.delivery_limit = Some(limit);
        self
    }

    /// The work queue declared at once, so that messages can be sent before a consumer starts.
    pub fn declared(mut self) -> Self {
        self.declared = true;
        self
    }

    /// A fresh direct exchange routing `routing_key` to the work queue ([`Fixture::exchange`]);
    /// the queue is declared.
    pub fn routed(mut self, routing_key: &'static str) -> Self {
        self.routed = Some(routing_key);
        self.declared()
    }

    /// An outbox on a fresh table, which the inbox stages into ([`Fixture::outbox`]).
    pub fn outbox(mut self) -> Self {
        self.outbox = true;
        self
    }

    /// Connects and makes what was asked for.
    pub async fn build(self) -> Fixture {
        let db = TestDb::connect_with_pool(self.backend, self.pool).await;
        let outbox = if self.outbox {
            let outbox = Outbox::builder(db.db.clone())
                .table(db.table("outbox"))
                .build()
                .await
                .expect("outbox builds");
            Some(outbox)
        } else {
            None
        };
        let (pool, db_proxy) = if self.behind_proxy {
            let (pool, proxy) = proxied_pool(&db).await;
            (pool, Some(proxy))
        } else {
            (db.db.clone(), None)
        };
        let mut inbox = Inbox::builder(pool).table(db.table("inbox"));
        if let Some(outbox) = &outbox {
            inbox = inbox.outbox(outbox.clone());
        }
        let inbox = (self.configure)(inbox).build().await.expect("inbox builds");
        let effects = db.effects_table().await;
        let broker = TestBroker::connect().await;
        let (mut topology, operator) = match self.queue {
            Queue::Classic => (broker.classic_queue(), None),
            Queue::Quorum => (broker.quorum_queue(), None),
            Queue::Layout(layout) => {
                let (topology, operator) = layout.declare(&broker).await;
                (topology, Some(operator))
            }
        };
        if let Some(limit) = self.delivery_limit {
            topology = topology.delivery_limit(limit);
        }
        if self.declared {
            broker.declare(&topology).await;
        }
        let mut exchange = operator.as_ref().and_then(|layout| layout.exchange.clone());
        if let Some(routing_key) = self.routed {
            let name = unique("idem_x");
            broker.declare_exchange(&name, ExchangeKind::Direct).await;
            broker.bind(topology.queue(), &name, routing_key).await;
            exchange = Some(name);
        }
        let dlq = operator.map_or_else(
            || topology.dead_letter_queue().to_owned(),
            |layout| layout.dlq,
        );
        Fixture {
            queue: topology.queue().to_owned(),
            dlx: topology.dead_letter_exchange().to_owned(),
            dlq,
            topology,
            broker,
            db,
            inbox,
            effects,
            exchange,
            outbox,
            db_proxy,
        }
    }
}

impl Layout {
    async fn declare(self, broker: &TestBroker) -> (QueueTopology, OperatorQueue) {
        match self {
            Layout::DeadLetterByKey { bound } => {
                let layout = broker.dead_letter_by_key(bound).await;
                (layout.topology().dead_letter_routing_key("dead"), layout)
            }
            Layout::QuorumQueue => {
                let layout = broker.operator_quorum_queue().await;
                (layout.topology(), layout)
            }
            Layout::Orders { quorum_limit } => {
                let layout = broker.orders_layout(quorum_limit).await;
                (layout.topology(), layout)
            }
        }
    }
}

/// A pool on the PostgreSQL database of `db` reached through a proxy that a test cuts.
async fn proxied_pool(db: &TestDb) -> (sea_orm::DatabaseConnection, Proxy) {
    assert_eq!(
        db.backend,
        Backend::Postgres,
        "a proxied inbox is PostgreSQL"
    );
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
    let pool = Database::connect(options)
        .await
        .expect("the database through the proxy");
    (pool, proxy)
}

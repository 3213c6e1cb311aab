//! Chaos: several billing processes consume one quorum queue into one inbox while the test
//! SIGKILLs and restarts them at random and closes their broker connections from the broker's
//! side (`rabbitmqctl close_connection`), and a producer sends every order two or three times
//! (retries with the same message id) along with a few bad messages. Then, by SQL and on the
//! queues: every order is charged exactly once, with its own amount; the queue is empty; the
//! dead-letter queue holds the bad messages and nothing else, each with its `x-idem-reason`; every
//! invoice went out through the processes' outbox relays and each order was notified, through a
//! two-phase handler calling a provider stub, with exactly the key derived from it. A
//! summary line per run gives the kills, closes, duplicates and effects. On PostgreSQL and on
//! MariaDB, one after the other (and on MariaDB with `--keys entity`, the invoice itself the
//! mark of a charged order); and on the three-node RabbitMQ cluster of
//! `tests/cluster/rabbitmq-cluster` (started when it is down), per message and in batches, where
//! nodes are SIGKILLed and restarted too.
//!
//! Each run has an exchange, a queue and a database of its own (a PostgreSQL schema, a MariaDB
//! database), so it runs beside the demo test and other users of the broker, whose connections
//! it never closes. Run, with RabbitMQ (and `rabbitmqctl` on the PATH), PostgreSQL and MariaDB
//! up:
//!
//! ```sh
//! cargo test -p idem-examples --test chaos -- --nocapture
//! ```
//!
//! The default size suits CI. A larger run:
//!
//! ```sh
//! IDEM_CHAOS_ORDERS=20000 IDEM_CHAOS_KILLS=50 IDEM_CHAOS_CLOSES=20 IDEM_CHAOS_RATE=1000 \
//!     cargo test -p idem-examples --test chaos -- --nocapture
//! ```
//!
//! | variable | default | what |
//! |---|---|---|
//! | `IDEM_CHAOS_CONSUMERS` | 3 | billing processes |
//! | `IDEM_CHAOS_ORDERS` | 300 | distinct valid orders |
//! | `IDEM_CHAOS_KILLS` | 3 | SIGKILLs, each followed by a restart |
//! | `IDEM_CHAOS_CLOSES` | 3 | times one process's connections are closed by the broker |
//! | `IDEM_CHAOS_NODE_KILLS` | 2 | on the cluster: SIGKILLs of a node, each followed by its restart |
//! | `IDEM_CHAOS_RATE` | 500 | messages published per second |
//! | `IDEM_CHAOS_SEED` | the clock | the seed of every random choice (printed) |
//!
//! The kills and closes are spread over the work: the `k`-th of `n` comes once `k / (n + 1)` of
//! the orders are charged. Duplicates come from each process's `billing stats` lines (logged
//! every 20 ms): a killed process's last 20 ms are not counted, so duplicates and redeliveries
//! are lower bounds. A bad message may reach the dead-letter queue twice (its copy is confirmed
//! before the original is acknowledged, and a kill or close can fall in between): the test
//! accepts that and counts such copies.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime};

use common::{Billing, Stats};
use futures_util::StreamExt;
use idem_examples::orders::{self, OrderPlaced, ROUTING_KEY};
use idem_examples::stub::Stub;
use idem_rabbitmq::PublishOptions;
use idem_tests::cluster::{self, Cluster, NODES};
use idem_tests::{Backend, TestBroker, rabbit, unique};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection};

/// One backend at a time: the runs share two cores with the broker and the databases.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_on_postgres_charges_each_order_once() {
    let _serial = SERIAL.lock().await;
    chaos(Backend::Postgres, Taking::OneAtATime, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_on_mariadb_charges_each_order_once() {
    let _serial = SERIAL.lock().await;
    chaos(Backend::MySql, Taking::OneAtATime, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_in_batches_on_postgres_charges_each_order_once() {
    let _serial = SERIAL.lock().await;
    chaos(Backend::Postgres, Taking::Batches(20), None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_in_batches_on_mariadb_charges_each_order_once() {
    let _serial = SERIAL.lock().await;
    chaos(Backend::MySql, Taking::Batches(20), None).await;
}

/// Entity mode: the invoice, keyed by its order, is the only mark of a charged order, on the
/// database whose deadlocks roll a whole transaction back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_by_entity_on_mariadb_charges_each_order_once() {
    let _serial = SERIAL.lock().await;
    chaos(Backend::MySql, Taking::ByEntity, None).await;
}

/// Batches checked after each handler rather than once before their commit, on the database
/// whose deadlocks roll a whole transaction back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_in_batches_checked_after_each_handler_on_mariadb_charges_each_order_once() {
    let _serial = SERIAL.lock().await;
    chaos(Backend::MySql, Taking::CheckedBatches(20), None).await;
}

/// Slice handlers: each batch's fresh orders charged in one call, a failing slice halved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_in_slices_on_postgres_charges_each_order_once() {
    let _serial = SERIAL.lock().await;
    chaos(Backend::Postgres, Taking::Slices(20), None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_in_slices_on_mariadb_charges_each_order_once() {
    let _serial = SERIAL.lock().await;
    chaos(Backend::MySql, Taking::Slices(20), None).await;
}

/// On the three-node cluster of `tests/cluster/rabbitmq-cluster`, its nodes SIGKILLed and
/// restarted besides the processes killed and connections closed; each process connected first
/// to another node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_on_a_cluster_charges_each_order_once() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::take().await;
    chaos(Backend::Postgres, Taking::OneAtATime, Some(&cluster)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_in_batches_on_a_cluster_charges_each_order_once() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::take().await;
    chaos(Backend::Postgres, Taking::Batches(20), Some(&cluster)).await;
}

/// How big a run is.
#[derive(Debug, Clone, Copy)]
struct Size {
    consumers: usize,
    orders: usize,
    kills: usize,
    closes: usize,
    /// On a cluster: SIGKILLs of a node, each followed by its restart.
    node_kills: usize,
    rate: f64,
    seed: u64,
}

impl Size {
    fn from_env() -> Self {
        fn var<T: std::str::FromStr>(name: &str, default: T) -> T {
            match std::env::var(name) {
                Err(_) => default,
                Ok(value) => value
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}={value:?} is not a valid number")),
            }
        }
        let clock = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let size = Self {
            consumers: var("IDEM_CHAOS_CONSUMERS", 3),
            orders: var("IDEM_CHAOS_ORDERS", 300),
            kills: var("IDEM_CHAOS_KILLS", 3),
            closes: var("IDEM_CHAOS_CLOSES", 3),
            node_kills: var("IDEM_CHAOS_NODE_KILLS", 2),
            rate: var("IDEM_CHAOS_RATE", 500.0),
            seed: var("IDEM_CHAOS_SEED", clock | 1),
        };
        assert!(size.consumers > 0 && size.orders > 0 && size.rate > 0.0);
        size
    }
}

/// xorshift64*: reproducible from the printed seed, and enough for picking victims.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
    }
}

/// One message the producer sends.
#[derive(Debug, Clone, Copy)]
enum Send {
    /// Order `i`, as first sent or as a producer retry.
    Order(usize),
    /// An order with an invalid amount: the handler refuses it for good.
    InvalidAmount,
    /// A payload that is not an order at all.
    Undecodable,
}

/// What the producer sends: the orders, each two or three times with its retries arriving
/// shortly after, and two bad messages among them. The third bad message, an order id reused
/// with other content, goes last (see [`publish`]).
#[derive(Debug)]
struct Plan {
    run: String,
    orders: Vec<OrderPlaced>,
    sends: Vec<Send>,
    retries: usize,
}

impl Plan {
    fn new(size: &Size, rng: &mut Rng) -> Self {
        let run = unique("o");
        let orders: Vec<_> = (0..size.orders)
            .map(|i| OrderPlaced {
                order_id: format!("{run}-{i:06}"),
                customer: format!("customer-{}", i % 13),
                amount_cents: 100 + i as i64,
            })
            .collect();
        let mut timeline = Vec::new();
        let mut retries = 0;
        for i in 0..size.orders {
            timeline.push((i * 4, Send::Order(i)));
            for _ in 0..1 + rng.below(2) {
                timeline.push(((i + 1 + rng.below(40)) * 4 + 1, Send::Order(i)));
                retries += 1;
            }
        }
        timeline.push((size.orders / 3 * 4 + 2, Send::InvalidAmount));
        timeline.push((size.orders * 2 / 3 * 4 + 2, Send::Undecodable));
        timeline.sort_by_key(|(at, _)| *at);
        Self {
            run,
            orders,
            sends: timeline.into_iter().map(|(_, send)| send).collect(),
            retries,
        }
    }

    fn invalid_amount_id(&self) -> String {
        format!("{}-invalid-amount", self.run)
    }

    fn undecodable_id(&self) -> String {
        format!("{}-undecodable", self.run)
    }

    /// The dead letters the run must end with: `(message id, x-idem-reason)`.
    fn expected_dead_letters(&self) -> BTreeSet<(String, String)> {
        BTreeSet::from([
            (
                self.orders[0].order_id.clone(),
                "fingerprint-mismatch".to_owned(),
            ),
            (
                self.invalid_amount_id(),
                "handler-permanent-error".to_owned(),
            ),
            (self.undecodable_id(), "undecodable".to_owned()),
        ])
    }

    fn messages(&self) -> usize {
        self.sends.len() + 1
    }

    /// How long sending takes at `rate` messages a second.
    fn span(&self, rate: f64) -> Duration {
        Duration::from_secs_f64(self.sends.len() as f64 / rate)
    }
}

/// A database of the run's own on `backend`: a PostgreSQL schema (through the URL's
/// `search_path`) or a MariaDB database, dropped afterwards.
#[derive(Debug)]
struct Place {
    backend: Backend,
    server_url: String,
    name: String,
    /// The URL the billing processes and the checks use.
    url: String,
}

impl Place {
    async fn create(backend: Backend) -> Self {
        let server_url = backend.url("");
        let name = unique("chaos");
        let (create, url) = match backend {
            Backend::Postgres => {
                let separator = if server_url.contains('?') { '&' } else { '?' };
                (
                    format!("CREATE SCHEMA {name}"),
                    format!("{server_url}{separator}options=-c%20search_path%3D{name}"),
                )
            }
            Backend::MySql => {
                let authority = server_url.find("://").expect("a URL") + 3;
                let path = authority + server_url[authority..].find('/').expect("a database");
                let query = server_url[path..]
                    .find('?')
                    .map_or("", |q| &server_url[path + q..]);
                (
                    format!("CREATE DATABASE {name}"),
                    format!("{}/{name}{query}", &server_url[..path]),
                )
            }
            Backend::Sqlite => unreachable!("one SQLite file has one writer, not a fleet"),
        };
        let server = Database::connect(&server_url)
            .await
            .unwrap_or_else(|e| panic!("{backend:?} is not reachable at {server_url}: {e}"));
        server.execute_unprepared(&create).await.unwrap();
        server.close().await.unwrap();
        Self {
            backend,
            server_url,
            name,
            url,
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let drop = match self.backend {
            Backend::Postgres => format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name),
            _ => format!("DROP DATABASE IF EXISTS {}", self.name),
        };
        let url = self.server_url.clone();
        idem_tests::clean_up(async move {
            if let Ok(server) = Database::connect(&url).await {
                let _ = server.execute_unprepared(&drop).await;
                let _ = server.close().await;
            }
        });
    }
}

/// The billing processes: one per slot, each with the connection name of its slot and
/// generation, restarted in its slot after a kill.
#[derive(Debug)]
struct Fleet {
    env: Vec<(&'static str, String)>,
    name: String,
    /// On the cluster: each slot's process connects first to another node.
    on_cluster: bool,
    slots: Vec<(usize, Billing)>,
    /// The counters of processes that ended.
    ended: Stats,
    kills: usize,
    closes: usize,
    node_kills: usize,
    connections_closed: usize,
}

impl Fleet {
    fn start(
        size: &Size,
        env: Vec<(&'static str, String)>,
        name: String,
        on_cluster: bool,
    ) -> Self {
        let mut fleet = Self {
            env,
            name,
            on_cluster,
            slots: Vec::new(),
            ended: Stats::default(),
            kills: 0,
            closes: 0,
            node_kills: 0,
            connections_closed: 0,
        };
        for slot in 0..size.consumers {
            let billing = fleet.spawn(slot, 0);
            fleet.slots.push((0, billing));
        }
        fleet
    }

    /// The connection name of `slot` in its `generation`: fixed width, so that `<name>-s07g`
    /// matches the connections of slot 7 and no other.
    fn connection_name(&self, slot: usize, generation: usize) -> String {
        format!("{}-s{slot:02}g{generation:04}", self.name)
    }

    fn spawn(&self, slot: usize, generation: usize) -> Billing {
        let name = self.connection_name(slot, generation);
        let mut env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        env.push(("BILLING_CONNECTION_NAME", &name));
        let nodes = Cluster::urls_from(slot as u8 % 3 + 1);
        if self.on_cluster {
            env.push(("AMQP_URL", &nodes));
        }
        Billing::spawn(&env)
    }

    async fn wait_consuming(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.slots.iter().all(|(_, billing)| billing.is_consuming()) {
            for (_, billing) in &self.slots {
                assert!(
                    billing.is_consuming() || !billing.has_ended(),
                    "billing exited before consuming:\n{}",
                    billing.tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the billing processes did not start"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A slot, preferably one whose process consumes.
    fn victim(&self, rng: &mut Rng) -> usize {
        let consuming: Vec<_> = (0..self.slots.len())
            .filter(|&slot| self.slots[slot].1.is_consuming())
            .collect();
        match consuming.len() {
            0 => rng.below(self.slots.len()),
            n => consuming[rng.below(n)],
        }
    }

    /// SIGKILLs the process of `slot` and starts its successor.
    fn kill(&mut self, slot: usize) {
        let generation = self.slots[slot].0 + 1;
        let successor = self.spawn(slot, generation);
        let (_, victim) = std::mem::replace(&mut self.slots[slot], (generation, successor));
        self.ended = self.ended + victim.kill();
        self.kills += 1;
    }

    /// Closes the connections of the process in `slot` from the broker's side, in the
    /// background (`rabbitmqctl` takes a second or two, in which a kill may replace the
    /// process: its successor's connections are closed then); returns how many it closed.
    fn close(&mut self, slot: usize) -> tokio::task::JoinHandle<usize> {
        let name = format!("{}-s{slot:02}g", self.name);
        self.closes += 1;
        let on_cluster = self.on_cluster;
        tokio::spawn(async move {
            if on_cluster {
                cluster::close_connections(&name).await
            } else {
                rabbit::close_connections(&name).await
            }
        })
    }

    /// The counters of every process, ended or running.
    fn stats(&self) -> Stats {
        self.slots
            .iter()
            .fold(self.ended, |sum, (_, billing)| sum + billing.stats())
    }

    /// Stops every process with SIGTERM; each must exit cleanly.
    fn terminate(&mut self) -> Stats {
        for (_, billing) in self.slots.drain(..) {
            self.ended = self.ended + billing.terminate();
        }
        self.ended
    }
}

/// Sends the plan to `exchange` at `rate` messages a second, a few confirms outstanding at a
/// time; then, once the first order is charged, an order that reuses its id with another
/// amount (sent any earlier, it could be charged in place of the original, which a real
/// producer's reuse would do too: the test wants to know which one is refused).
async fn publish(
    broker: &TestBroker,
    exchange: &str,
    plan: &Plan,
    rate: f64,
    db: &DatabaseConnection,
) {
    let start = tokio::time::Instant::now();
    futures_util::stream::iter(plan.sends.iter().enumerate())
        .map(|(k, send)| async move {
            tokio::time::sleep_until(start + Duration::from_secs_f64(k as f64 / rate)).await;
            // Retried with its id until confirmed, as a producer does through a node's death
            // (the publisher's own attempts can all fall within lapin's recovery).
            let deadline = Instant::now() + Duration::from_secs(60);
            while let Err(error) = send_once(broker, exchange, plan, send).await {
                assert!(
                    Instant::now() < deadline,
                    "published and confirmed: {error}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .buffer_unordered(16)
        .for_each(|_| async {})
        .await;

    let first = &plan.orders[0].order_id;
    let deadline = Instant::now() + Duration::from_secs(60);
    while common::invoices(db, first).await.0 == 0 {
        assert!(Instant::now() < deadline, "order {first} was never charged");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reused = OrderPlaced {
        amount_cents: 999_999,
        customer: "someone-else".to_owned(),
        ..plan.orders[0].clone()
    };
    while let Err(error) = orders::publish_to(&broker.publisher, exchange, &reused).await {
        assert!(
            Instant::now() < deadline,
            "published and confirmed: {error}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Publishes `send` once, with the publisher's own attempts.
async fn send_once(
    broker: &TestBroker,
    exchange: &str,
    plan: &Plan,
    send: &Send,
) -> Result<String, idem_rabbitmq::Error> {
    let publisher = &broker.publisher;
    match *send {
        Send::Order(i) => orders::publish_to(publisher, exchange, &plan.orders[i]).await,
        Send::InvalidAmount => {
            let order = OrderPlaced {
                order_id: plan.invalid_amount_id(),
                customer: "customer-0".to_owned(),
                amount_cents: 0,
            };
            orders::publish_to(publisher, exchange, &order).await
        }
        Send::Undecodable => {
            let options = PublishOptions::default().message_id(plan.undecodable_id());
            publisher
                .publish_bytes(exchange, ROUTING_KEY, b"{\"order_id\": 12", options)
                .await
        }
    }
}

/// Kills and closes, in a random order, at random consumers, spread over the work: the `k`-th
/// of `n` events comes once `k / (n + 1)` of the orders are charged, so that each lands while
/// the consumers are busy, however fast the machine. A close does not hold up the events after
/// it.
async fn wreak(
    fleet: &mut Fleet,
    size: &Size,
    rng: &mut Rng,
    db: &DatabaseConnection,
    plan: &Plan,
    cluster: Option<&Cluster>,
) {
    let node_kills = if cluster.is_some() {
        size.node_kills
    } else {
        0
    };
    let mut events: Vec<Event> = std::iter::repeat_n(Event::Kill, size.kills)
        .chain(std::iter::repeat_n(Event::Close, size.closes))
        .chain(std::iter::repeat_n(Event::NodeKill, node_kills))
        .collect();
    for i in (1..events.len()).rev() {
        events.swap(i, rng.below(i + 1));
    }
    let prefix = format!("{}-", plan.run);
    let steps = events.len() + 1;
    let deadline = Instant::now() + Duration::from_secs(120) + plan.span(size.rate);
    let mut closing = Vec::new();
    let mut restarting: Option<tokio::task::JoinHandle<()>> = None;
    for (k, event) in events.into_iter().enumerate() {
        let due = (k + 1) * size.orders / steps;
        while (common::invoices(db, &prefix).await.1 as usize) < due {
            assert!(Instant::now() < deadline, "fewer than {due} orders charged");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let slot = fleet.victim(rng);
        match (event, cluster) {
            (Event::Kill, _) => fleet.kill(slot),
            (Event::Close, _) => closing.push(fleet.close(slot)),
            (Event::NodeKill, Some(cluster)) => {
                // One node down at a time keeps the queues' majority: the last one killed is
                // back before the next dies.
                if let Some(restart) = restarting.take() {
                    restart.await.expect("the killed node restarted");
                }
                let node = rng.below(NODES.len()) as u8 + 1;
                cluster.kill(node).await;
                fleet.node_kills += 1;
                restarting = Some(tokio::spawn(cluster::start_stopped()));
            }
            (Event::NodeKill, None) => unreachable!("node kills only on the cluster"),
        }
    }
    for close in closing {
        fleet.connections_closed += close.await.expect("rabbitmqctl closes connections");
    }
    if let Some(restart) = restarting {
        restart.await.expect("the killed node restarted");
    }
}

/// What the chaos does next.
#[derive(Debug, Clone, Copy)]
enum Event {
    /// SIGKILL a billing process and start its successor.
    Kill,
    /// Close a process's connections from the broker.
    Close,
    /// SIGKILL a node of the cluster and restart it.
    NodeKill,
}

/// How the billing processes of a run take their deliveries.
#[derive(Debug, Clone, Copy)]
enum Taking {
    OneAtATime,
    /// Batches of up to that many, checked once before their commit (the default).
    Batches(usize),
    /// Batches of up to that many, each handler checked.
    CheckedBatches(usize),
    /// Batches of up to that many, their fresh orders charged by the slice handler.
    Slices(usize),
    /// One at a time, each invoice the marker of its order (entity mode, no inbox record).
    ByEntity,
}

/// One run, the billing processes taking their deliveries as `taking` says, on the local broker
/// or on `cluster`.
async fn chaos(backend: Backend, taking: Taking, cluster: Option<&Cluster>) {
    let size = Size::from_env();
    let mut rng = Rng(size.seed);
    let begun = Instant::now();
    let place = Place::create(backend).await;
    let db = Database::connect(&place.url).await.unwrap();
    let amqp_url = cluster.map_or_else(rabbit::amqp_url, |_| Cluster::urls_from(1));
    let broker = TestBroker::connect_to(&amqp_url).await;
    let name = unique("chaos");
    let exchange = format!("{name}.orders");
    let topology = broker.track(idem_examples::billing::topology_on(
        &format!("{name}.billing"),
        &exchange,
    ));
    broker.track_exchange(&exchange);
    broker.declare(&topology).await;
    // The notifications hop: billing's events exchange, the queue bound to it, and the provider.
    let events = format!("{name}.events");
    let notifications = broker.track(idem_examples::notifications::topology_on(&format!(
        "{name}.notifications"
    )));
    broker.track_exchange(&events);
    let url = idem_rabbitmq::AmqpUrl::new(amqp_url.clone());
    idem_examples::notifications::declare(&url, notifications.queue(), &events)
        .await
        .unwrap();
    let provider = Stub::start("127.0.0.1:0").await.unwrap();

    let mut env = vec![
        ("AMQP_URL", amqp_url),
        ("DATABASE_URL", place.url.clone()),
        ("ORDERS_EXCHANGE", exchange.clone()),
        ("BILLING_QUEUE", topology.queue().to_owned()),
        ("BILLING_STATS_EVERY_MS", "20".to_owned()),
        ("BILLING_EVENTS_EXCHANGE", events.clone()),
        ("NOTIFICATIONS_QUEUE", notifications.queue().to_owned()),
        ("NOTIFICATIONS_PROVIDER_URL", provider.notify_url()),
        // A notification whose process was killed in its call is taken over once its lease
        // runs out: 3 s rather than the handler's 30 s, so that the run does not wait on it.
        ("NOTIFICATIONS_LEASE_MS", "3000".to_owned()),
    ];
    match taking {
        Taking::OneAtATime => {}
        Taking::ByEntity => env.push(("BILLING_KEYS", "entity".to_owned())),
        Taking::Batches(size) => env.push(("BILLING_BATCH", size.to_string())),
        Taking::CheckedBatches(size) => {
            env.push(("BILLING_BATCH", size.to_string()));
            env.push(("BILLING_CHECK_EACH_HANDLER", "true".to_owned()));
        }
        Taking::Slices(size) => {
            env.push(("BILLING_BATCH", size.to_string()));
            env.push(("BILLING_SLICES", "true".to_owned()));
        }
    }
    let mut fleet = Fleet::start(&size, env, name, cluster.is_some());
    // Once they consume, the processes have created the invoices table the checks read.
    fleet.wait_consuming(Duration::from_secs(60)).await;
    let plan = Plan::new(&size, &mut rng);
    tokio::join!(
        publish(&broker, &exchange, &plan, size.rate, &db),
        wreak(&mut fleet, &size, &mut rng, &db, &plan, cluster),
    );

    // Settled: every order charged, nothing ready on the queue, the dead letters in, and no
    // process settling anything for a second.
    let deadline = Instant::now() + Duration::from_secs(120) + plan.span(size.rate);
    let mut quiet_since = (Instant::now(), fleet.stats().settled());
    loop {
        let (_, charged) = common::invoices(&db, &format!("{}-", plan.run)).await;
        let settled = fleet.stats().settled();
        if settled != quiet_since.1 {
            quiet_since = (Instant::now(), settled);
        }
        if charged as usize >= size.orders
            && provider.stats().distinct_keys as usize >= size.orders
            && broker.depth(notifications.queue()).await == 0
            && broker.depth(topology.queue()).await == 0
            && broker.depth(topology.dead_letter_queue()).await >= 3
            && quiet_since.0.elapsed() > Duration::from_secs(1)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not settled: {charged} of {} orders charged, {} notified, {} messages ready",
            size.orders,
            provider.stats().distinct_keys,
            broker.depth(topology.queue()).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stats = fleet.terminate();
    let left = broker.depth(topology.queue()).await;
    let letters = common::drain_dead_letters(&broker, topology.dead_letter_queue()).await;
    let amounts = common::invoiced_amounts(&db, &format!("{}-", plan.run)).await;

    let charged_twice: Vec<_> = amounts.iter().filter(|(_, a)| a.len() > 1).collect();
    let invoices: usize = amounts.values().map(Vec::len).sum();
    let distinct_letters: BTreeSet<_> = letters.iter().cloned().collect();
    let duplicates_beyond_retries = stats.duplicates.saturating_sub(plan.retries as u64);
    println!(
        "chaos on {backend:?}: {} consumers, {} orders as {} messages ({} producer retries, 3 bad) \
         in {:.1} s; {} kills, {} closes ({} connections), {} node kills; {invoices} invoices \
         for {} orders \
         ({} charged twice); duplicates skipped >= {} ({} producer retries, >= {} redeliveries \
         after a commit), settlements lost {}, recoveries {}, reconnections {}, requeued {}; \
         {} dead letters ({} distinct); {left} left on the queue; seed {}",
        size.consumers,
        size.orders,
        plan.messages(),
        plan.retries,
        begun.elapsed().as_secs_f64(),
        fleet.kills,
        fleet.closes,
        fleet.connections_closed,
        fleet.node_kills,
        amounts.len(),
        charged_twice.len(),
        stats.duplicates,
        plan.retries,
        duplicates_beyond_retries,
        stats.settle_lost,
        stats.recoveries,
        stats.reconnections,
        stats.requeued,
        letters.len(),
        distinct_letters.len(),
        size.seed,
    );

    assert!(
        charged_twice.is_empty(),
        "{} orders charged more than once, such as {:?}",
        charged_twice.len(),
        &charged_twice[..charged_twice.len().min(5)]
    );
    let wrong: Vec<_> = plan
        .orders
        .iter()
        .filter(|order| amounts.get(&order.order_id) != Some(&vec![order.amount_cents]))
        .map(|order| (&order.order_id, amounts.get(&order.order_id)))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} orders not charged once with their amount, such as {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
    assert_eq!(
        invoices, size.orders,
        "invoices for orders that were not placed"
    );
    assert_eq!(left, 0, "messages left on the queue");
    // Every order notified, each with the key derived from it, whatever was killed meanwhile:
    // the provider saw exactly these keys (a repeated call carries a key it already has).
    let expected_keys: BTreeSet<String> = plan
        .orders
        .iter()
        .map(|order| {
            let origin = idem_runtime::admin::InboxKey {
                consumer: idem_runtime::admin::ConsumerName::new("notifications.invoice").unwrap(),
                message_key: idem_runtime::MessageKey::new(order.order_id.as_str()).unwrap(),
            };
            idem_runtime::outbox::derived_id(&origin, 0)
        })
        .collect();
    let keys: BTreeSet<String> = provider.keys().into_iter().collect();
    let calls = provider.stats().calls;
    println!(
        "chaos on {backend:?}: {} notifications, {calls} provider calls ({} repeated after a \
         kill or close)",
        keys.len(),
        calls - keys.len() as u64
    );
    // Events still in flight when the processes were stopped are copies of notified ones (a
    // relay killed between publish and mark republishes): the keys above say so.
    assert_eq!(
        keys, expected_keys,
        "each order notified with its own derived key"
    );
    assert_eq!(
        distinct_letters,
        plan.expected_dead_letters(),
        "the dead-letter queue must hold exactly the bad messages"
    );
    drop(place);
}

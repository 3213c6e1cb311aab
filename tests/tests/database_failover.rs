//! idem through a database failover, on PostgreSQL (a primary and a synchronous standby,
//! `tests/cluster/postgres-pair`) and on MariaDB (a primary and a semi-synchronous replica,
//! `tests/cluster/mariadb-pair`), each pair started fresh by each test, the consumer reaching the
//! database through the tests' TCP proxy as through a virtual address. Under load the primary
//! crashes, the address moves to the standby while it is still read-only, then the standby is
//! promoted. Per message and in batches: the read-only and unreachable periods never count
//! against a message (a delivery limit of 2 would dead-letter it), nothing acknowledged lacks
//! its effect on the new primary, each order is charged once, and the consumer recovers without
//! a restart.
//!
//! Run: `cargo test -p idem-tests --test database_failover` with RabbitMQ up and PostgreSQL and
//! MariaDB installed. `IDEM_FAILOVER_ORDERS` (default 1 000) sets the orders of each run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use idem_rabbitmq::{Binding, PublishOptions};
use idem_tests::cluster::run_script;
use idem_tests::proxy::Proxy;
use idem_tests::rabbit::consumer_builder;
use idem_tests::{Backend, Msg, Recorder, TestBroker, TestDb, unique};
use tokio::sync::Mutex;

/// How long every order may take to be charged once the new primary takes writes.
const SETTLE: Duration = Duration::from_secs(120);
/// How long the address points at the standby before it is promoted.
const READ_ONLY: Duration = Duration::from_secs(2);

/// One test at a time runs a failover.
static PAIR: Mutex<()> = Mutex::const_new(());

/// A primary and its standby, started by a script of `tests/cluster`.
#[derive(Debug, Clone, Copy)]
struct Pair {
    script: &'static str,
    backend: Backend,
    primary: u16,
    standby: u16,
}

const POSTGRES: Pair = Pair {
    script: "postgres-pair",
    backend: Backend::Postgres,
    primary: 5441,
    standby: 5442,
};

const MARIADB: Pair = Pair {
    script: "mariadb-pair",
    backend: Backend::MySql,
    primary: 3341,
    standby: 3342,
};

impl Pair {
    async fn run(&self, command: &str) {
        run_script(self.script, command).await;
    }

    /// The URL of the database through `port`.
    fn url(&self, port: u16) -> String {
        match self.backend {
            Backend::MySql => format!("mysql://idem@127.0.0.1:{port}/test"),
            _ => format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgres_failover_per_message_charges_each_order_once_counting_nothing() {
    fail_over(POSTGRES, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgres_failover_in_batches_charges_each_order_once_counting_nothing() {
    fail_over(POSTGRES, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mariadb_failover_per_message_charges_each_order_once_counting_nothing() {
    fail_over(MARIADB, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mariadb_failover_in_batches_charges_each_order_once_counting_nothing() {
    fail_over(MARIADB, true).await;
}

async fn fail_over(pair: Pair, batches: bool) {
    let _pair = PAIR.lock().await;
    pair.run("start").await;
    let orders: u32 = std::env::var("IDEM_FAILOVER_ORDERS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(1_000);
    let address = Proxy::start(&format!("127.0.0.1:{}", pair.primary)).await;
    let db = TestDb::connect_url(pair.backend, pair.url(address.port()), 8).await;
    let inbox = idem_runtime::Inbox::builder(db.db.clone())
        .table(db.table("inbox"))
        .build()
        .await
        .expect("the inbox builds on the primary");
    let effects = db.effects_table().await;
    let broker = Arc::new(TestBroker::connect().await);
    let topology = broker.classic_queue();
    let (queue, dlq) = (
        topology.queue().to_owned(),
        topology.dead_letter_queue().to_owned(),
    );
    let mut binding = Binding::new(topology, Recorder::new(&db, &effects, "billing"));
    if batches {
        binding = binding.batch(20, Duration::from_millis(20));
    }
    let consumer = consumer_builder(&inbox, &unique("idem-failover"))
        .prefetch(50)
        .max_deliveries(2)
        .bind_with(binding)
        .start()
        .await
        .expect("the consumer starts");

    // A producer at a steady pace, through the whole failover.
    let (published, stop) = (
        Arc::new(AtomicU32::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let producer = {
        let (broker, queue) = (Arc::clone(&broker), queue.clone());
        let (published, stop) = (Arc::clone(&published), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut index = 0;
            while index < orders || !stop.load(Ordering::SeqCst) {
                let key = format!("o-{index:06}");
                let options = PublishOptions::default().message_id(&key);
                broker.send(&queue, &Msg::new(&key, "x"), options).await;
                index += 1;
                published.store(index, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            index
        })
    };
    let charged = |filter: String| {
        let (db, effects) = (&db, &effects);
        async move { db.count(effects, &filter).await }
    };
    let deadline = Instant::now() + SETTLE;
    while charged("1=1".into()).await < i64::from(orders / 3) {
        assert!(
            Instant::now() < deadline,
            "a third charged before the failover"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let crashed = Instant::now();
    pair.run("crash").await;
    address.point_at(&format!("127.0.0.1:{}", pair.standby));
    tokio::time::sleep(READ_ONLY).await;
    pair.run("promote").await;
    let first_after = published.load(Ordering::SeqCst);
    while charged(format!("message_key >= 'o-{first_after:06}'")).await == 0 {
        assert!(
            Instant::now() < deadline,
            "an order charged on the new primary"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "failover ({:?}, {}): first order charged on the new primary {} ms after the crash",
        pair.backend,
        if batches { "batches" } else { "per message" },
        crashed.elapsed().as_millis()
    );
    stop.store(true, Ordering::SeqCst);
    let orders = producer.await.expect("every order published");
    let deadline = Instant::now() + SETTLE;
    while charged("1=1".into()).await < i64::from(orders) {
        let stats = consumer.stats();
        assert!(Instant::now() < deadline, "every order charged: {stats:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    while broker.depth(&queue).await > 0 {
        assert!(Instant::now() < deadline, "the queue drained");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stats = consumer.stats();
    consumer.shutdown().await;
    // Everything acknowledged has its effect on the new primary, once.
    let keys = format!("(SELECT DISTINCT message_key FROM {effects}) AS charged_keys");
    assert_eq!(charged("1=1".into()).await, i64::from(orders), "{stats:?}");
    assert_eq!(db.count(&keys, "1=1").await, i64::from(orders), "{stats:?}");
    // Nothing was counted against its delivery limit: nothing dead-lettered.
    assert_eq!(stats.dead_lettered, 0, "{stats:?}");
    assert_eq!(broker.depth(&dlq).await, 0);
    assert!(stats.requeued > 0, "the failover was seen: {stats:?}");
    drop(db);
    pair.run("stop").await;
}

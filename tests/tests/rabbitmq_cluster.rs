//! idem on a three-node RabbitMQ cluster (`tests/cluster/rabbitmq-cluster`, started by the
//! tests when it is down): a quorum queue with a replica on each node, three consumers each
//! connected first to another node, and a producer publishing with confirms and retries, while
//! nodes die. Every order is charged exactly once (effects counted in the real PostgreSQL) and
//! none is left on the queue.
//!
//! Each test prints the time from its disruption to the first order processed among those
//! published after it (`cluster recovery`), the figures the README gives.
//!
//! Run: `cargo test -p idem-tests --test rabbitmq_cluster` with PostgreSQL up and RabbitMQ
//! installed. `IDEM_CLUSTER_ORDERS` (default 1 500) sets the orders of each run,
//! `IDEM_CLUSTER_ROUNDS` (default 1) how many times the leader's node is killed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use idem_rabbitmq::lapin::options::{BasicGetOptions, QueueDeleteOptions};
use idem_rabbitmq::{Consumer, Publisher, QueueTopology, Relay};
use idem_runtime::outbox::Outbox;
use idem_runtime::{Inbox, OutboxMessage};
use idem_tests::cluster::{Cluster, NODES};
use idem_tests::rabbit::{consumer_builder_at, with_id};
use idem_tests::{Backend, Msg, Recorder, TestDb, inbox_and_effects, unique};
use tokio::task::JoinHandle;

/// How long every order may take to be charged once the disruption is over.
const SETTLE: Duration = Duration::from_secs(120);

fn from_env(name: &str, default: u32) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// A run of orders through the cluster: three consumers and a producer.
struct Run {
    db: TestDb,
    effects: String,
    queue: String,
    consumers: Vec<Consumer>,
    /// The index of the next order the producer publishes.
    next: Arc<AtomicU32>,
    /// Tells the producer to stop once it has published its orders.
    stop: Arc<AtomicBool>,
    producer: JoinHandle<u32>,
}

impl Run {
    /// Starts three consumers of a fresh quorum queue, consumer `n` connected first to node
    /// `n`, and a producer publishing at a steady pace until the run finishes, `orders` at least.
    async fn start(orders: u32) -> Self {
        // What the consumers warn about goes with the test's output.
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
            .with_test_writer()
            .try_init();
        let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
        let topology = QueueTopology::quorum(unique("idem_cq"));
        let queue = topology.queue().to_owned();
        let mut consumers = Vec::new();
        for node in NODES {
            consumers.push(consumer(&inbox, &topology, &db, &effects, node).await);
        }
        let next = Arc::new(AtomicU32::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let producer = tokio::spawn(produce(
            queue.clone(),
            orders,
            Arc::clone(&next),
            Arc::clone(&stop),
        ));
        Self {
            db,
            effects,
            queue,
            consumers,
            next,
            stop,
            producer,
        }
    }

    /// Waits until `count` orders are charged.
    async fn charged(&self, count: u32) {
        let deadline = Instant::now() + SETTLE;
        while self.effects("1=1").await < i64::from(count) {
            assert!(Instant::now() < deadline, "{count} orders charged in time");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How many orders each consumer has acknowledged.
    fn acked(&self) -> Vec<u64> {
        self.consumers.iter().map(|c| c.stats().acked).collect()
    }

    async fn effects(&self, filter: &str) -> i64 {
        self.db.count(&self.effects, filter).await
    }

    /// The moment of a disruption about to start: the time, and the next order to publish.
    fn mark(&self) -> Mark {
        Mark {
            at: Instant::now(),
            first_after: self.next.load(Ordering::SeqCst),
        }
    }

    /// How long from `mark` until an order published after it is charged.
    async fn recovery(&self, what: &str, mark: Mark) -> Duration {
        let filter = format!("message_key >= '{}'", order_key(mark.first_after));
        let deadline = Instant::now() + SETTLE;
        while self.effects(&filter).await == 0 {
            assert!(Instant::now() < deadline, "an order charged after {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let recovery = mark.at.elapsed();
        eprintln!("cluster recovery after {what}: {} ms", recovery.as_millis());
        recovery
    }

    /// Waits for every order, then checks each was charged once, none is left on the queue,
    /// and every consumer acknowledged orders after `acked` (consumers back on their feet).
    async fn finish(mut self, cluster: &Cluster, acked: &[u64]) {
        // Every consumer back on its feet, taking orders, before the producer stops.
        let deadline = Instant::now() + SETTLE;
        while self
            .acked()
            .iter()
            .zip(acked)
            .any(|(now, then)| now == then)
        {
            if Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.stop.store(true, Ordering::SeqCst);
        let orders = (&mut self.producer)
            .await
            .expect("the producer published every order");
        self.charged(orders).await;
        // A moment for a duplicate to show, should one be committed late.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let charged = self.effects("1=1").await;
        let stats: Vec<_> = self.consumers.iter().map(Consumer::stats).collect();
        assert_eq!(charged, i64::from(orders), "each order once: {stats:?}");
        let keys = format!(
            "(SELECT DISTINCT message_key FROM {}) AS charged_keys",
            self.effects
        );
        assert_eq!(self.db.count(&keys, "1=1").await, charged, "no order twice");
        // A copy still in flight (a redelivered duplicate waiting for its claim) settles
        // soon; right after a leader dies the queue reads 0 until the next is elected: wait for
        // two readings of 0 a second apart.
        let mut readings = Vec::new();
        for _ in 0..60 {
            readings.push(cluster.messages(&self.queue).await);
            if readings.ends_with(&[Some(0), Some(0)]) {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        assert!(
            readings.ends_with(&[Some(0), Some(0)]),
            "nothing left on {}: {readings:?}, {stats:?}",
            self.queue
        );
        let after: Vec<_> = self.acked().iter().zip(acked).map(|(a, b)| a - b).collect();
        assert!(
            after.iter().all(|&orders| orders > 0),
            "every consumer took orders again: {after:?} acknowledged since, {stats:?}"
        );
        for consumer in self.consumers {
            consumer.shutdown().await;
        }
        delete_queues(&[&self.queue, &format!("{}.dlq", self.queue)]).await;
    }
}

/// When a disruption started, and the first order published after it.
#[derive(Debug, Clone, Copy)]
struct Mark {
    at: Instant,
    first_after: u32,
}

fn order_key(index: u32) -> String {
    format!("o-{index:06}")
}

async fn consumer(
    inbox: &Inbox,
    topology: &QueueTopology,
    db: &TestDb,
    effects: &str,
    node: u8,
) -> Consumer {
    consumer_builder_at(
        &Cluster::urls_from(node),
        inbox,
        &unique(&format!("idem-cluster-{node}")),
    )
    .recovery_timeout(Duration::from_secs(5))
    .reconnect_delay(Duration::from_millis(200))
    // Three replicas of one service: one consumer name.
    .bind(topology.clone(), Recorder::new(db, effects, "billing"))
    .start()
    .await
    .expect("the consumer starts on the cluster")
}

/// Publishes orders to `queue` with confirms, about 300 a second, each retried with its id
/// until the cluster confirms it, until told to stop and `orders` at least; returns how many.
async fn produce(queue: String, orders: u32, next: Arc<AtomicU32>, stop: Arc<AtomicBool>) -> u32 {
    let publisher = Publisher::builder(Cluster::urls_from(1).as_str())
        .connection_name(unique("idem-cluster-producer"))
        .confirm_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("the producer connects");
    let mut index = 0;
    while index < orders || !stop.load(Ordering::SeqCst) {
        let key = order_key(index);
        let deadline = Instant::now() + SETTLE;
        while let Err(error) = publisher
            .publish("", &queue, &Msg::new(&key, "x"), with_id(&key))
            .await
        {
            assert!(Instant::now() < deadline, "{key} published: {error}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        index += 1;
        next.store(index, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    publisher.close().await;
    index
}

async fn delete_queues(queues: &[&str]) {
    let Ok(connection) =
        idem_rabbitmq::amqp::connect(&Cluster::urls_from(1).into(), "cleanup").await
    else {
        return;
    };
    if let Ok(channel) = connection.create_channel().await {
        for queue in queues {
            let _ = channel
                .queue_delete((*queue).into(), QueueDeleteOptions::default())
                .await;
        }
    }
    let _ = idem_rabbitmq::amqp::close_within(&connection, "done", Duration::from_secs(5)).await;
}

/// Scenario 1: the node of the queue's leader is SIGKILLed while three consumers process and
/// a producer publishes; the leader moves, the dead node's consumer reconnects elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_leader_node_loses_no_order_and_charges_none_twice() {
    let cluster = Cluster::take().await;
    let orders = from_env("IDEM_CLUSTER_ORDERS", 1_500);
    let mut recoveries = Vec::new();
    for _ in 0..from_env("IDEM_CLUSTER_ROUNDS", 1) {
        let run = Run::start(orders).await;
        run.charged(orders / 3).await;
        let leader = cluster.leader(&run.queue).await;
        let killed = run.mark();
        cluster.kill(leader).await;
        // Counted once the node is dead: what its consumer takes from now on, it takes
        // through another node.
        let acked = run.acked();
        recoveries.push(run.recovery(&format!("node {leader} killed"), killed).await);
        run.finish(&cluster, &acked).await;
        cluster.start_stopped().await;
    }
    recoveries.sort();
    eprintln!(
        "cluster recovery after a leader's node killed, over {} rounds: p50 {} ms, max {} ms",
        recoveries.len(),
        recoveries[recoveries.len() / 2].as_millis(),
        recoveries[recoveries.len() - 1].as_millis()
    );
}

/// Scenario 2: the node the second consumer is connected to stops its application and starts
/// it again a few seconds later.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_stopped_and_started_under_its_consumer_loses_no_order() {
    let cluster = Cluster::take().await;
    let orders = from_env("IDEM_CLUSTER_ORDERS", 1_500);
    let run = Run::start(orders).await;
    run.charged(orders / 3).await;
    let stopped = run.mark();
    cluster.ctl(2, &["stop_app"]).await;
    let acked = run.acked();
    run.recovery("node 2 stopped", stopped).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.ctl(2, &["start_app"]).await;
    run.finish(&cluster, &acked).await;
}

/// Scenario 3: a rolling restart of the three nodes, one at a time, under load.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_restart_loses_no_order() {
    let cluster = Cluster::take().await;
    let run = Run::start(from_env("IDEM_CLUSTER_ORDERS", 1_500)).await;
    run.charged(300).await;
    let mut acked = Vec::new();
    for node in NODES {
        let stopped = run.mark();
        cluster.ctl(node, &["stop"]).await;
        acked = run.acked();
        run.recovery(&format!("node {node} stopped for a restart"), stopped)
            .await;
        cluster.start_stopped().await;
    }
    run.finish(&cluster, &acked).await;
}

/// Scenario 4: the outbox relay publishes through the death of its node (which also leads the
/// queue), while messages of 20 runs are staged: every staged message arrives, each id once
/// once copies are set aside, in order within each run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_relay_publishes_through_a_node_kill_in_order_losing_nothing() {
    const RUNS: u32 = 20;
    let cluster = Cluster::take().await;
    let per_run = from_env("IDEM_CLUSTER_ORDERS", 1_500) * 2 / RUNS;
    let db = TestDb::connect(Backend::Postgres).await;
    let outbox = Outbox::builder(db.db.clone())
        .table(db.table("outbox"))
        .build()
        .await
        .expect("the outbox builds");
    let queue = QueueTopology::quorum(unique("idem_cq"));
    declare(&queue).await;
    let relay = Relay::builder(Cluster::urls_from(1).as_str(), outbox.clone())
        .connection_name(unique("idem-cluster-relay"))
        .retry_backoff(Duration::from_millis(20), Duration::from_millis(300))
        .start()
        .await
        .expect("the relay starts on the cluster");
    // Runs staged side by side, one message of each in turn, each committed on its own.
    let stager = {
        let (outbox, db, queue) = (outbox.clone(), db.db.clone(), queue.queue().to_owned());
        tokio::spawn(async move {
            for seq in 0..per_run {
                for run in 0..RUNS {
                    let message = OutboxMessage::new("", &queue, format!("{run}/{seq}"))
                        .keyed(format!("{run}/{seq}"))
                        .in_run(format!("run-{run}"));
                    outbox.stage(&db, message).await.expect("staged");
                }
                outbox.notify_staged();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let total = u64::from(per_run * RUNS);
    let deadline = Instant::now() + SETTLE;
    while relay.stats().published < total / 3 {
        assert!(
            Instant::now() < deadline,
            "a third published: {:?}",
            relay.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (published, killed) = (relay.stats().published, Instant::now());
    cluster.kill(1).await;
    while relay.stats().published == published {
        assert!(Instant::now() < deadline, "published after the kill");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "cluster recovery of the relay after node 1 killed: {} ms",
        killed.elapsed().as_millis()
    );
    stager.await.expect("every message staged");
    let unsent = || db.count(outbox.table().as_str(), "sent_at IS NULL");
    while unsent().await > 0 {
        assert!(
            Instant::now() < deadline,
            "every message sent: {:?}",
            relay.stats()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stats = relay.shutdown().await;
    let bodies = take_all(queue.queue(), total).await;
    // In order within each run, once copies of a publish whose confirm was lost are set aside.
    let mut seen = std::collections::BTreeSet::new();
    let mut last = vec![None; RUNS as usize];
    for body in &bodies {
        if !seen.insert(body.clone()) {
            continue;
        }
        let (run, seq) = body.split_once('/').expect("run/seq");
        let (run, seq): (usize, u32) = (run.parse().unwrap(), seq.parse().unwrap());
        assert_eq!(
            last[run].map_or(0, |l: u32| l + 1),
            seq,
            "run {run} in order"
        );
        last[run] = Some(seq);
    }
    assert_eq!(seen.len() as u64, total, "every message arrived: {stats:?}");
    let copies = bodies.len() as u64 - total;
    assert!(copies <= stats.failed, "{copies} copies, {stats:?}");
    delete_queues(&[queue.queue(), queue.dead_letter_queue()]).await;
    cluster.start_stopped().await;
}

/// Declares `topology` on the cluster.
async fn declare(topology: &QueueTopology) {
    let connection = idem_rabbitmq::amqp::connect(&Cluster::urls_from(1).into(), "setup")
        .await
        .expect("the cluster is reachable");
    let channel = connection.create_channel().await.expect("a channel");
    topology.declare(&channel).await.expect("declared");
    let _ = idem_rabbitmq::amqp::close_within(&connection, "done", Duration::from_secs(5)).await;
}

/// Takes messages off `queue` until `at_least` have come and a second passes without more;
/// returns their bodies in the order they came.
async fn take_all(queue: &str, at_least: u64) -> Vec<String> {
    let connection = idem_rabbitmq::amqp::connect(&Cluster::urls_from(2).into(), "reader")
        .await
        .expect("the cluster is reachable");
    let channel = connection.create_channel().await.expect("a channel");
    let mut bodies = Vec::new();
    let deadline = Instant::now() + SETTLE;
    let mut quiet_since = Instant::now();
    loop {
        let got = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get");
        match got {
            Some(message) => {
                bodies.push(String::from_utf8_lossy(&message.delivery.data).into_owned());
                quiet_since = Instant::now();
            }
            None if bodies.len() as u64 >= at_least
                && quiet_since.elapsed() > Duration::from_secs(1) =>
            {
                break;
            }
            None => {
                assert!(
                    Instant::now() < deadline,
                    "{} of {at_least} taken",
                    bodies.len()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let _ = idem_rabbitmq::amqp::close_within(&connection, "done", Duration::from_secs(5)).await;
    bodies
}

/// A publisher whose node dies declares and publishes on the next node, within its timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_publisher_whose_node_dies_goes_on_on_the_next() {
    let cluster = Cluster::take().await;
    let queue = QueueTopology::quorum(unique("idem_cq"));
    declare(&queue).await;
    let publisher = Publisher::builder(Cluster::urls_from(3).as_str())
        .confirm_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("the publisher connects");
    // At once, before the publisher has seen its connection go.
    cluster.sigkill(3).await;
    let exchange = unique("idem_cx");
    let declared = tokio::time::timeout(
        Duration::from_secs(30),
        publisher.declare_exchange(&exchange, idem_rabbitmq::lapin::ExchangeKind::Topic),
    )
    .await;
    assert!(matches!(declared, Ok(Ok(()))), "declared: {declared:?}");
    let published = tokio::time::timeout(
        Duration::from_secs(30),
        publisher.publish("", queue.queue(), &Msg::new("o-1", "x"), with_id("o-1")),
    )
    .await;
    assert!(matches!(published, Ok(Ok(_))), "published: {published:?}");
    publisher.close().await;
    delete_queues(&[queue.queue(), queue.dead_letter_queue()]).await;
    cluster.start_stopped().await;
}

/// A consumer started while two of the three nodes are stopped for 12 s (the broker cannot form
/// a new quorum queue and refuses its declaration with `INTERNAL_ERROR`) starts once they are back,
/// and charges what it is sent: the refusal is the cluster's state, not the user's mistake.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consumer_started_while_the_cluster_recovers_starts_once_it_can() {
    let cluster = Cluster::take().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let topology = QueueTopology::quorum(unique("idem_cq"));
    cluster.ctl(2, &["stop_app"]).await;
    cluster.ctl(3, &["stop_app"]).await;
    let back = tokio::spawn(async {
        tokio::time::sleep(Duration::from_secs(12)).await;
        idem_tests::cluster::start_stopped().await;
    });
    let consumer = consumer(&inbox, &topology, &db, &effects, 1).await;
    back.await.expect("the nodes are started again");
    let publisher = Publisher::builder(Cluster::urls_from(1).as_str())
        .connect()
        .await
        .expect("the producer connects");
    publisher
        .publish("", topology.queue(), &Msg::new("o-1", "x"), with_id("o-1"))
        .await
        .expect("published");
    let deadline = Instant::now() + SETTLE;
    while db.count(&effects, "1=1").await < 1 {
        assert!(Instant::now() < deadline, "the order charged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    publisher.close().await;
    consumer.shutdown().await;
    delete_queues(&[topology.queue(), topology.dead_letter_queue()]).await;
}

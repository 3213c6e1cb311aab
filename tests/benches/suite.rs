//! The benchmark suite of issue 9: consumers side by side on RabbitMQ with PostgreSQL, MariaDB and
//! SQLite, at prefetch 100 and 500, 10 % duplicates, in one run.
//!
//! Run: `cargo bench -p idem-tests --bench suite [-- --json --messages 20000 --rounds 3
//! --backends postgres,mysql,sqlite --prefetch 100,500 --modes raw,hand-batch,...]`, with
//! PostgreSQL, MariaDB and RabbitMQ up (see README); `-- --help` lists every option. `--soak N`
//! runs idem's batch consumer on N messages instead, printing its resident memory every 100 k.
//!
//! Modes:
//! - `raw`: consume and ack, no database: the broker's limit on this machine;
//! - `hand-per-message`: per delivery, one transaction written by hand with idem's guarantees
//!   (claim row with status and SHA-256 fingerprint, fingerprint checked on a known key,
//!   business insert, completion and output), then the ack; at concurrency 1 and 16;
//! - `idem-per-message`: idem's consumer with the `Charge` handler, at concurrency 1 and at the
//!   consumer's default (`max_in_flight` 16);
//! - `hand-batch`: ready deliveries up to a batch size or a short wait, one transaction written
//!   by hand (multi-row conditional insert returning the fresh keys, one read of the known ones,
//!   multi-row business insert and completion, one commit), then one `multiple` ack;
//! - `idem-batch`: idem's consumer with the binding in batch mode;
//! - `idem-batch-during-cleanup`: the same while the consumer's cleaner deletes a million expired
//!   records from the inbox table.
//!
//! Each round of a mode publishes its messages first (persistent, message id = order id), then
//! times from the consumer's start to its last settlement. Modes take turns round by round, so
//! that slow drift of the machine hits them alike; round 0 warms up and is not counted; figures
//! are medians. Latencies are measured at the wire by a probe in front of the broker, from a
//! delivery reaching the consumer to the frame that settles it leaving it, the same way for every
//! mode. After each round the suite checks one charge per distinct order, an empty queue and an
//! empty dead-letter queue, and stops loudly if not.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use futures_util::StreamExt;
use idem_rabbitmq::lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    BasicRejectOptions, ConfirmSelectOptions,
};
use idem_rabbitmq::lapin::types::FieldTable;
use idem_rabbitmq::lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use idem_rabbitmq::{Binding, Consumer, QueueTopology};
use idem_runtime::{Inbox, RetentionPolicy};
use idem_tests::bench::figures::{Histogram, median, peak_rss_mb, reset_peak_rss, rss_mb};
use idem_tests::bench::hand::{HandInbox, HandMessage, HandOutcome, fingerprint};
use idem_tests::bench::probe::Probe;
use idem_tests::bench::{Charge, Order, create_charges, orders};
use idem_tests::rabbit::amqp_url;
use idem_tests::{Backend, TestBroker, TestDb, bench::seed};
use serde_json::json;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// idem-rabbitmq's default `max_in_flight` (`Consumer::builder`): the per-message modes also run
/// at this concurrency, with idem's consumer left at its default.
const DEFAULT_CONCURRENCY: usize = 16;
/// Connections per database pool: the consumer's default concurrency and the cleaner's two,
/// with room to spare.
const POOL: u32 = 24;

#[derive(Debug, Parser)]
#[command(about = "idem's benchmark suite (issue 9): side by side on RabbitMQ with each database")]
struct Args {
    /// Messages per round for `raw` and the batch modes.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(10..))]
    messages: u64,
    /// Messages per round for the per-message modes (one commit per message, 10 to 30 times
    /// slower); default a quarter of `--messages`.
    #[arg(long, value_parser = clap::value_parser!(u64).range(10..))]
    per_message_messages: Option<u64>,
    /// Counted rounds per mode, after one warm-up round.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    rounds: u64,
    /// Databases to run on.
    #[arg(long, value_delimiter = ',', default_values = ["postgres", "mysql", "sqlite"])]
    backends: Vec<BackendArg>,
    /// Prefetch windows to run at.
    #[arg(long, value_delimiter = ',', default_values = ["100", "500"], value_parser = clap::value_parser!(u16).range(1..))]
    prefetch: Vec<u16>,
    /// Modes to run.
    #[arg(long, value_delimiter = ',', default_values = ["raw", "hand-per-message", "idem-per-message", "hand-batch", "idem-batch", "idem-batch-during-cleanup"])]
    modes: Vec<Mode>,
    /// Largest batch of the batch modes (capped by the prefetch).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    batch_size: u64,
    /// Longest wait for a batch to fill, in milliseconds.
    #[arg(long, default_value_t = 5)]
    max_wait_ms: u64,
    /// Expired records in the inbox table when each round of `idem-batch-during-cleanup`
    /// starts.
    #[arg(long, default_value_t = 1_000_000)]
    expired_rows: u64,
    /// Prints one JSON object per line instead of tables.
    #[arg(long)]
    json: bool,
    /// Runs idem's batch consumer on this many messages instead of the suite, on the first
    /// backend and prefetch, printing resident memory every 100 k messages.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    soak: Option<u64>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    Postgres,
    Mysql,
    Sqlite,
}

impl BackendArg {
    fn backend(self) -> Backend {
        match self {
            BackendArg::Postgres => Backend::Postgres,
            BackendArg::Mysql => Backend::MySql,
            BackendArg::Sqlite => Backend::Sqlite,
        }
    }

    fn name(self) -> &'static str {
        match self {
            BackendArg::Postgres => "postgres",
            BackendArg::Mysql => "mysql",
            BackendArg::Sqlite => "sqlite",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Raw,
    HandPerMessage,
    IdemPerMessage,
    HandBatch,
    IdemBatch,
    IdemBatchDuringCleanup,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Raw => "raw",
            Mode::HandPerMessage => "hand-per-message",
            Mode::IdemPerMessage => "idem-per-message",
            Mode::HandBatch => "hand-batch",
            Mode::IdemBatch => "idem-batch",
            Mode::IdemBatchDuringCleanup => "idem-batch-during-cleanup",
        }
    }

    fn per_message(self) -> bool {
        matches!(self, Mode::HandPerMessage | Mode::IdemPerMessage)
    }

    fn idem(self) -> bool {
        matches!(
            self,
            Mode::IdemPerMessage | Mode::IdemBatch | Mode::IdemBatchDuringCleanup
        )
    }

    fn batch(self) -> bool {
        matches!(
            self,
            Mode::HandBatch | Mode::IdemBatch | Mode::IdemBatchDuringCleanup
        )
    }
}

/// idem's binding in batch mode: batches of `size` deliveries, or those that arrived within
/// `max_wait` of the first. Each batch counts as one handler in flight, so the consumer's default
/// `max_in_flight` lets several overlap when the prefetch holds more than one.
fn idem_batch_binding(
    topology: QueueTopology,
    handler: Charge,
    size: usize,
    max_wait: Duration,
) -> Binding<Charge> {
    Binding::new(topology, handler).batch(size, max_wait)
}

fn charge(table: &str) -> Charge {
    Charge {
        table: table.to_owned(),
        key_from_message_id: true,
    }
}

/// Publishes the rounds' messages straight to the broker (not through the probe): persistent,
/// JSON, message id = order id, confirmed.
struct Feeder {
    _connection: Connection,
    channel: Channel,
}

impl Feeder {
    async fn connect() -> Self {
        let connection = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .expect("RabbitMQ is reachable");
        let channel = connection.create_channel().await.expect("a channel");
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirms");
        Self {
            _connection: connection,
            channel,
        }
    }

    /// Publishes `orders` to `queue`, a thousand confirms in flight at most.
    async fn publish(&self, queue: &str, orders: &[Order]) {
        let mut confirms = VecDeque::with_capacity(1000);
        for order in orders {
            let body = serde_json::to_vec(order).expect("JSON");
            let properties = BasicProperties::default()
                .with_message_id(order.id.as_str().into())
                .with_content_type("application/json".into())
                .with_delivery_mode(2);
            let confirm = self
                .channel
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    &body,
                    properties,
                )
                .await
                .expect("publish");
            confirms.push_back(confirm);
            if confirms.len() >= 1000 {
                let confirmation = confirms.pop_front().expect("a confirm").await;
                assert!(confirmation.expect("a confirm").is_ack(), "publish nacked");
            }
        }
        for confirm in confirms {
            assert!(confirm.await.expect("a confirm").is_ack(), "publish nacked");
        }
    }
}

/// What the whole run shares.
struct Suite {
    args: Args,
    probe: Probe,
    broker: TestBroker,
    feeder: Feeder,
    /// Numbers the published rounds, so that every order id of the run is new.
    published: u64,
}

impl Suite {
    fn messages(&self, mode: Mode) -> u64 {
        if mode.per_message() {
            self.args
                .per_message_messages
                .unwrap_or((self.args.messages / 4).max(10))
        } else {
            self.args.messages
        }
    }

    fn max_wait(&self) -> Duration {
        Duration::from_millis(self.args.max_wait_ms)
    }

    fn batch_size(&self, prefetch: u16) -> usize {
        (self.args.batch_size as usize).min(usize::from(prefetch))
    }

    /// Publishes `n` new orders (10 % duplicates) to `queue`.
    async fn publish(&mut self, queue: &str, n: u64) {
        self.published += 1;
        let orders = orders(n as usize, self.published as usize);
        self.feeder.publish(queue, &orders).await;
    }
}

/// One mode at one concurrency on one backend and prefetch: its tables, queue and figures.
struct Case {
    backend: BackendArg,
    prefetch: u16,
    mode: Mode,
    concurrency: usize,
    topology: QueueTopology,
    charges: String,
    inbox: Option<Inbox>,
    hand: Option<HandInbox>,
    /// Rounds run so far, the warm-up included.
    rounds_run: u64,
    rates: Vec<f64>,
    latency: Histogram,
    peak_rss_mb: f64,
    /// Expired records the cleaner deleted during each counted round.
    deleted: Vec<u64>,
    /// Deliveries requeued (a claim held elsewhere, a database error) over counted rounds.
    requeued: u64,
    /// Channels or connections the broker closed with an error, over counted rounds.
    broker_errors: u64,
}

/// The inbox whose cleaner has a million expired records to delete, shared by a backend's
/// `idem-batch-during-cleanup` cases and topped up before each round.
struct Expired {
    inbox: Inbox,
    table: String,
    /// Expired records inserted so far, which numbers the next ones.
    inserted: u64,
}

impl Expired {
    async fn create(db: &TestDb) -> Self {
        let table = db.table("inbox");
        // The cleaner runs at the consumer's start and goes on batch after batch (idem's
        // defaults: 1000 records, 10 ms apart) until no expired record is left; after a run it
        // waits this long, short so that it never sits out a round.
        let retention = RetentionPolicy::default().with_cleanup_interval(Duration::from_secs(1));
        let inbox = Inbox::builder(db.db.clone())
            .table(table.as_str())
            .retention(retention)
            .build()
            .await
            .expect("inbox");
        Self {
            inbox,
            table,
            inserted: 0,
        }
    }

    /// Inserts expired records until there are `target`.
    async fn top_up(&mut self, db: &TestDb, target: u64) {
        let present = seed::count_expired(db, &self.table).await;
        if present >= target {
            return;
        }
        let missing = target - present;
        let started = Instant::now();
        seed::insert_expired(db, &self.table, self.inserted, missing).await;
        self.inserted += missing;
        if missing > 100_000 {
            eprintln!(
                "  inserted {missing} expired records in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
    }
}

impl Case {
    async fn create(
        suite: &Suite,
        db: &TestDb,
        backend: BackendArg,
        prefetch: u16,
        mode: Mode,
        concurrency: usize,
        expired: Option<&Expired>,
    ) -> Self {
        let topology = suite.broker.classic_queue();
        suite.broker.declare(&topology).await;
        let charges = create_charges(db).await;
        let inbox = match mode {
            Mode::IdemBatchDuringCleanup => expired.map(|expired| expired.inbox.clone()),
            _ if mode.idem() => Some(
                Inbox::builder(db.db.clone())
                    .table(db.table("inbox"))
                    .build()
                    .await
                    .expect("inbox"),
            ),
            _ => None,
        };
        let hand = match mode {
            Mode::HandPerMessage | Mode::HandBatch => Some(HandInbox::create(db, &charges).await),
            _ => None,
        };
        Self {
            backend,
            prefetch,
            mode,
            concurrency,
            topology,
            charges,
            inbox,
            hand,
            rounds_run: 0,
            rates: Vec::new(),
            latency: Histogram::default(),
            peak_rss_mb: 0.0,
            deleted: Vec::new(),
            requeued: 0,
            broker_errors: 0,
        }
    }

    fn queue(&self) -> &str {
        self.topology.queue()
    }

    fn label(&self) -> String {
        format!(
            "{} prefetch {} {} c={}",
            self.backend.name(),
            self.prefetch,
            self.mode.name(),
            self.concurrency
        )
    }
}

/// Counts of how the hand-written side settled a round's deliveries.
#[derive(Debug, Default)]
struct HandCounts {
    processed: AtomicU64,
    duplicates: AtomicU64,
    mismatches: AtomicU64,
    requeued: AtomicU64,
}

impl HandCounts {
    fn count(&self, outcome: Result<HandOutcome, &sea_orm::DbErr>) {
        let counter = match outcome {
            Ok(HandOutcome::Processed) => &self.processed,
            Ok(HandOutcome::Duplicate) => &self.duplicates,
            Ok(HandOutcome::Mismatch) => &self.mismatches,
            Ok(HandOutcome::Busy) => &self.requeued,
            Err(error) => {
                eprintln!("  hand-written: database error, requeued: {error}");
                &self.requeued
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The figures of one round.
struct Round {
    rate: f64,
    latency: Histogram,
    peak_rss_mb: f64,
    requeued: u64,
    broker_errors: u64,
    deleted: Option<u64>,
}

/// A consumer running for a round.
enum Running {
    Idem(Consumer),
    Hand {
        connection: Connection,
        reader: JoinHandle<()>,
        counts: Arc<HandCounts>,
    },
}

async fn run_round(suite: &mut Suite, db: &TestDb, case: &Case) -> Round {
    let n = suite.messages(case.mode);
    suite.publish(case.queue(), n).await;
    suite.probe.take();
    reset_peak_rss();
    let start = Instant::now();
    let running = start_consumer(suite, db, case).await;
    let deadline = Duration::from_secs(60) + Duration::from_millis(5 * n);
    while suite.probe.finished() < n {
        if start.elapsed() > deadline {
            panic!(
                "{}: {} of {n} deliveries settled after {:?}",
                case.label(),
                suite.probe.finished(),
                start.elapsed()
            );
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let observed = suite.probe.take();
    let peak_rss_mb = peak_rss_mb();
    let last = observed.last_settlement.expect("a settlement");
    let rate = n as f64 / last.duration_since(start).as_secs_f64();
    let distinct = n - n / 10;
    let mut deleted = None;
    match running {
        Running::Idem(consumer) => {
            // The consumer counts a settlement once lapin has sent it, a moment after the probe
            // saw it go.
            let counted = Instant::now();
            let mut stats = consumer.stats();
            while stats.acked + stats.duplicates + stats.dead_lettered < n
                && counted.elapsed() < Duration::from_secs(5)
            {
                tokio::time::sleep(Duration::from_millis(1)).await;
                stats = consumer.stats();
            }
            let report = consumer.shutdown().await;
            assert_eq!(
                (stats.acked + stats.duplicates, stats.dead_lettered),
                (n, 0),
                "{}: idem's consumer settled {stats:?}",
                case.label()
            );
            deleted = report.cleanup.map(|cleanup| cleanup.deleted);
        }
        Running::Hand {
            connection,
            reader,
            counts,
        } => {
            reader.abort();
            let _ = reader.await;
            let _ = connection.close(200, "round done".into()).await;
            if let Some(_hand) = &case.hand {
                let processed = counts.processed.load(Ordering::Relaxed);
                let mismatches = counts.mismatches.load(Ordering::Relaxed);
                assert_eq!(
                    (processed, mismatches),
                    (distinct, 0),
                    "{}: hand-written side processed {processed} fresh orders of {distinct}, \
                     {mismatches} mismatches",
                    case.label()
                );
            }
        }
    }
    check(suite, db, case, distinct).await;
    Round {
        rate,
        latency: observed.latency,
        peak_rss_mb,
        requeued: observed.requeued,
        broker_errors: observed.broker_errors,
        deleted,
    }
}

/// Fails loudly unless every distinct order of the rounds so far was charged once and the
/// queue and its dead-letter queue are empty.
async fn check(suite: &Suite, db: &TestDb, case: &Case, distinct_per_round: u64) {
    let label = case.label();
    let (ready, dead) = (
        suite.broker.depth(case.queue()).await,
        suite.broker.depth(case.topology.dead_letter_queue()).await,
    );
    assert_eq!(
        (ready, dead),
        (0, 0),
        "{label}: messages left in the queue, dead-lettered"
    );
    if case.mode == Mode::Raw {
        return;
    }
    let expected = distinct_per_round * (case.rounds_run + 1);
    let charges = db.count(&case.charges, "1=1").await as u64;
    let sql = format!("SELECT COUNT(DISTINCT order_id) FROM {}", case.charges);
    let row = sea_orm::ConnectionTrait::query_one_raw(
        &db.db,
        sea_orm::Statement::from_string(sea_orm::ConnectionTrait::get_database_backend(&db.db), sql),
    )
    .await
    .expect("count")
    .expect("a row");
    let distinct = row.try_get_by_index::<i64>(0).expect("a count") as u64;
    assert_eq!(
        (charges, distinct),
        (expected, expected),
        "{label}: charges (all, distinct orders) instead of one per distinct order"
    );
}

async fn start_consumer(suite: &Suite, db: &TestDb, case: &Case) -> Running {
    let url = suite.probe.url();
    match case.mode {
        Mode::IdemPerMessage | Mode::IdemBatch | Mode::IdemBatchDuringCleanup => {
            let inbox = case.inbox.clone().expect("an inbox");
            let handler = charge(&case.charges);
            let binding = if case.mode == Mode::IdemPerMessage {
                Binding::new(case.topology.clone(), handler)
            } else {
                idem_batch_binding(
                    case.topology.clone(),
                    handler,
                    suite.batch_size(case.prefetch),
                    suite.max_wait(),
                )
            };
            let mut builder = Consumer::builder(url, inbox)
                .connection_name("bench")
                .prefetch(case.prefetch);
            // The default concurrency is left to the consumer.
            if case.concurrency != DEFAULT_CONCURRENCY {
                builder = builder.max_in_flight(case.concurrency);
            }
            let consumer = builder.bind_with(binding).start().await.expect("start");
            Running::Idem(consumer)
        }
        Mode::Raw | Mode::HandPerMessage | Mode::HandBatch => {
            let connection = Connection::connect(url, ConnectionProperties::default())
                .await
                .expect("connect");
            let channel = connection.create_channel().await.expect("channel");
            channel
                .basic_qos(case.prefetch, BasicQosOptions::default())
                .await
                .expect("qos");
            let consumer = channel
                .basic_consume(
                    case.queue().into(),
                    "".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .expect("consume");
            let counts = Arc::new(HandCounts::default());
            let reader = match case.mode {
                Mode::Raw => tokio::spawn(raw(consumer)),
                Mode::HandPerMessage => tokio::spawn(hand_per_message(
                    consumer,
                    db.db.clone(),
                    case.hand.clone().expect("a hand inbox"),
                    case.concurrency,
                    Arc::clone(&counts),
                )),
                _ => tokio::spawn(hand_batch(
                    consumer,
                    db.db.clone(),
                    case.hand.clone().expect("a hand inbox"),
                    suite.batch_size(case.prefetch),
                    suite.max_wait(),
                    Arc::clone(&counts),
                )),
            };
            Running::Hand {
                connection,
                reader,
                counts,
            }
        }
    }
}

/// `raw`: ack each delivery as it comes.
async fn raw(mut consumer: idem_rabbitmq::lapin::Consumer) {
    while let Some(Ok(delivery)) = consumer.next().await {
        delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .expect("ack");
    }
}

/// A delivery decoded for the hand-written side.
fn decode(delivery: &idem_rabbitmq::lapin::message::Delivery) -> HandMessage {
    HandMessage {
        key: delivery
            .properties
            .message_id()
            .as_ref()
            .expect("a message id")
            .to_string(),
        fingerprint: fingerprint(&delivery.data),
        order: serde_json::from_slice(&delivery.data).expect("an order"),
    }
}

/// Settles one delivery as the hand-written side decided.
async fn settle(
    delivery: &idem_rabbitmq::lapin::message::Delivery,
    outcome: Result<HandOutcome, &sea_orm::DbErr>,
) {
    let acker = &delivery.acker;
    let sent = match outcome {
        Ok(HandOutcome::Processed | HandOutcome::Duplicate) => {
            acker.ack(BasicAckOptions::default()).await
        }
        Ok(HandOutcome::Mismatch) => acker.reject(BasicRejectOptions { requeue: false }).await,
        Ok(HandOutcome::Busy) | Err(_) => {
            acker
                .nack(BasicNackOptions {
                    multiple: false,
                    requeue: true,
                })
                .await
        }
    };
    sent.expect("settle");
}

/// `hand-per-message`: each delivery in its own transaction, `concurrency` at once.
async fn hand_per_message(
    mut consumer: idem_rabbitmq::lapin::Consumer,
    db: sea_orm::DatabaseConnection,
    hand: HandInbox,
    concurrency: usize,
    counts: Arc<HandCounts>,
) {
    let permits = Arc::new(Semaphore::new(concurrency));
    loop {
        let permit = Arc::clone(&permits).acquire_owned().await.expect("permit");
        let Some(Ok(delivery)) = consumer.next().await else {
            return;
        };
        let (db, hand, counts) = (db.clone(), hand.clone(), Arc::clone(&counts));
        tokio::spawn(async move {
            let outcome = hand.process(&db, decode(&delivery)).await;
            // Counted before the settlement leaves: the round ends when the probe sees it.
            counts.count(outcome.as_ref().copied());
            settle(&delivery, outcome.as_ref().copied()).await;
            drop(permit);
        });
    }
}

/// `hand-batch`: the deliveries ready within `max_wait` of the first, up to `size`, in one
/// transaction, then one `multiple` ack when all of them are acked (every earlier delivery of
/// the channel is settled by then: one batch at a time).
async fn hand_batch(
    mut consumer: idem_rabbitmq::lapin::Consumer,
    db: sea_orm::DatabaseConnection,
    hand: HandInbox,
    size: usize,
    max_wait: Duration,
    counts: Arc<HandCounts>,
) {
    let mut batch = Vec::with_capacity(size);
    loop {
        let Some(Ok(first)) = consumer.next().await else {
            return;
        };
        batch.push(first);
        let deadline = tokio::time::Instant::now() + max_wait;
        while batch.len() < size {
            match tokio::time::timeout_at(deadline, consumer.next()).await {
                Ok(Some(Ok(delivery))) => batch.push(delivery),
                Ok(_) => return,
                Err(_) => break,
            }
        }
        let messages: Vec<HandMessage> = batch.iter().map(decode).collect();
        match hand.process_batch(&db, &messages).await {
            Ok(outcomes) => {
                for outcome in &outcomes {
                    counts.count(Ok(*outcome));
                }
                let all_acked = outcomes
                    .iter()
                    .all(|o| matches!(o, HandOutcome::Processed | HandOutcome::Duplicate));
                if all_acked {
                    let last = batch.last().expect("a delivery");
                    last.acker
                        .ack(BasicAckOptions { multiple: true })
                        .await
                        .expect("ack");
                } else {
                    for (delivery, outcome) in batch.iter().zip(&outcomes) {
                        settle(delivery, Ok(*outcome)).await;
                    }
                }
            }
            Err(error) => {
                for delivery in &batch {
                    counts.count(Err(&error));
                    settle(delivery, Err(&error)).await;
                }
            }
        }
        batch.clear();
    }
}

/// The figures of a case, as printed.
struct Summary {
    msgs_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
}

impl Case {
    fn record(&mut self, round: Round) {
        self.rates.push(round.rate);
        self.latency.merge(&round.latency);
        self.peak_rss_mb = self.peak_rss_mb.max(round.peak_rss_mb);
        self.requeued += round.requeued;
        self.broker_errors += round.broker_errors;
        if let Some(deleted) = round.deleted {
            self.deleted.push(deleted);
        }
    }

    fn summary(&self) -> Summary {
        Summary {
            msgs_per_s: median(self.rates.clone()),
            p50_ms: self.latency.quantile_ms(0.5),
            p99_ms: self.latency.quantile_ms(0.99),
        }
    }

    fn json(&self, suite: &Suite) -> serde_json::Value {
        let mut line = json!({
            "bench": "suite",
            "backend": self.backend.name(),
            "prefetch": self.prefetch,
            "concurrency": self.concurrency,
            "mode": self.mode.name(),
        });
        let object = line.as_object_mut().expect("an object");
        let summary = self.summary();
        let fields = json!({
            "msgs_per_s": round1(summary.msgs_per_s),
            "p50_ms": round3(summary.p50_ms),
            "p99_ms": round3(summary.p99_ms),
            "peak_rss_mb": round1(self.peak_rss_mb),
            "messages": suite.messages(self.mode),
            "rounds": self.rates.len(),
            "duplicates": 0.1,
            "requeued": self.requeued,
            "broker_errors": self.broker_errors,
        });
        object.extend(fields.as_object().expect("an object").clone());
        if self.mode.batch() {
            object.insert("batch_size".into(), suite.batch_size(self.prefetch).into());
            object.insert("max_wait_ms".into(), suite.args.max_wait_ms.into());
        }
        if self.mode == Mode::IdemBatchDuringCleanup {
            let deleted: Vec<f64> = self.deleted.iter().map(|&d| d as f64).collect();
            object.insert("cleanup_deleted_per_round".into(), median(deleted).into());
        }
        line
    }

    fn row(&self, suite: &Suite) -> String {
        let head = format!(
            "{:<9} {:>8}  {:<26} {:>4}",
            self.backend.name(),
            self.prefetch,
            self.mode.name(),
            self.concurrency
        );
        let s = self.summary();
        let mut notes = Vec::new();
        if self.mode.batch() {
            notes.push(format!(
                "batch {} / {} ms",
                suite.batch_size(self.prefetch),
                suite.args.max_wait_ms
            ));
        }
        if self.mode == Mode::IdemBatchDuringCleanup {
            let deleted: Vec<f64> = self.deleted.iter().map(|&d| d as f64).collect();
            notes.push(format!("cleaner deleted {:.0}/round", median(deleted)));
        }
        if self.requeued > 0 {
            notes.push(format!("{} requeued", self.requeued));
        }
        if self.broker_errors > 0 {
            notes.push(format!(
                "{} channel/connection closed by the broker with an error",
                self.broker_errors
            ));
        }
        format!(
            "{head} {:>10.0} {:>8.2} {:>8.2} {:>7.1}  {}",
            s.msgs_per_s,
            s.p50_ms,
            s.p99_ms,
            self.peak_rss_mb,
            notes.join(", ")
        )
    }
}

fn round1(value: f64) -> f64 {
    (value * 10.0).round() / 10.0
}

fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// A target of issue 9: `numerator / denominator >= min`, per round, median.
struct Target {
    numerator: (Mode, Concurrency),
    denominator: (Mode, Concurrency),
    min: f64,
    /// Whether the issue sets it on every backend or on PostgreSQL only.
    postgres_only: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Concurrency {
    One,
    Default,
    /// Whatever the mode runs at (the batch modes, `raw`).
    Any,
}

impl Concurrency {
    fn matches(self, concurrency: usize) -> bool {
        match self {
            Concurrency::One => concurrency == 1,
            Concurrency::Default => concurrency == DEFAULT_CONCURRENCY,
            Concurrency::Any => true,
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Concurrency::One => " c=1",
            Concurrency::Default => " c=16",
            Concurrency::Any => "",
        }
    }
}

const TARGETS: [Target; 6] = [
    Target {
        numerator: (Mode::IdemBatch, Concurrency::Any),
        denominator: (Mode::HandBatch, Concurrency::Any),
        min: 0.8,
        postgres_only: false,
    },
    Target {
        numerator: (Mode::IdemBatch, Concurrency::Any),
        denominator: (Mode::IdemPerMessage, Concurrency::One),
        min: 15.0,
        postgres_only: true,
    },
    Target {
        numerator: (Mode::IdemBatch, Concurrency::Any),
        denominator: (Mode::IdemPerMessage, Concurrency::Default),
        min: 5.0,
        postgres_only: true,
    },
    Target {
        numerator: (Mode::IdemBatchDuringCleanup, Concurrency::Any),
        denominator: (Mode::IdemBatch, Concurrency::Any),
        min: 0.8,
        postgres_only: false,
    },
    Target {
        numerator: (Mode::IdemPerMessage, Concurrency::One),
        denominator: (Mode::HandPerMessage, Concurrency::One),
        min: 0.9,
        postgres_only: false,
    },
    Target {
        numerator: (Mode::IdemPerMessage, Concurrency::Default),
        denominator: (Mode::HandPerMessage, Concurrency::Default),
        min: 0.9,
        postgres_only: false,
    },
];

impl Target {
    fn name(&self) -> String {
        format!(
            "{}{} / {}{}",
            self.numerator.0.name(),
            self.numerator.1.suffix(),
            self.denominator.0.name(),
            self.denominator.1.suffix()
        )
    }

    /// The median over rounds of the per-round ratio, among `cases` of one backend and
    /// prefetch; `None` if either side did not run.
    fn ratio(&self, cases: &[Case]) -> Option<f64> {
        let find = |(mode, concurrency): (Mode, Concurrency)| {
            cases.iter().find(|case| {
                case.mode == mode
                    && concurrency.matches(case.concurrency)
                    && !case.rates.is_empty()
            })
        };
        let (top, bottom) = (find(self.numerator)?, find(self.denominator)?);
        Some(median(
            top.rates
                .iter()
                .zip(&bottom.rates)
                .map(|(a, b)| a / b)
                .collect(),
        ))
    }
}

/// The cases of one backend and prefetch, in the order they take turns.
fn plan(modes: &[Mode]) -> Vec<(Mode, usize)> {
    let mut plan = Vec::new();
    let wanted = |mode| modes.contains(&mode);
    if wanted(Mode::Raw) {
        plan.push((Mode::Raw, 1));
    }
    for concurrency in [1, DEFAULT_CONCURRENCY] {
        for mode in [Mode::HandPerMessage, Mode::IdemPerMessage] {
            if wanted(mode) {
                plan.push((mode, concurrency));
            }
        }
    }
    if wanted(Mode::HandBatch) {
        plan.push((Mode::HandBatch, 1));
    }
    for mode in [Mode::IdemBatch, Mode::IdemBatchDuringCleanup] {
        if wanted(mode) {
            plan.push((mode, DEFAULT_CONCURRENCY));
        }
    }
    plan
}

async fn run_suite(suite: &mut Suite) {
    let mut done: Vec<Vec<Case>> = Vec::new();
    let backends = suite.args.backends.clone();
    let prefetches = suite.args.prefetch.clone();
    let plan = plan(&suite.args.modes);
    if !suite.args.json {
        println!("{}", header());
    }
    for backend in backends {
        let db = TestDb::connect_with_pool(backend.backend(), POOL).await;
        let mut expired = None;
        let cleanup = plan
            .iter()
            .any(|(mode, _)| *mode == Mode::IdemBatchDuringCleanup);
        if cleanup {
            expired = Some(Expired::create(&db).await);
        }
        for &prefetch in &prefetches {
            let mut cases = Vec::new();
            for &(mode, concurrency) in &plan {
                cases.push(
                    Case::create(
                        suite,
                        &db,
                        backend,
                        prefetch,
                        mode,
                        concurrency,
                        expired.as_ref(),
                    )
                    .await,
                );
            }
            for round in 0..=suite.args.rounds {
                eprintln!(
                    "{} prefetch {prefetch}: round {round}{}",
                    backend.name(),
                    if round == 0 { " (warm-up)" } else { "" }
                );
                for case in &mut cases {
                    if case.mode == Mode::IdemBatchDuringCleanup {
                        let expired = expired.as_mut().expect("the expired records");
                        expired.top_up(&db, suite.args.expired_rows).await;
                    }
                    let figures = run_round(suite, &db, case).await;
                    case.rounds_run += 1;
                    if round > 0 {
                        case.record(figures);
                    }
                }
            }
            for case in &cases {
                if suite.args.json {
                    println!("{}", case.json(suite));
                } else {
                    println!("{}", case.row(suite));
                }
            }
            done.push(cases);
        }
    }
    print_targets(suite, &done);
}

fn header() -> String {
    format!(
        "{:<9} {:>8}  {:<26} {:>4} {:>10} {:>8} {:>8} {:>7}  notes",
        "backend", "prefetch", "mode", "conc", "msg/s", "p50 ms", "p99 ms", "RSS MB"
    )
}

fn print_targets(suite: &Suite, groups: &[Vec<Case>]) {
    if !suite.args.json {
        println!("\nTargets of issue 9 (median of per-round ratios):");
    }
    for cases in groups {
        let Some(first) = cases.first() else { continue };
        let (backend, prefetch) = (first.backend, first.prefetch);
        for target in &TARGETS {
            let applies = !target.postgres_only || backend == BackendArg::Postgres;
            let ratio = target.ratio(cases);
            let verdict = match (ratio, applies) {
                (None, _) => "not measured",
                (Some(_), false) => "no target here",
                (Some(r), true) if r >= target.min => "met",
                (Some(_), true) => "NOT MET",
            };
            if suite.args.json {
                println!(
                    "{}",
                    json!({
                        "bench": "suite-target",
                        "backend": backend.name(),
                        "prefetch": prefetch,
                        "target": target.name(),
                        "ratio": ratio.map(round3),
                        "min": target.min,
                        "applies": applies,
                        "met": ratio.map(|r| applies && r >= target.min),
                    })
                );
            } else {
                let shown = ratio.map_or("-".to_owned(), |r| format!("{r:.2}"));
                println!(
                    "{:<9} {:>4}  {:<48} {:>7}  >= {:<4}  {verdict}",
                    backend.name(),
                    prefetch,
                    target.name(),
                    shown,
                    target.min
                );
            }
        }
    }
}

/// `--soak N`: idem's batch consumer on `n` messages, fed while it runs; resident memory every
/// 100 k.
async fn soak(suite: &mut Suite, n: u64) {
    const CHUNK: u64 = 50_000;
    const EVERY: u64 = 100_000;
    let backend = suite.args.backends[0];
    let prefetch = suite.args.prefetch[0];
    let db = TestDb::connect_with_pool(backend.backend(), POOL).await;
    let topology = suite.broker.classic_queue();
    suite.broker.declare(&topology).await;
    let charges = create_charges(&db).await;
    let inbox = Inbox::builder(db.db.clone())
        .table(db.table("inbox"))
        .build()
        .await
        .expect("inbox");
    let binding = idem_batch_binding(
        topology.clone(),
        charge(&charges),
        suite.batch_size(prefetch),
        suite.max_wait(),
    );
    let mode = Mode::IdemBatch;
    suite.probe.take();
    let start = Instant::now();
    let consumer = Consumer::builder(suite.probe.url(), inbox)
        .connection_name("bench-soak")
        .prefetch(prefetch)
        .bind_with(binding)
        .start()
        .await
        .expect("start");
    let mut published = 0;
    let mut next_report = EVERY.min(n);
    let mut distinct = 0;
    while published < n || suite.probe.finished() < n {
        // Keeps at most two chunks ready in the queue.
        if published < n && published < suite.probe.finished() + 2 * CHUNK {
            let chunk = CHUNK.min(n - published);
            suite.publish(topology.queue(), chunk).await;
            published += chunk;
            distinct += chunk - chunk / 10;
        } else {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let finished = suite.probe.finished();
        if finished >= next_report {
            let elapsed = start.elapsed().as_secs_f64();
            if suite.args.json {
                println!(
                    "{}",
                    json!({
                        "bench": "suite-soak",
                        "backend": backend.name(),
                        "prefetch": prefetch,
                        "mode": mode.name(),
                        "settled": finished,
                        "elapsed_s": round3(elapsed),
                        "rss_mb": round1(rss_mb()),
                        "peak_rss_mb": round1(peak_rss_mb()),
                    })
                );
            } else {
                println!(
                    "{} prefetch {prefetch} {}: {finished:>8} settled in {elapsed:>6.1} s, RSS \
                     {:.1} MB (peak {:.1} MB)",
                    backend.name(),
                    mode.name(),
                    rss_mb(),
                    peak_rss_mb()
                );
            }
            next_report = (next_report + EVERY).min(n).max(finished + 1);
        }
    }
    let stats = consumer.stats();
    consumer.shutdown().await;
    assert_eq!(stats.dead_lettered, 0, "soak: dead-lettered {stats:?}");
    let charged = db.count(&charges, "1=1").await as u64;
    assert_eq!(charged, distinct, "soak: one charge per distinct order");
    assert_eq!(suite.broker.depth(topology.queue()).await, 0, "soak: queue empty");
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .with_writer(std::io::stderr)
        .init();
    let probe = Probe::start(&amqp_url());
    let broker = TestBroker::connect().await;
    let feeder = Feeder::connect().await;
    let soak_messages = args.soak;
    let mut suite = Suite {
        args,
        probe,
        broker,
        feeder,
        published: 0,
    };
    match soak_messages {
        Some(n) => soak(&mut suite, n).await,
        None => run_suite(&mut suite).await,
    }
}

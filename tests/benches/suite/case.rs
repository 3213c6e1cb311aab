//! A case (a mode at a concurrency, on a backend and prefetch) and its rounds: publish, start
//! the consumer, wait for the last settlement, check.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use idem_rabbitmq::lapin::options::{BasicConsumeOptions, BasicQosOptions};
use idem_rabbitmq::lapin::types::FieldTable;
use idem_rabbitmq::lapin::{Channel, Connection, ConnectionProperties};
use idem_rabbitmq::{Binding, Consumer, ConsumerBuilder, QueueTopology};
use idem_runtime::transport::BatchChecks;
use idem_runtime::{Inbox, RetentionPolicy};
use idem_tests::bench::figures::{Histogram, peak_rss_mb, reset_peak_rss};
use idem_tests::bench::hand::HandInbox;
use idem_tests::bench::{ChargeAndStage, create_charges, seed};
use idem_tests::{Backend, TestDb};
use sea_orm::{ConnectionTrait, Statement};
use tokio::task::JoinHandle;

use crate::args::{BackendArg, Mode};
use crate::hand::{HandBatching, HandCounts, hand_batch, hand_per_message, raw};
use crate::outbox::{Downstream, Staging, arrivals, check_events, start_relay};
use crate::statements::{Counts, StatementCounter};
use crate::{DEFAULT_CONCURRENCY, Suite, charge, idem_batch_binding};
use idem_tests::bench::hand::BusinessInserts;

/// One mode at one concurrency on one backend and prefetch: its tables, queue and figures.
pub(crate) struct Case {
    pub(crate) backend: BackendArg,
    pub(crate) prefetch: u16,
    pub(crate) mode: Mode,
    pub(crate) concurrency: usize,
    pub(crate) topology: QueueTopology,
    pub(crate) charges: String,
    pub(crate) inbox: Option<Inbox>,
    pub(crate) hand: Option<HandInbox>,
    /// Where the outbox modes' events go.
    pub(crate) downstream: Option<Downstream>,
    /// The tables its consumer writes.
    pub(crate) tables: Vec<String>,
    /// Rounds run so far, the warm-up included.
    pub(crate) rounds_run: u64,
    pub(crate) rates: Vec<f64>,
    pub(crate) latency: Histogram,
    pub(crate) peak_rss_mb: f64,
    /// Expired records the cleaner deleted during each counted round.
    pub(crate) deleted: Vec<u64>,
    /// Deliveries requeued (a claim held elsewhere, a database error) over counted rounds.
    pub(crate) requeued: u64,
    /// Channels or connections the broker closed with an error, over counted rounds.
    pub(crate) broker_errors: u64,
    /// Statements and round trips of each counted round.
    pub(crate) statements: Vec<Counts>,
    /// What went wrong, if a round failed: the case runs no further round.
    pub(crate) failure: Option<String>,
}

/// The inbox whose cleaner has a million expired records to delete, shared by a backend's
/// `idem-batch-during-cleanup` cases and topped up before each round.
pub(crate) struct Expired {
    pub(crate) inbox: Inbox,
    pub(crate) table: String,
    /// Expired records inserted so far, which numbers the next ones.
    pub(crate) inserted: u64,
}

impl Expired {
    pub(crate) async fn create(db: &TestDb) -> Self {
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
    pub(crate) async fn top_up(&mut self, db: &TestDb, target: u64) {
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
    pub(crate) async fn create(
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
        let mut tables = vec![charges.clone()];
        let downstream = Downstream::create(suite, db, mode).await;
        if let Some(downstream) = &downstream {
            tables.push(downstream.table());
        }
        let inbox = match mode {
            Mode::IdemBatchDuringCleanup => expired.map(|expired| {
                tables.push(expired.table.clone());
                expired.inbox.clone()
            }),
            _ if mode.idem() => {
                let table = db.table("inbox");
                tables.push(table.clone());
                let mut builder = Inbox::builder(db.db.clone()).table(table);
                if let Some(Staging::Idem(outbox)) = downstream.as_ref().map(|d| &d.outbox) {
                    builder = builder.outbox(outbox.clone());
                }
                Some(builder.build().await.expect("inbox"))
            }
            _ => None,
        };
        let hand = match mode {
            Mode::HandPerMessage | Mode::HandBatch | Mode::HandBatchMultirow | Mode::HandOutbox => {
                let mut hand = HandInbox::create(db, &charges).await;
                tables.push(hand.table().to_owned());
                if let Some(Staging::Hand(outbox)) = downstream.as_ref().map(|d| &d.outbox) {
                    hand = hand.with_outbox(outbox.clone());
                }
                Some(hand)
            }
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
            downstream,
            tables,
            rounds_run: 0,
            rates: Vec::new(),
            latency: Histogram::default(),
            peak_rss_mb: 0.0,
            deleted: Vec::new(),
            requeued: 0,
            broker_errors: 0,
            statements: Vec::new(),
            failure: None,
        }
    }

    pub(crate) fn queue(&self) -> &str {
        self.topology.queue()
    }

    pub(crate) fn label(&self) -> String {
        format!(
            "{} prefetch {} {} c={}",
            self.backend.name(),
            self.prefetch,
            self.mode.name(),
            self.concurrency
        )
    }
}

/// The figures of one round.
pub(crate) struct Round {
    pub(crate) rate: f64,
    pub(crate) latency: Histogram,
    pub(crate) peak_rss_mb: f64,
    pub(crate) requeued: u64,
    pub(crate) broker_errors: u64,
    pub(crate) deleted: Option<u64>,
    /// What the round's consumer (and relay) ran on the database, from its start to its stop.
    pub(crate) statements: Counts,
}

/// A consumer running for a round.
pub(crate) enum Running {
    Idem(Consumer),
    Hand(Box<HandRunning>),
}

/// A consumer written by hand, running: its connection, channel and reading task.
pub(crate) struct HandRunning {
    connection: Connection,
    channel: Channel,
    reader: JoinHandle<()>,
    counts: Arc<HandCounts>,
}

/// Runs one round of `case`: publishes, starts the consumer (and the relay of an outbox mode),
/// waits for the last settlement (and for every event to reach the downstream queue), stops
/// them and checks the outcome. An error says what went wrong: a round that did not finish, a
/// consumer's counts, a check.
pub(crate) async fn run_round(
    suite: &mut Suite,
    (db, counter): (&TestDb, &StatementCounter),
    case: &Case,
) -> Result<Round, String> {
    let n = suite.messages(case.mode);
    let published = suite.publish(case.queue(), n).await;
    suite.probe.take();
    reset_peak_rss();
    let counted = counter.start(db).await;
    let start = Instant::now();
    let relaying = start_relay(db, case).await;
    let running = start_consumer(suite, db, case).await;
    let distinct = n - n / 10;
    let (settled, arrived) = tokio::join!(
        settlements(suite, case, n, start),
        arrivals(suite, case, distinct, start)
    );
    let observed = suite.probe.take();
    let peak_rss_mb = peak_rss_mb();
    let stopped = stop(running, case, n).await;
    let relayed = match relaying {
        Some(relaying) => relaying.stop(case).await,
        None => Ok(()),
    };
    let statements = counter.since(db, counted).await;
    settled?;
    let deleted = stopped?;
    let arrived = arrived?;
    relayed?;
    check(suite, db, case, distinct).await?;
    check_events(suite, db, case, n, published).await?;
    analyze(db, case).await;
    let last = observed.last_settlement.ok_or("no settlement")?;
    // End to end for the outbox modes: until the last event, if it came after the last ack.
    let end = arrived.map_or(last, |arrived| arrived.max(last));
    Ok(Round {
        rate: n as f64 / end.duration_since(start).as_secs_f64(),
        latency: observed.latency,
        peak_rss_mb,
        requeued: observed.requeued,
        broker_errors: observed.broker_errors,
        deleted,
        statements,
    })
}

/// Waits until the probe has seen `n` deliveries settled for good, and, when the broker closed a
/// channel meanwhile, until its messages came back and were settled too.
async fn settlements(suite: &Suite, case: &Case, n: u64, start: Instant) -> Result<(), String> {
    let deadline = Duration::from_secs(60) + Duration::from_millis(5 * n);
    while suite.probe.finished() < n {
        if start.elapsed() > deadline {
            return Err(overdue(suite, case, n, start).await);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    if suite.probe.broker_errors() > 0 {
        // A channel the broker closed discarded what the consumer sent on it after the error,
        // settlements the probe counted included: those messages come back. The round ends
        // when the queue is empty and nothing is outstanding, twice in a row.
        let mut quiet = 0;
        while quiet < 2 {
            if start.elapsed() > deadline {
                return Err(overdue(suite, case, n, start).await);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            let drained =
                suite.probe.outstanding() == 0 && suite.broker.depth(case.queue()).await == 0;
            quiet = if drained { quiet + 1 } else { 0 };
        }
    }
    Ok(())
}

/// What a round that did not finish in time left behind.
async fn overdue(suite: &Suite, case: &Case, n: u64, start: Instant) -> String {
    format!(
        "{}: {} of {n} deliveries settled after {:.0?}; {} outstanding, {} ready in the queue",
        case.label(),
        suite.probe.finished(),
        start.elapsed(),
        suite.probe.outstanding(),
        suite.broker.depth(case.queue()).await
    )
}

/// Stops the round's consumer and checks its own counts; returns how many expired records
/// idem's cleaner deleted meanwhile, if it ran.
async fn stop(running: Running, case: &Case, n: u64) -> Result<Option<u64>, String> {
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
            // More than `n` when a channel was lost: its messages came back as duplicates.
            if stats.acked + stats.duplicates < n || stats.dead_lettered > 0 {
                return Err(format!(
                    "{}: idem's consumer settled {stats:?} of {n} messages",
                    case.label()
                ));
            }
            Ok(report.cleanup.map(|cleanup| cleanup.deleted))
        }
        Running::Hand(hand) => {
            let HandRunning {
                connection,
                channel,
                reader,
                counts,
            } = *hand;
            reader.abort();
            let _ = reader.await;
            let _ = channel.close(200, "round done".into()).await;
            let _ = connection.close(200, "round done".into()).await;
            let distinct = n - n / 10;
            let processed = counts.processed.load(Ordering::Relaxed);
            let mismatches = counts.mismatches.load(Ordering::Relaxed);
            if case.hand.is_some() && (processed, mismatches) != (distinct, 0) {
                return Err(format!(
                    "{}: the hand-written side processed {processed} fresh orders of \
                     {distinct}, {mismatches} mismatches",
                    case.label()
                ));
            }
            Ok(None)
        }
    }
}

/// Refreshes PostgreSQL's statistics of the case's tables, as autovacuum does in production:
/// a table created empty is otherwise planned as empty, and statements on many keys
/// (`message_key IN (...)`, on both sides) scan every key of the consumer instead of looking
/// each up, a cost that grows with the table.
async fn analyze(db: &TestDb, case: &Case) {
    if db.backend == Backend::Postgres {
        for table in &case.tables {
            db.exec(&format!("ANALYZE {table}")).await;
        }
    }
}

/// Checks that every distinct order of the rounds so far was charged once and that the queue
/// and its dead-letter queue are empty.
pub(crate) async fn check(
    suite: &Suite,
    db: &TestDb,
    case: &Case,
    distinct_per_round: u64,
) -> Result<(), String> {
    let label = case.label();
    let (ready, dead) = (
        suite.broker.depth(case.queue()).await,
        suite.broker.depth(case.topology.dead_letter_queue()).await,
    );
    if (ready, dead) != (0, 0) {
        return Err(format!(
            "{label}: {ready} messages left in the queue, {dead} dead-lettered"
        ));
    }
    if case.mode == Mode::Raw {
        return Ok(());
    }
    let expected = distinct_per_round * (case.rounds_run + 1);
    let charges = db.count(&case.charges, "1=1").await as u64;
    let sql = format!("SELECT COUNT(DISTINCT order_id) FROM {}", case.charges);
    let row = db
        .db
        .query_one_raw(Statement::from_string(db.db.get_database_backend(), sql))
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no count")?;
    let distinct = row.try_get_by_index::<i64>(0).map_err(|e| e.to_string())? as u64;
    if (charges, distinct) != (expected, expected) {
        return Err(format!(
            "{label}: {charges} charges of {distinct} distinct orders, instead of one for each \
             of the {expected} distinct orders published"
        ));
    }
    Ok(())
}

/// Starts idem's consumer, bound.
async fn start_idem(bound: ConsumerBuilder) -> Running {
    Running::Idem(bound.start().await.expect("start"))
}

pub(crate) async fn start_consumer(suite: &Suite, db: &TestDb, case: &Case) -> Running {
    let url = suite.probe.url();
    match case.mode {
        Mode::IdemOutbox => {
            let downstream = case.downstream.as_ref().expect("a downstream queue");
            let handler = ChargeAndStage {
                charge: charge(&case.charges),
                events: downstream.queue.clone(),
            };
            start_idem(
                idem_consumer(url, case).bind_with(Binding::new(case.topology.clone(), handler)),
            )
            .await
        }
        Mode::IdemBatchSlice => {
            let binding = Binding::new(case.topology.clone(), charge(&case.charges))
                .slices(suite.batch_size(case.prefetch), suite.max_wait());
            let binding = suite.in_flight(binding);
            start_idem(idem_consumer(url, case).bind_with(binding)).await
        }
        Mode::IdemPerMessage
        | Mode::IdemBatch
        | Mode::IdemBatchChecked
        | Mode::IdemBatchDuringCleanup => {
            let handler = charge(&case.charges);
            let binding = if case.mode == Mode::IdemPerMessage {
                Binding::new(case.topology.clone(), handler)
            } else {
                let checks = if case.mode == Mode::IdemBatchChecked {
                    BatchChecks::EachMessage
                } else {
                    BatchChecks::default()
                };
                let binding = idem_batch_binding(
                    case.topology.clone(),
                    handler,
                    suite.batch_size(case.prefetch),
                    suite.max_wait(),
                )
                .batch_checks(checks);
                suite.in_flight(binding)
            };
            start_idem(idem_consumer(url, case).bind_with(binding)).await
        }
        Mode::Raw
        | Mode::HandPerMessage
        | Mode::HandBatch
        | Mode::HandBatchMultirow
        | Mode::HandOutbox => {
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
                Mode::HandPerMessage | Mode::HandOutbox => tokio::spawn(hand_per_message(
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
                    HandBatching {
                        size: suite.batch_size(case.prefetch),
                        max_wait: suite.max_wait(),
                        business: if case.mode == Mode::HandBatchMultirow {
                            BusinessInserts::MultiRow
                        } else {
                            BusinessInserts::PerMessage
                        },
                    },
                    Arc::clone(&counts),
                )),
            };
            Running::Hand(Box::new(HandRunning {
                connection,
                channel,
                reader,
                counts,
            }))
        }
    }
}

/// idem's consumer for `case`, through the probe at `url`, with nothing bound yet.
fn idem_consumer(url: &str, case: &Case) -> ConsumerBuilder {
    let inbox = case.inbox.clone().expect("an inbox");
    let builder = Consumer::builder(url, inbox)
        .connection_name("bench")
        .shutdown_timeout(Duration::from_secs(10))
        .prefetch(case.prefetch);
    // The default concurrency is left to the consumer.
    if case.concurrency == DEFAULT_CONCURRENCY {
        builder
    } else {
        builder.max_in_flight(case.concurrency)
    }
}

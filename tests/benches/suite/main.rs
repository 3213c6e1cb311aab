//! The benchmark suite of issues 9 and 10: consumers side by side on RabbitMQ with PostgreSQL,
//! MariaDB and SQLite, at prefetch 100 and 500, 10 % duplicates, in one run.
//!
//! Run: `cargo bench -p idem-tests --bench suite [-- --json --messages 10000 --rounds 3
//! --backends postgres,mysql,sqlite --prefetch 100,500 --modes raw,hand-batch,...]`, with
//! PostgreSQL, MariaDB and RabbitMQ up (see README); `-- --help` lists every option. `--soak N`
//! runs idem's batch consumer on N messages instead, printing its resident memory every 100 k;
//! `--outbox-drain` runs the outbox relay's drains instead (see `drain.rs`), `--table-sizes
//! 1000000,5000000` the consumers and the relay on tables grown to each size (see `sizes.rs`).
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
//!   the business insert of each fresh message, multi-row completion, one commit), then one
//!   `multiple` ack. The business work is one statement per message, as idem's handler, a
//!   function of one message, runs it: the same work, which issue 9 compares idem with;
//! - `hand-batch-multirow`: the same with one multi-row business insert for the whole batch, a
//!   different program (its work written for the batch at once), shown for reference;
//! - `idem-batch`: idem's consumer with the binding in batch mode
//!   (`Binding::batch(size, max_wait)`, its handlers checked once before the commit, the
//!   default), its `max_in_flight` left at the default: each batch is one handler in flight, so
//!   at prefetch 500 several batches may overlap, where `hand-batch` runs one at a time;
//! - `idem-batch-checked`: the same with each handler checked (`BatchChecks::EachMessage`);
//! - `idem-batch-slice`: the same with a slice handler, the fresh orders in one multi-row
//!   insert, measured against `hand-batch-multirow`;
//! - `idem-batch-during-cleanup`: the same while the consumer's cleaner deletes expired records
//!   from the inbox table: a million of them when each round starts (made by the database before
//!   the round), deleted with idem's defaults (batches of 1000, 10 ms apart) from the consumer's
//!   start; the rows it deleted during each round are shown;
//! - `idem-outbox` (issue 10): idem's consumer at its default concurrency, its handler
//!   ([`ChargeAndStage`](idem_tests::bench::ChargeAndStage)) charging the order as `Charge` does
//!   and staging one event per fresh order through idem's outbox in the same transaction; idem's
//!   `Relay` publishes the events to a downstream queue the case declares;
//! - `hand-outbox` (issue 10): the same written by hand, at the same concurrency:
//!   `hand-per-message` plus one insert into a hand-written outbox table in its transaction, and
//!   a hand-written relay loop (unsent rows in order, `FOR UPDATE SKIP LOCKED` on PostgreSQL and
//!   MariaDB; all published, then their confirms awaited; the confirmed marked sent; commit).
//!   Both relays take batches of 100, connect to the broker directly, and start with the
//!   consumer.
//!
//! Each round of a mode publishes its messages first (persistent, message id = order id; a fifth
//! as many for the per-message modes, which are 10 to 30 times slower), then times from the
//! consumer's start (connections included) to its last settlement. Modes take turns round by round, so
//! that slow drift of the machine hits them alike (each round starting one mode further on, so
//! that what runs before a mode varies too); round 0 warms up and is not counted; figures
//! are medians. `idem-batch-during-cleanup` runs last, after every other mode on every backend:
//! the million records it inserts and deletes keep a database busy (purge, vacuum) for a while. Latencies are measured at the wire by a probe in front of the broker, from a
//! delivery reaching the consumer to the frame that settles it leaving it, the same way for every
//! mode. After each round the suite checks one charge per distinct order, an empty queue and an
//! empty dead-letter queue, and stops loudly if not.
//!
//! Each round also counts the statements (and round trips, where the database counts them) its
//! consumer ran, from its start to its stop, and the suite prints them per message beside the
//! hand-written modes (`statements.rs`, `statement_report.rs`). Then each backend runs the same
//! work through idem and the hand-written code, one call each, and prints their statements side
//! by side (`statement_probe.rs`): exact counts that do not depend on how a consumer cut its
//! batches.
//!
//! The outbox modes are timed end to end: a round lasts until the last settlement and until
//! every distinct order's event is in the downstream queue (its depth, polled every
//! millisecond), whichever comes later; their msg/s is the round's messages over that time, and
//! their latencies are still delivery to ack. Their check also takes the events out of the
//! downstream queue, one per distinct order of the round (none missing, no copy), and finds no
//! unsent outbox row.

mod args;
mod case;
mod drain;
mod feeder;
mod hand;
mod outbox;
mod report;
mod sizes;
mod soak;
mod statement_probe;
mod statement_report;
mod statements;

use std::time::Duration;

use clap::Parser;
use idem_rabbitmq::{Binding, QueueTopology};
use idem_tests::bench::probe::Probe;
use idem_tests::bench::{Charge, orders};
use idem_tests::rabbit::amqp_url;
use idem_tests::{TestBroker, TestDb};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use args::{Args, Mode};
use case::{Case, Expired, run_round};
use feeder::Feeder;
use report::{header, print_targets};
use statement_probe::{print_probes, probe};
use statement_report::print_statements;
use statements::StatementCounter;

/// idem-rabbitmq's default `max_in_flight` (`Consumer::builder`): the per-message modes also run
/// at this concurrency, with idem's consumer left at its default.
pub(crate) const DEFAULT_CONCURRENCY: usize = 16;
/// Connections per database pool: the consumer's default concurrency and the cleaner's two,
/// with room to spare.
pub(crate) const POOL: u32 = 24;

/// idem's binding in batch mode: batches of `size` deliveries, or those that arrived within
/// `max_wait` of the first. Each batch counts as one handler in flight, so the consumer's default
/// `max_in_flight` lets several overlap when the prefetch holds more than one.
pub(crate) fn idem_batch_binding(
    topology: QueueTopology,
    handler: Charge,
    size: usize,
    max_wait: Duration,
) -> Binding<Charge> {
    Binding::new(topology, handler).batch(size, max_wait)
}

pub(crate) fn charge(table: &str) -> Charge {
    Charge {
        table: table.to_owned(),
        key_from_message_id: true,
    }
}

/// What the whole run shares.
pub(crate) struct Suite {
    pub(crate) args: Args,
    pub(crate) probe: Probe,
    pub(crate) broker: TestBroker,
    feeder: Feeder,
    /// Numbers the published rounds, so that every order id of the run is new.
    published: u64,
}

impl Suite {
    pub(crate) fn messages(&self, mode: Mode) -> u64 {
        if mode.per_message() {
            self.args
                .per_message_messages
                .unwrap_or((self.args.messages / 5).max(10))
        } else {
            self.args.messages
        }
    }

    pub(crate) fn max_wait(&self) -> Duration {
        Duration::from_millis(self.args.max_wait_ms)
    }

    /// `binding` with `--batches-in-flight`, if given.
    pub(crate) fn in_flight<H: idem_runtime::Handler>(&self, binding: Binding<H>) -> Binding<H> {
        match self.args.batches_in_flight {
            Some(batches) => binding.batches_in_flight(batches as usize),
            None => binding,
        }
    }

    pub(crate) fn batch_size(&self, prefetch: u16) -> usize {
        (self.args.batch_size as usize).min(usize::from(prefetch))
    }

    /// Publishes `n` new orders (10 % duplicates) to `queue`; returns the round number their
    /// ids carry (see [`orders`]).
    pub(crate) async fn publish(&mut self, queue: &str, n: u64) -> u64 {
        self.published += 1;
        let orders = orders(n as usize, self.published as usize);
        self.feeder.publish(queue, &orders).await;
        self.published
    }
}

/// The cases of one backend and prefetch, in the order they take turns.
pub(crate) fn plan(modes: &[Mode]) -> Vec<(Mode, usize)> {
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
    for mode in [Mode::HandBatch, Mode::HandBatchMultirow] {
        if wanted(mode) {
            plan.push((mode, 1));
        }
    }
    for mode in [
        Mode::IdemBatch,
        Mode::IdemBatchChecked,
        Mode::IdemBatchSlice,
        Mode::IdemBatchDuringCleanup,
        Mode::HandOutbox,
        Mode::IdemOutbox,
    ] {
        if wanted(mode) {
            plan.push((mode, DEFAULT_CONCURRENCY));
        }
    }
    plan
}

/// Runs the warm-up round and the counted rounds of `cases`, which take turns round by round,
/// in the same order, each round starting one case further on; the cleaner's cases top their
/// expired records up first.
pub(crate) async fn run_rounds(
    suite: &mut Suite,
    (db, counter): (&TestDb, &StatementCounter),
    cases: &mut [Case],
    mut expired: Option<&mut Expired>,
) {
    let Some(first) = cases.first() else { return };
    let (backend, prefetch) = (first.backend, first.prefetch);
    for round in 0..=suite.args.rounds {
        eprintln!(
            "{} prefetch {prefetch}: round {round}{}{}",
            backend.name(),
            if round == 0 { " (warm-up)" } else { "" },
            if expired.is_some() {
                ", during cleanup"
            } else {
                ""
            },
        );
        // Each round starts one mode further on: a mode slowed by what ran before it (the
        // purge after a fast writer, say) is not always the same one.
        let start = round as usize % cases.len();
        cases.rotate_left(start);
        for case in cases.iter_mut().filter(|case| case.failure.is_none()) {
            if let Some(expired) = expired.as_deref_mut() {
                expired.top_up(db, suite.args.expired_rows).await;
            }
            match run_round(suite, (db, counter), case).await {
                Ok(figures) => {
                    case.rounds_run += 1;
                    if round > 0 {
                        case.record(figures);
                    }
                }
                Err(failure) => {
                    eprintln!("FAILED: {failure}");
                    case.failure = Some(failure);
                }
            }
        }
        cases.rotate_right(start);
    }
}

async fn run_suite(suite: &mut Suite) {
    let prefetches = suite.args.prefetch.clone();
    let plan = plan(&suite.args.modes);
    let (cleanup, quiet): (Vec<_>, Vec<_>) = plan
        .into_iter()
        .partition(|(mode, _)| *mode == Mode::IdemBatchDuringCleanup);
    let mut dbs = Vec::new();
    for backend in suite.args.backends.clone() {
        let mut db = TestDb::connect_with_pool(backend.backend(), POOL).await;
        let counter = StatementCounter::attach(&mut db).await;
        dbs.push((backend, db, counter));
    }
    // Every mode but the cleaner's first, on every backend: the million expired records it
    // inserts and deletes leave the databases busy (purge, vacuum) for a while after.
    let mut done: Vec<Vec<Case>> = Vec::new();
    for (backend, db, counter) in &dbs {
        for &prefetch in &prefetches {
            let mut cases = Vec::new();
            for &(mode, concurrency) in &quiet {
                let case = Case::create(suite, db, *backend, prefetch, mode, concurrency, None);
                cases.push(case.await);
            }
            run_rounds(suite, (db, counter), &mut cases, None).await;
            done.push(cases);
        }
    }
    let mut groups = done.iter_mut();
    for (backend, db, counter) in &dbs {
        let mut expired = if cleanup.is_empty() {
            None
        } else {
            Some(Expired::create(db).await)
        };
        for &prefetch in &prefetches {
            let group = groups.next().expect("a group per backend and prefetch");
            let mut cases = Vec::new();
            for &(mode, concurrency) in &cleanup {
                let case = Case::create(
                    suite,
                    db,
                    *backend,
                    prefetch,
                    mode,
                    concurrency,
                    expired.as_ref(),
                );
                cases.push(case.await);
            }
            run_rounds(suite, (db, counter), &mut cases, expired.as_mut()).await;
            group.extend(cases);
        }
    }
    let mut probes = Vec::new();
    for (backend, db, counter) in &dbs {
        probes.push((*backend, counter.source(), probe(db, counter).await));
    }
    if !suite.args.json {
        println!("{}", header());
    }
    for case in done.iter().flatten() {
        if suite.args.json {
            println!("{}", case.json(suite));
        } else {
            println!("{}", case.row(suite));
        }
    }
    print_targets(suite, &done);
    let sources = dbs
        .iter()
        .map(|(backend, _, counter)| (*backend, counter.source()));
    print_statements(suite, &done, &sources.collect::<Vec<_>>());
    print_probes(suite, &probes);
    let failures: Vec<&String> = done
        .iter()
        .flatten()
        .filter_map(|case| case.failure.as_ref())
        .collect();
    if !failures.is_empty() {
        eprintln!("\n{} case(s) FAILED:", failures.len());
        for failure in failures {
            eprintln!("  {failure}");
        }
        std::process::exit(1);
    }
}

#[tokio::main]
async fn main() {
    // A benchmark runs for as long as its arguments ask: no test's time limit.
    idem_tests::watchdog::off();
    let args = Args::parse();
    let printed = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(tracing_subscriber::filter::LevelFilter::WARN);
    tracing_subscriber::registry()
        .with(printed)
        .with(statements::statement_log())
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
        Some(n) => soak::soak(&mut suite, n).await,
        None if suite.args.outbox_drain => drain::outbox_drain(&suite).await,
        None if !suite.args.table_sizes.is_empty() => {
            let sizes = suite.args.table_sizes.clone();
            sizes::table_sizes(&mut suite, &sizes).await;
        }
        None => run_suite(&mut suite).await,
    }
}

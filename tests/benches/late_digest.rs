//! What the late-duplicate digest costs and how often it is wrong, at its full size: an inbox
//! whose consumer's digest holds `--deleted` deleted keys (a million by default: its eight
//! filters full) against an inbox whose table had as many rows of another consumer deleted.
//! Per-message processing of orders through each, in rounds that alternate which goes first;
//! then `--fresh` more fresh orders through the first in batches; and the share of the fresh
//! orders the digest took for late duplicates (false positives), beside the share the inbox
//! expected from its filters' fill.
//!
//! Run: `cargo bench -p idem-tests --bench late_digest [-- --messages 3000 --rounds 5
//! --deleted 1000000 --fresh 1000000 --backend sqlite|postgres|mysql]`. Prints messages per
//! second with and without the digest, their ratio (medians, ratio per round), and the false
//! positives.

use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use idem_runtime::admin::InboxAdmin;
use idem_runtime::transport::BatchChecks;
use idem_runtime::transport::BatchItem;
use idem_runtime::transport::Processing;
use idem_runtime::{Inbox, MessageKey, Metadata, RetentionPolicy};
use idem_tests::bench::seed::insert_expired_of;
use idem_tests::bench::{Charge, Order, Rates, Tables, orders};
use idem_tests::{Backend, TestDb};

/// The late-duplicate digest's cost and false positives at its full size.
#[derive(Debug, Parser)]
struct Args {
    /// Orders per round and side.
    #[arg(long, default_value_t = 3000)]
    messages: usize,
    /// Rounds counted (a first, uncounted, warms up).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Keys deleted into the digest: 1 000 000 fills its eight filters.
    #[arg(long, default_value_t = 1_000_000)]
    deleted: u64,
    /// Fresh orders checked against the full digest after the rounds, in batches of 500.
    #[arg(long, default_value_t = 1_000_000)]
    fresh: usize,
    /// One backend only.
    #[arg(long, value_enum)]
    backend: Option<Which>,
    /// What `cargo bench` passes.
    #[arg(long, hide = true)]
    bench: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Which {
    Sqlite,
    Postgres,
    Mysql,
}

/// What one backend's run measured.
struct Figures {
    with: f64,
    without: f64,
    ratio: f64,
    fresh: usize,
    false_positives: u64,
    expected: f64,
}

/// An inbox on `table` whose cleaner deletes in large batches without resting.
async fn inbox_on(db: &TestDb, table: &str) -> Inbox {
    let policy = RetentionPolicy::default()
        .with_batch_size(10_000)
        .with_max_busy_percent(100)
        .with_pause_between_batches(Duration::ZERO);
    Inbox::builder(db.db.clone())
        .table(table)
        .retention(policy)
        .build()
        .await
        .unwrap()
}

/// Deletes `count` expired records of `consumer` from `inbox`'s table through its cleaner,
/// which writes their digest.
async fn digest_of_deleted(db: &TestDb, inbox: &Inbox, consumer: &str, count: u64) {
    insert_expired_of(db, inbox.table().as_str(), consumer, 0, count).await;
    let report = inbox.cleaner().run_once().await.unwrap();
    assert_eq!(report.deleted, count);
}

async fn bench(backend: Backend, args: &Args) -> Figures {
    let db = TestDb::connect_with_pool(backend, 4).await;
    let tables = Tables::create(&db).await;
    let with = inbox_on(&db, &db.table("inbox")).await;
    let without = inbox_on(&db, &db.table("inbox")).await;
    digest_of_deleted(&db, &with, "bench", args.deleted).await;
    digest_of_deleted(&db, &without, "other", args.deleted).await;
    let handler = Charge {
        table: tables.charges.clone(),
        key_from_message_id: false,
    };
    let meta = Metadata::default();

    let mut rates = Rates::default();
    // Round 0 warms caches and is not counted.
    for round in 0..=args.rounds {
        let mut timed = [0.0; 2];
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for slot in order {
            let inbox = [&with, &without][slot];
            let start = Instant::now();
            for order in orders(args.messages, round * 2 + slot) {
                inbox.process(&handler, order, &meta).await.unwrap();
            }
            timed[slot] = args.messages as f64 / start.elapsed().as_secs_f64();
        }
        if round > 0 {
            rates.push(timed[0], timed[1]);
        }
    }
    let fresh_orders = (0..args.fresh).map(|i| Order {
        id: format!("fresh-{i}"),
        amount: i as i64,
    });
    let fresh_orders: Vec<Order> = fresh_orders.collect();
    for batch in fresh_orders.chunks(500) {
        let items = (batch.iter())
            .map(|order| BatchItem {
                key: MessageKey::new(order.id.as_str()),
                message: order.clone(),
                metadata: Metadata::default(),
            })
            .collect();
        for result in with
            .process_batch_with(&handler, items, BatchChecks::BeforeCommit)
            .await
        {
            result.unwrap();
        }
    }
    // Every fresh order the digest took for a late one is a false positive.
    with.cleaner().run_once().await.unwrap();
    let all = with.duplicate_summaries().await.unwrap();
    let summary = all
        .iter()
        .find(|s| s.consumer == "bench")
        .expect("a summary");
    let fresh = (args.rounds + 1) * args.messages * 9 / 10 + args.fresh;
    let (with, without, ratio) = rates.summary();
    Figures {
        with,
        without,
        ratio,
        fresh,
        false_positives: summary.late,
        expected: summary.expected_false_alarms,
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // A benchmark runs for as long as its arguments ask: no test's time limit.
    idem_tests::watchdog::off();
    let args = Args::parse();
    let backends = match args.backend {
        Some(Which::Sqlite) => vec![Backend::Sqlite],
        Some(Which::Postgres) => vec![Backend::Postgres],
        Some(Which::Mysql) => vec![Backend::MySql],
        None => vec![Backend::Sqlite, Backend::Postgres, Backend::MySql],
    };
    for backend in backends {
        let started = Instant::now();
        let f = bench(backend, &args).await;
        println!(
            "{backend:?}: with a digest of {} deleted keys {:.0} msg/s, without {:.0} msg/s, \
             ratio {:.3}; false positives {} of {} fresh orders ({:.2e}), expected {:.2} \
             ({:.2e} a fresh order) from the filters' fill ({} messages x {} rounds, 10% \
             duplicates, then {} fresh in batches of 500; medians, ratio per round; {:.0} s)",
            args.deleted,
            f.with,
            f.without,
            f.ratio,
            f.false_positives,
            f.fresh,
            f.false_positives as f64 / f.fresh as f64,
            f.expected,
            f.expected / f.fresh as f64,
            args.messages,
            args.rounds,
            args.fresh,
            started.elapsed().as_secs_f64(),
        );
    }
}

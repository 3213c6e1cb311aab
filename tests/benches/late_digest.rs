//! What the late-duplicate digest costs and how often it is wrong: per-message processing of
//! fresh orders through an inbox whose consumer has a digest of `--deleted` deleted keys (five
//! full Bloom filters of 50 000 keys at 250 000) against the same through an inbox whose
//! table had as many rows deleted, of another consumer, in rounds that alternate which goes
//! first; and the share of those fresh orders the digest took for late
//! duplicates (false positives).
//!
//! Run: `cargo bench -p idem-tests --bench late_digest [-- --messages 3000 --rounds 5
//! --deleted 250000 --backend sqlite|postgres|mysql]`. Prints messages per second with and
//! without the digest, their ratio (medians, ratio per round), and the false-positive rate.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use idem_runtime::{Inbox, Metadata};
use idem_tests::bench::{Charge, Rates, Tables, orders};
use idem_tests::{Backend, TestDb};

struct Args {
    messages: usize,
    rounds: usize,
    deleted: usize,
    backends: Vec<Backend>,
}

fn parse_args() -> Args {
    let mut args = Args {
        messages: 3000,
        rounds: 5,
        deleted: 250_000,
        backends: vec![Backend::Sqlite, Backend::Postgres, Backend::MySql],
    };
    let mut it = std::env::args().skip(1);
    let number = |it: &mut std::iter::Skip<std::env::Args>, default| {
        it.next().and_then(|v| v.parse().ok()).unwrap_or(default)
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--messages" => args.messages = number(&mut it, 3000),
            "--rounds" => args.rounds = number(&mut it, 5),
            "--deleted" => args.deleted = number(&mut it, 250_000),
            "--backend" => {
                args.backends = match it.next().as_deref() {
                    Some("sqlite") => vec![Backend::Sqlite],
                    Some("postgres") => vec![Backend::Postgres],
                    Some("mysql") => vec![Backend::MySql],
                    _ => args.backends,
                }
            }
            _ => {} // `cargo bench` passes `--bench`
        }
    }
    args
}

/// Inserts `count` expired records of `consumer` into `table`, then lets the cleaner delete
/// them, which writes their digest.
async fn digest_of_deleted(db: &TestDb, inbox: &Inbox, table: &str, consumer: &str, count: usize) {
    let expired = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        - 60_000;
    let keys: Vec<usize> = (0..count).collect();
    for chunk in keys.chunks(1000) {
        let rows: Vec<String> = chunk
            .iter()
            .map(|i| {
                format!(
                    "('{consumer}', 'deleted-{i}', 'completed', 1, 0, {expired}, {expired}, \
                     {expired}, {expired})"
                )
            })
            .collect();
        db.exec(&format!(
            "INSERT INTO {table} (consumer, message_key, status, attempts, claim_token, \
             created_at, claimed_at, completed_at, expires_at) VALUES {}",
            rows.join(", ")
        ))
        .await;
    }
    let report = inbox.cleaner().run_once().await.unwrap();
    assert_eq!(report.deleted as usize, count);
}

async fn bench(backend: Backend, args: &Args) -> (f64, f64, f64, f64) {
    let db = TestDb::connect_with_pool(backend, 4).await;
    let tables = Tables::create(&db).await;
    let (with_table, without_table) = (db.table("inbox"), db.table("inbox"));
    let open = |table: String| {
        let db = db.db.clone();
        async move { Inbox::builder(db).table(table).build().await.unwrap() }
    };
    let with = open(with_table.clone()).await;
    let without = open(without_table.clone()).await;
    digest_of_deleted(&db, &with, &with_table, "bench", args.deleted).await;
    digest_of_deleted(&db, &without, &without_table, "other", args.deleted).await;
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
    // Every fresh order the digest took for a late one is a false positive.
    with.cleaner().run_once().await.unwrap();
    let late: u64 = (with.duplicate_summaries().await.unwrap().iter())
        .map(|summary| summary.late)
        .sum();
    let fresh = (args.rounds + 1) * args.messages * 9 / 10;
    let (with, without, ratio) = rates.summary();
    (with, without, ratio, late as f64 / fresh as f64)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = parse_args();
    for &backend in &args.backends {
        let (with, without, ratio, false_positives) = bench(backend, &args).await;
        println!(
            "{backend:?}: with a digest of {} deleted keys {with:.0} msg/s, without {without:.0} \
             msg/s, ratio {ratio:.3}; false positives {:.4} % of fresh orders ({} messages x {} \
             rounds, 10% duplicates; medians, ratio per round)",
            args.deleted,
            false_positives * 100.0,
            args.messages,
            args.rounds
        );
    }
}

//! Per-message transactional processing: idem's `Inbox` against the same work written by hand
//! (one transaction: a conditional insert into an inbox table, then one business insert), with
//! 10 % duplicates, on SQLite and PostgreSQL.
//!
//! With `--mode natural`, what skipping the bookkeeping saves: the charge as a naturally
//! idempotent handler (`Mode::Natural`, an upsert keyed on the order id, no inbox record)
//! against the inbox's transactional handler.
//!
//! Run: `cargo bench -p idem-tests --bench inbox [-- --messages 3000 --rounds 5
//! --backend sqlite|postgres|mysql --mode inbox|natural --json]` (PostgreSQL at
//! `IDEM_TEST_POSTGRES_URL`, default `127.0.0.1:5432/test`). Prints messages per second for both
//! and their ratio; `--json` prints one JSON object per backend instead.

use std::time::Instant;

use idem_runtime::{Inbox, Metadata};
use idem_tests::bench::{
    Charge, Rates, Tables, Upsert, create_keyed_charges, hand_written, orders,
};
use idem_tests::{Backend, TestDb};

struct Args {
    messages: usize,
    rounds: usize,
    backends: Vec<Backend>,
    json: bool,
    /// Sets the natural handler against the inbox rather than the hand-written inbox.
    natural: bool,
}

fn parse_args() -> Args {
    let mut args = Args {
        messages: 3000,
        rounds: 5,
        backends: vec![Backend::Sqlite, Backend::Postgres],
        json: false,
        natural: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--json" => args.json = true,
            "--mode" => args.natural = it.next().as_deref() == Some("natural"),
            "--messages" => args.messages = it.next().and_then(|v| v.parse().ok()).unwrap_or(3000),
            "--rounds" => args.rounds = it.next().and_then(|v| v.parse().ok()).unwrap_or(5),
            "--backend" => {
                args.backends = match it.next().as_deref() {
                    Some("sqlite") => vec![Backend::Sqlite],
                    Some("postgres") => vec![Backend::Postgres],
                    Some("mysql") => vec![Backend::MySql],
                    _ => vec![Backend::Sqlite, Backend::Postgres],
                }
            }
            _ => {} // `cargo bench` passes `--bench`
        }
    }
    args
}

async fn bench(backend: Backend, args: &Args) -> (f64, f64, f64) {
    let db = TestDb::connect_with_pool(backend, 4).await;
    let tables = Tables::create(&db).await;
    let inbox = Inbox::builder(db.db.clone())
        .table(db.table("inbox"))
        .build()
        .await
        .unwrap();
    let handler = Charge {
        table: tables.charges.clone(),
        key_from_message_id: false,
    };
    let natural = match args.natural {
        true => Some(Upsert {
            table: create_keyed_charges(&db).await,
        }),
        false => None,
    };
    let meta = Metadata::default();

    let mut rates = Rates::default();
    // Round 0 warms caches and is not counted; idem and hand-written alternate.
    for round in 0..=args.rounds {
        let start = Instant::now();
        for order in orders(args.messages, round * 2) {
            inbox.process(&handler, order, &meta).await.unwrap();
        }
        let idem = args.messages as f64 / start.elapsed().as_secs_f64();

        let start = Instant::now();
        for order in orders(args.messages, round * 2 + 1) {
            match &natural {
                Some(natural) => {
                    inbox.process(natural, order, &meta).await.unwrap();
                }
                None => {
                    let key = order.id.clone();
                    hand_written(&db.db, &tables, &key, order).await.unwrap();
                }
            }
        }
        let other = args.messages as f64 / start.elapsed().as_secs_f64();
        if round > 0 {
            rates.push(idem, other);
        }
    }
    let runs = (args.rounds + 1) * 2;
    match &natural {
        Some(natural) => {
            let distinct = (args.messages - args.messages / 10) * (args.rounds + 1);
            let upserted = db.count(&natural.table, "1=1").await as usize;
            assert_eq!(upserted, distinct, "one row per distinct order");
            tables
                .assert_one_charge_per_order(&db, args.messages, runs / 2)
                .await;
        }
        None => {
            tables
                .assert_one_charge_per_order(&db, args.messages, runs)
                .await
        }
    }
    rates.summary()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // A benchmark runs for as long as its arguments ask: no test's time limit.
    idem_tests::watchdog::off();
    let args = parse_args();
    for &backend in &args.backends {
        let (idem, other, ratio) = bench(backend, &args).await;
        if args.natural {
            let (natural, extra) = (other, 1.0 / ratio - 1.0);
            if args.json {
                println!(
                    "{{\"bench\":\"inbox-natural\",\"backend\":\"{backend:?}\",\"messages\":{},\"rounds\":{},\"duplicates\":0.1,\"inbox_msgs_per_s\":{idem:.1},\"natural_msgs_per_s\":{natural:.1},\"inbox_over_natural\":{ratio:.3}}}",
                    args.messages, args.rounds
                );
            } else {
                println!(
                    "{backend:?}: natural (no bookkeeping) {natural:.0} msg/s, inbox {idem:.0} \
                     msg/s: inbox/natural {ratio:.3}, the bookkeeping adds {:.0} % to the time \
                     per message ({} messages x {} rounds, 10% duplicates)",
                    extra * 100.0,
                    args.messages,
                    args.rounds
                );
            }
            continue;
        }
        let hand = other;
        if args.json {
            println!(
                "{{\"bench\":\"inbox-transactional\",\"backend\":\"{backend:?}\",\"messages\":{},\"rounds\":{},\"duplicates\":0.1,\"idem_msgs_per_s\":{idem:.1},\"hand_written_msgs_per_s\":{hand:.1},\"ratio\":{ratio:.3}}}",
                args.messages, args.rounds
            );
        } else {
            println!(
                "{backend:?}: idem {idem:.0} msg/s, hand-written {hand:.0} msg/s, ratio {ratio:.3} \
                 ({} messages x {} rounds, 10% duplicates; medians, ratio per round)",
                args.messages, args.rounds
            );
        }
    }
}

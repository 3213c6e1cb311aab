//! Per-message transactional processing: idem's `Inbox` against the same work written by hand
//! (one transaction: a conditional insert into an inbox table, then one business insert), with
//! 10 % duplicates, on SQLite and PostgreSQL.
//!
//! Run: `cargo bench -p idem-tests --bench inbox [-- --messages 5000 --rounds 3 --backend all --json]`
//! (PostgreSQL at `IDEM_TEST_POSTGRES_URL`, default `127.0.0.1:5432/test`). Prints messages per
//! second for both and their ratio; `--json` prints one JSON object per backend instead.

use std::time::Instant;

use idem_runtime::{
    Context, Fingerprint, FingerprintError, Handler, Inbox, KeyError, MessageKey, Metadata,
};
use idem_tests::db::statement;
use idem_tests::{Backend, TestDb};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, TransactionTrait};
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
struct Order {
    id: String,
    amount: i64,
}

/// The business work: one insert through the inbox's transaction.
struct Charge {
    table: String,
}

impl Handler for Charge {
    type Message = Order;
    type Output = ();
    type Error = DbErr;

    fn consumer(&self) -> &str {
        "bench"
    }
    fn key(&self, order: &Order, _: &Metadata) -> Result<MessageKey, KeyError> {
        MessageKey::new(order.id.as_str())
    }
    fn fingerprint(&self, order: &Order) -> Result<Option<Fingerprint>, FingerprintError> {
        Fingerprint::of(order).map(Some)
    }
    async fn handle(&self, cx: &Context<'_>, order: Order) -> Result<(), DbErr> {
        let tx = cx.transaction().expect("transactional");
        insert_charge(tx, &self.table, order).await
    }
}

async fn insert_charge(
    conn: &impl ConnectionTrait,
    table: &str,
    order: Order,
) -> Result<(), DbErr> {
    let sql = format!("INSERT INTO {table} (order_id, amount) VALUES (?, ?)");
    conn.execute_raw(statement(
        conn.get_database_backend(),
        &sql,
        vec![order.id.into(), order.amount.into()],
    ))
    .await?;
    Ok(())
}

/// The same work by hand: conditional insert of the key, business insert if it was new.
async fn hand_written(
    db: &sea_orm::DatabaseConnection,
    inbox_table: &str,
    table: &str,
    order: Order,
) -> Result<(), DbErr> {
    let tx = if db.get_database_backend() == DbBackend::Sqlite {
        db.begin_with_options(sea_orm::TransactionOptions {
            sqlite_transaction_mode: Some(sea_orm::SqliteTransactionMode::Immediate),
            ..Default::default()
        })
        .await?
    } else {
        db.begin().await?
    };
    let claim = if db.get_database_backend() == DbBackend::MySql {
        format!("INSERT IGNORE INTO {inbox_table} (consumer, message_key) VALUES (?, ?)")
    } else {
        format!(
            "INSERT INTO {inbox_table} (consumer, message_key) VALUES (?, ?) ON CONFLICT DO NOTHING"
        )
    };
    let fresh = tx
        .execute_raw(statement(
            tx.get_database_backend(),
            &claim,
            vec!["bench".into(), order.id.clone().into()],
        ))
        .await?
        .rows_affected()
        == 1;
    if fresh {
        insert_charge(&tx, table, order).await?;
    }
    tx.commit().await
}

/// `n` orders, every tenth a copy of an earlier one.
fn orders(n: usize, round: usize) -> Vec<Order> {
    (0..n)
        .map(|i| {
            let id = if i % 10 == 9 { i - 5 } else { i };
            Order {
                id: format!("r{round}-o{id}"),
                amount: id as i64,
            }
        })
        .collect()
}

struct Args {
    messages: usize,
    rounds: usize,
    backends: Vec<Backend>,
    json: bool,
}

fn parse_args() -> Args {
    let mut args = Args {
        messages: 3000,
        rounds: 3,
        backends: vec![Backend::Sqlite, Backend::Postgres],
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--json" => args.json = true,
            "--messages" => args.messages = it.next().and_then(|v| v.parse().ok()).unwrap_or(3000),
            "--rounds" => args.rounds = it.next().and_then(|v| v.parse().ok()).unwrap_or(3),
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

fn median(mut values: Vec<f64>) -> f64 {
    // Rounds alternate idem and hand-written, so a ratio per round cancels slow drift of the
    // machine; the median of those is reported.
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

async fn bench(backend: Backend, args: &Args) -> (f64, f64, f64) {
    let db = TestDb::connect_with_pool(backend, 4).await;
    let charges = db.table("charges");
    let hand_inbox = db.table("hand_inbox");
    db.exec(&format!(
        "CREATE TABLE {charges} (order_id VARCHAR(255) NOT NULL, amount BIGINT NOT NULL)"
    ))
    .await;
    db.exec(&format!(
        "CREATE TABLE {hand_inbox} (consumer VARCHAR(128) NOT NULL, message_key VARCHAR(255) NOT NULL, PRIMARY KEY (consumer, message_key))"
    ))
    .await;
    let inbox = Inbox::builder(db.db.clone())
        .table(db.table("inbox"))
        .build()
        .await
        .unwrap();
    let handler = Charge {
        table: charges.clone(),
    };
    let meta = Metadata::default();

    let (mut idem, mut hand) = (Vec::new(), Vec::new());
    // Round 0 warms caches and is not counted; idem and hand-written alternate.
    for round in 0..=args.rounds {
        let start = Instant::now();
        for order in orders(args.messages, round * 2) {
            inbox.process(&handler, order, &meta).await.unwrap();
        }
        let idem_rate = args.messages as f64 / start.elapsed().as_secs_f64();

        let start = Instant::now();
        for order in orders(args.messages, round * 2 + 1) {
            hand_written(&db.db, &hand_inbox, &charges, order)
                .await
                .unwrap();
        }
        let hand_rate = args.messages as f64 / start.elapsed().as_secs_f64();
        if round > 0 {
            idem.push(idem_rate);
            hand.push(hand_rate);
        }
    }
    let expected = (args.messages - args.messages / 10) * (args.rounds + 1) * 2;
    assert_eq!(
        db.count(&charges, "1=1").await as usize,
        expected,
        "one charge per distinct order"
    );
    let ratios = idem.iter().zip(&hand).map(|(i, h)| i / h).collect();
    (median(idem), median(hand), median(ratios))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = parse_args();
    for &backend in &args.backends {
        let (idem, hand, ratio) = bench(backend, &args).await;
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

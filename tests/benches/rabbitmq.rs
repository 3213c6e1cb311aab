//! Per-message throughput through RabbitMQ and PostgreSQL with 10 % duplicates: idem's consumer
//! against the same work written by hand with lapin and SQL (per delivery: one transaction with a
//! conditional insert into an inbox table and, if the key was new, one business insert; then the
//! ack), at the same prefetch and concurrency.
//!
//! Run: `cargo bench -p idem-tests --bench rabbitmq [-- --messages 3000 --rounds 3
//! --concurrency 1 --prefetch 50 --json]`. Messages are published (durable queue, persistent
//! messages) before each timed run; the time is from starting the consumer to the last
//! settlement.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use idem_rabbitmq::lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use idem_rabbitmq::lapin::types::FieldTable;
use idem_rabbitmq::lapin::{Connection, ConnectionProperties};
use idem_rabbitmq::{Consumer, PublishOptions, QueueTopology};
use idem_runtime::Inbox;
use idem_tests::bench::{Charge, Order, Rates, Tables, hand_written, orders};
use idem_tests::rabbit::amqp_url;
use idem_tests::{Backend, TestBroker, TestDb};
use sea_orm::DatabaseConnection;
use tokio::sync::Semaphore;

/// The hand-written side of one delivery: decode, the same transaction as the inbox bench's
/// hand-written side keyed on the message id, then the ack.
async fn hand_written_delivery(
    db: &DatabaseConnection,
    tables: &Tables,
    delivery: idem_rabbitmq::lapin::message::Delivery,
) {
    let order: Order = serde_json::from_slice(&delivery.data).expect("json");
    let id = delivery
        .properties
        .message_id()
        .as_ref()
        .expect("message id")
        .to_string();
    hand_written(db, tables, &id, order).await.unwrap();
    delivery
        .acker
        .ack(BasicAckOptions::default())
        .await
        .unwrap();
}

struct Args {
    messages: usize,
    rounds: usize,
    concurrency: usize,
    prefetch: u16,
    json: bool,
}

fn parse_args() -> Args {
    let mut args = Args {
        messages: 3000,
        rounds: 3,
        concurrency: 1,
        prefetch: 50,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().and_then(|v| v.parse::<usize>().ok());
        match arg.as_str() {
            "--json" => args.json = true,
            "--messages" => args.messages = value().unwrap_or(args.messages),
            "--rounds" => args.rounds = value().unwrap_or(args.rounds),
            "--concurrency" => args.concurrency = value().unwrap_or(args.concurrency).max(1),
            "--prefetch" => {
                args.prefetch = value().map_or(args.prefetch, |v| v.clamp(1, 65535) as u16)
            }
            _ => {} // `cargo bench` passes `--bench`
        }
    }
    args
}

/// Publishes the orders of `round` to `queue`, each with its order id as message id.
async fn publish(broker: &TestBroker, queue: &str, n: usize, round: usize) {
    for order in orders(n, round) {
        broker
            .send(
                queue,
                &order,
                PublishOptions::default().message_id(order.id.as_str()),
            )
            .await;
    }
}

async fn wait_until(settled: impl Fn() -> u64, target: u64) {
    while settled() < target {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn idem_round(inbox: &Inbox, topology: &QueueTopology, tables: &Tables, args: &Args) -> f64 {
    let start = Instant::now();
    let consumer = Consumer::builder(amqp_url(), inbox.clone())
        .prefetch(args.prefetch)
        .max_in_flight(args.concurrency)
        .bind(topology.clone(), charge(tables))
        .start()
        .await
        .unwrap();
    wait_until(
        || {
            let stats = consumer.stats();
            stats.acked + stats.duplicates
        },
        args.messages as u64,
    )
    .await;
    let rate = args.messages as f64 / start.elapsed().as_secs_f64();
    consumer.shutdown().await;
    rate
}

async fn hand_round(db: &DatabaseConnection, queue: &str, tables: &Tables, args: &Args) -> f64 {
    let start = Instant::now();
    let connection = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .basic_qos(args.prefetch, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let permits = Arc::new(Semaphore::new(args.concurrency));
    for _ in 0..args.messages {
        let permit = Arc::clone(&permits).acquire_owned().await.unwrap();
        let delivery = consumer.next().await.unwrap().unwrap();
        let (db, tables, done) = (db.clone(), tables.clone(), done.clone());
        tokio::spawn(async move {
            hand_written_delivery(&db, &tables, delivery).await;
            done.fetch_add(1, Ordering::SeqCst);
            drop(permit);
        });
    }
    wait_until(|| done.load(Ordering::SeqCst), args.messages as u64).await;
    let rate = args.messages as f64 / start.elapsed().as_secs_f64();
    let _ = connection.close(200, "done".into()).await;
    rate
}

fn charge(tables: &Tables) -> Charge {
    Charge {
        table: tables.charges.clone(),
        key_from_message_id: true,
    }
}

#[tokio::main]
async fn main() {
    let args = parse_args();
    let broker = TestBroker::connect().await;
    let db = TestDb::connect_with_pool(Backend::Postgres, 8).await;
    let tables = Tables::create(&db).await;
    let inbox = Inbox::builder(db.db.clone())
        .table(db.table("inbox"))
        .build()
        .await
        .unwrap();
    let idem_topology = broker.classic_queue();
    let hand_topology = broker.classic_queue();
    // Declares both queues.
    Consumer::builder(amqp_url(), inbox.clone())
        .bind(idem_topology.clone(), charge(&tables))
        .bind(hand_topology.clone(), charge(&tables))
        .start()
        .await
        .unwrap()
        .shutdown()
        .await;

    let mut rates = Rates::default();
    // Round 0 warms up and is not counted.
    for round in 0..=args.rounds {
        publish(&broker, idem_topology.queue(), args.messages, round * 2).await;
        let idem = idem_round(&inbox, &idem_topology, &tables, &args).await;
        publish(&broker, hand_topology.queue(), args.messages, round * 2 + 1).await;
        let hand = hand_round(&db.db, hand_topology.queue(), &tables, &args).await;
        if round > 0 {
            rates.push(idem, hand);
        }
    }
    tables
        .assert_one_charge_per_order(&db, args.messages, (args.rounds + 1) * 2)
        .await;
    let (idem, hand, ratio) = rates.summary();
    if args.json {
        println!(
            "{{\"bench\":\"rabbitmq-postgres\",\"messages\":{},\"rounds\":{},\"concurrency\":{},\"prefetch\":{},\"duplicates\":0.1,\"idem_msgs_per_s\":{idem:.1},\"hand_written_msgs_per_s\":{hand:.1},\"ratio\":{ratio:.3}}}",
            args.messages, args.rounds, args.concurrency, args.prefetch
        );
    } else {
        println!(
            "RabbitMQ + PostgreSQL: idem {idem:.0} msg/s, hand-written {hand:.0} msg/s, ratio {ratio:.3} \
             ({} messages x {} rounds, concurrency {}, prefetch {}, 10% duplicates; medians, ratio per round)",
            args.messages, args.rounds, args.concurrency, args.prefetch
        );
    }
}

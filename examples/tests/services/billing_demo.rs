//! The billing service as a process, against the real RabbitMQ: the README's main job on SQLite
//! and PostgreSQL (its report counting its own run only, beside events it did not publish),
//! then a crash (SIGKILL) in the middle of a burst and a restart.
//!
//! One test function: every scenario uses the service's queue `billing.orders`, so they run one
//! after the other. Run: `cargo test -p idem-examples` with RabbitMQ and PostgreSQL up.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Billing, invoices};
use idem_examples::billing::{EVENTS_EXCHANGE, INVOICE_ISSUED};
use idem_examples::notifications::{self, InvoiceIssued};
use idem_examples::orders::{self, OrderPlaced};
use idem_rabbitmq::{PublishOptions, Publisher};
use idem_tests::{TestBroker, rabbit};
use sea_orm::{ConnectionTrait, Database};

fn run_demo(database_url: &str, orders: usize, options: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_billing"))
        .args(["--demo", &orders.to_string()])
        .args(options)
        .env("DATABASE_URL", database_url)
        .env("RUST_LOG", "warn")
        .output()
        .expect("the billing binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "billing --demo failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// How many rows of `table` belong to orders whose id starts with `prefix`.
async fn rows(db: &sea_orm::DatabaseConnection, table: &str, prefix: &str) -> i64 {
    let sql = format!("SELECT COUNT(*) FROM {table} WHERE order_id LIKE '{prefix}%'");
    let statement = sea_orm::Statement::from_string(db.get_database_backend(), sql);
    let row = db.query_one_raw(statement).await.unwrap().unwrap();
    row.try_get_by_index(0).unwrap()
}

/// The run's id, from the summary's first line: `billing demo <run>: ...`.
fn run_id(summary: &str) -> String {
    summary
        .strip_prefix("billing demo ")
        .and_then(|rest| rest.split(':').next())
        .unwrap_or_else(|| panic!("no run id in {summary}"))
        .to_owned()
}

/// Declares the example's queues and empties them, so that they hold only this test's messages.
/// The notifications queue is deleted (an earlier version declared it without its bound, which
/// the demo would refuse), and deleted again when `broker` is dropped.
async fn empty_the_queues(broker: &TestBroker) {
    let topology = idem_examples::billing::topology();
    broker.declare(&topology).await;
    for queue in [topology.queue(), topology.dead_letter_queue()] {
        broker.purge(queue).await;
    }
    let stale = TestBroker::connect().await;
    forget_notifications(&stale);
    drop(stale);
    forget_notifications(broker);
}

/// Has `broker` delete the notifications queue, its dead-letter queue and exchange when it is
/// dropped.
fn forget_notifications(broker: &TestBroker) {
    broker.track(notifications::topology());
}

/// Publishes `count` `InvoiceIssued` events to billing's events exchange, as billing processes
/// running without the notifications service leave them in its queue.
async fn events_of_other_runs(broker: &TestBroker, count: usize) {
    for i in 0..count {
        let event = InvoiceIssued {
            order_id: format!("other{}-{i:05}", std::process::id()),
            customer: "c".into(),
            amount_cents: 100,
        };
        broker
            .publisher
            .publish(
                EVENTS_EXCHANGE,
                INVOICE_ISSUED,
                &event,
                PublishOptions::default(),
            )
            .await
            .unwrap();
    }
}

fn figure(summary: &str, label: &str) -> u64 {
    summary
        .lines()
        .find(|line| line.trim_start().starts_with(label))
        .and_then(|line| {
            line[line.find(label).unwrap() + label.len()..]
                .split_whitespace()
                .next()
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {label:?} in {summary}"))
}

/// `url` with the user's password set to `password` (percent-encoded as given).
fn with_password(url: &str, password: &str) -> String {
    let (scheme, rest) = url.split_at(url.find("://").expect("a URL") + 3);
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (user, host) = match rest[..authority_end].rfind('@') {
        Some(at) => (rest[..at].split(':').next().unwrap(), &rest[at + 1..]),
        None => ("postgres", rest),
    };
    format!("{scheme}{user}:{password}@{host}")
}

/// The service logs the database it uses, never the password: here one with every reserved
/// character, percent-encoded (PostgreSQL trusts local connections, so any password connects).
fn database_is_logged_without_its_password(postgres: &str) {
    let secret = "s3cr%2F%23%3F%40%25et";
    let billing = Billing::spawn(&[("DATABASE_URL", &with_password(postgres, secret))]);
    let logged = billing.wait_consuming(Duration::from_secs(60));
    billing.terminate();
    for part in ["s3cr", "et@", "%2F", "/#?@%"] {
        assert!(!logged.contains(part), "{logged}");
    }
    assert!(logged.contains(":***@"), "{logged}");
}

/// Kills the service with SIGKILL in the middle of a burst, restarts it, and checks that every
/// order is charged exactly once: no loss, no double charge.
async fn crash_and_restart(database_url: &str) {
    // The burst waits on the queue (the demo runs declared it) before the service starts, so
    // the crash lands in its middle however fast the machine consumes.
    let db = Database::connect(database_url).await.unwrap();
    let publisher = Publisher::connect(idem_examples::amqp_url()).await.unwrap();
    // Its events go to an exchange of its own: billing alone, its events are for no one here.
    let events = format!("crash{}.events", std::process::id());
    let broker = TestBroker::connect().await;
    broker.track_exchange(&events);
    let run = format!("crash{}", std::process::id());
    let prefix = format!("{run}-");
    let count = 1000;
    for i in 0..count {
        let order = OrderPlaced {
            order_id: format!("{run}-{i:05}"),
            customer: "c".into(),
            amount_cents: 100 + i,
        };
        // Every fifth order twice, as a producer retry.
        for _ in 0..(1 + usize::from(i % 5 == 0)) {
            orders::publish(&publisher, &order).await.unwrap();
        }
    }
    publisher.close().await;

    let env = [
        ("DATABASE_URL", database_url),
        ("BILLING_EVENTS_EXCHANGE", events.as_str()),
    ];
    let first = Billing::spawn(&env);
    first.wait_consuming(Duration::from_secs(60));
    let deadline = Instant::now() + Duration::from_secs(60);
    while invoices(&db, &prefix).await.0 < 20 {
        assert!(
            Instant::now() < deadline,
            "no order charged before the crash"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    first.kill();
    let charged_at_crash = invoices(&db, &prefix).await.0;
    eprintln!("charged at the crash: {charged_at_crash} of {count}");

    let second = Billing::spawn(&env);
    second.wait_consuming(Duration::from_secs(60));
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (rows, distinct) = invoices(&db, &prefix).await;
        assert_eq!(rows, distinct, "an order was charged twice");
        if rows == count {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {rows} of {count} orders charged after the restart"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        charged_at_crash < count,
        "the crash came too late to test anything"
    );

    // SIGTERM: a graceful stop with a clean exit.
    second.terminate();
    assert_eq!(invoices(&db, &prefix).await, (count, count));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn billing_service_charges_each_order_once_through_demo_crash_and_restart() {
    let path = std::env::temp_dir().join(format!("idem-demo-{}.db", std::process::id()));
    let sqlite = format!("sqlite://{}?mode=rwc", path.display());
    let postgres = std::env::var("IDEM_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let broker = TestBroker::connect().await;
    empty_the_queues(&broker).await;
    database_is_logged_without_its_password(&postgres);
    // Events that billing processes published while no notifications service ran wait in its
    // queue: the demo's notifications service takes them too, and its report leaves them out.
    let url = idem_rabbitmq::AmqpUrl::new(rabbit::amqp_url());
    notifications::declare(&url, notifications::QUEUE, EVENTS_EXCHANGE)
        .await
        .unwrap();
    events_of_other_runs(&broker, 50).await;
    let mut runs = Vec::new();
    // The inbox on both databases, then the invoice as the marker (entity mode).
    let variants = [
        (sqlite.as_str(), "inbox"),
        (postgres.as_str(), "inbox"),
        (sqlite.as_str(), "entity"),
    ];
    for (url, keys) in variants {
        let summary = run_demo(url, 40, &["--keys", keys]);
        // 40 orders, one invalid; every tenth published twice; one id reused. Messages an
        // earlier, interrupted run left on the queue can only add to the next two figures.
        assert_eq!(figure(&summary, "invoices written"), 39, "{summary}");
        assert!(figure(&summary, "duplicates skipped") >= 4, "{summary}");
        assert!(figure(&summary, "dead-lettered") >= 2, "{summary}");
        // Each invoice announced through the outbox and notified once with its own key; the
        // other runs' events are not counted.
        assert_eq!(figure(&summary, "events published"), 39, "{summary}");
        assert_eq!(figure(&summary, "notified"), 39, "{summary}");
        assert!(
            summary.contains("(provider calls 39, distinct idempotency keys 39)"),
            "{summary}"
        );
        assert_eq!(figure(&summary, "lost"), 0, "{summary}");
        let run = run_id(&summary);
        if keys == "entity" {
            // The invoices are the markers: keyed by their orders, nothing in `invoices`.
            let db = Database::connect(url).await.unwrap();
            let prefix = format!("{run}-");
            assert_eq!(rows(&db, idem_examples::invoice::TABLE, &prefix).await, 39);
            assert_eq!(rows(&db, "invoices", &prefix).await, 0);
        }
        runs.push(run);
    }
    // The queue the notifications service declared is bounded.
    let queues = rabbit::rabbitmqctl(&["list_queues", "name", "arguments"]).await;
    let declared = queues
        .lines()
        .find(|line| line.starts_with(&format!("{}\t", notifications::QUEUE)))
        .unwrap_or_else(|| panic!("no {} in {queues}", notifications::QUEUE));
    assert!(
        declared.contains(&format!("\"x-max-length\",{}", notifications::MAX_LENGTH)),
        "{declared}"
    );
    // Each run's invalid order and reused order id are in the dead-letter queue, with reasons.
    let dead_letter_queue = idem_examples::billing::topology()
        .dead_letter_queue()
        .to_owned();
    let letters = common::drain_dead_letters(&broker, &dead_letter_queue).await;
    for run in &runs {
        let mine: Vec<_> = letters
            .iter()
            .filter(|(id, _)| id.starts_with(&format!("{run}-")))
            .cloned()
            .collect();
        let expected = vec![
            (format!("{run}-00000"), "fingerprint-mismatch".to_owned()),
            (format!("{run}-00007"), "handler-permanent-error".to_owned()),
        ];
        assert_eq!(mine, expected, "dead letters of run {run}");
    }
    crash_and_restart(&sqlite).await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

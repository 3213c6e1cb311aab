//! The orders service over HTTP (`orders --http ADDR --demo N --json`) as a process, against the
//! real RabbitMQ and a billing process it starts: clients that give up on their first request
//! and then retry three at a time leave each order placed, published, invoiced and notified
//! once, on SQLite and on PostgreSQL beside a MariaDB billing.
//!
//! Run: `cargo test -p idem-examples --test services orders_http::` with RabbitMQ, PostgreSQL and MariaDB up.

use std::process::Command;

use idem_examples::{billing, notifications};
use idem_tests::{TestBroker, unique};
use serde_json::Value;

const ORDERS: u64 = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_order_placed_over_http_with_retries_goes_through_once() {
    let broker = TestBroker::connect().await;
    let dir = std::env::temp_dir();
    let files = [dir.join(unique("orders")), dir.join(unique("billing"))];
    let sqlite = |file: &std::path::PathBuf| format!("sqlite://{}?mode=rwc", file.display());
    let variants = [
        (sqlite(&files[0]), sqlite(&files[1])),
        (
            idem_tests::Backend::Postgres.url(""),
            idem_tests::Backend::MySql.url(""),
        ),
    ];
    for (orders_db, billing_db) in variants {
        let report = run_demo(&broker, &orders_db, &billing_db);
        let count = |field: &str| {
            report[field]
                .as_u64()
                .unwrap_or_else(|| panic!("{field} in {report}"))
        };
        for field in [
            "orders_placed",
            "events_published",
            "invoices",
            "notified",
            "notification_calls",
        ] {
            assert_eq!(count(field), ORDERS, "{field} with {orders_db}: {report}");
        }
        let answers = &report["answers"];
        let answered = |field: &str| answers[field].as_u64().unwrap();
        assert_eq!(answered("wrong_body"), 0, "{report}");
        // The first request's client gives up at once, which an answer as quick as the request
        // can beat: that request then got its 201 too.
        let given_up = answered("gave_up");
        assert!(given_up <= ORDERS, "{report}");
        assert!(answered("created") <= ORDERS, "{report}");
        assert_eq!(
            answered("created") + answered("replayed"),
            ORDERS * 3 + (ORDERS - given_up),
            "each of the three retrying copies, and each first request not given up, ends with \
             one 201: {report}"
        );
    }
    for file in files {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
        }
    }
}

/// Runs the demo on its own exchange and queues, and returns its JSON report.
fn run_demo(broker: &TestBroker, orders_db: &str, billing_db: &str) -> Value {
    let exchange = unique("orders_http");
    let queue = unique("billing_http");
    let events = unique("billing_events");
    let notified = unique("notifications_http");
    broker.track(billing::topology_on(&queue, &exchange));
    broker.track(notifications::topology_on(&notified));
    broker.track_exchange(&exchange);
    broker.track_exchange(&events);
    let output = Command::new(env!("CARGO_BIN_EXE_orders"))
        .args([
            "--http",
            "127.0.0.1:0",
            "--demo",
            &ORDERS.to_string(),
            "--json",
        ])
        .env("ORDERS_DATABASE_URL", orders_db)
        .env("DATABASE_URL", billing_db)
        .env("ORDERS_EXCHANGE", &exchange)
        .env("BILLING_QUEUE", &queue)
        .env("BILLING_EVENTS_EXCHANGE", &events)
        .env("NOTIFICATIONS_QUEUE", &notified)
        .env("RUST_LOG", "warn")
        .output()
        .expect("the orders binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "orders --http --demo failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|error| panic!("{error}: {stdout}"))
}

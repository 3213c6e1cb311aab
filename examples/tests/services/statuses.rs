//! The statuses example's naturally idempotent handler (`mode = natural`): order-status
//! events applied with a version check, out of order and twice each, end in the newest state
//! with no bookkeeping, on each backend; on RabbitMQ it keeps the delivery policy and its
//! dead-letter reasons; the `statuses` binary ends in every order's newest status.
//!
//! Run: `cargo test -p idem-examples --test services statuses::` with PostgreSQL, MariaDB and RabbitMQ up
//! (see README).

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use idem_examples::statuses::{StatusChanged, Statuses, shuffled_events};
use idem_rabbitmq::PublishOptions;
use idem_runtime::transport::Settle;
use idem_runtime::{Inbox, Metadata, Outcome};
use idem_tests::rabbit::with_id;
use idem_tests::{Backend, Fixture, TestDb, on_each_backend};

on_each_backend!(out_of_order_states_end_in_the_newest);

const WAIT: Duration = Duration::from_secs(30);

async fn statuses(db: &TestDb) -> Arc<Statuses> {
    let statuses = Statuses {
        table: db.table("statuses"),
    };
    statuses.create_table(&db.db).await.unwrap();
    Arc::new(statuses)
}

async fn out_of_order_states_end_in_the_newest(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let inbox = Inbox::builder(db.db.clone())
        .table(db.table("inbox"))
        .build()
        .await
        .unwrap();
    let statuses = statuses(&db).await;
    let events = shuffled_events("o-", 20);
    let lanes = 8;
    let tasks: Vec<_> = (0..lanes)
        .map(|lane| {
            let (inbox, handler) = (inbox.clone(), statuses.apply_handler());
            let mine: Vec<_> = events.iter().skip(lane).step_by(lanes).cloned().collect();
            tokio::spawn(async move {
                let mut processed = 0;
                let metadata = Metadata::default();
                for event in mine {
                    loop {
                        match inbox.process(&handler, event.clone(), &metadata).await {
                            Ok(Outcome::Processed(())) => break processed += 1,
                            Ok(Outcome::Duplicate(())) => panic!("no bookkeeping, no duplicate"),
                            // A busy SQLite file or a deadlock: delivered again.
                            Err(error) if error.settle() == Settle::Requeue => {}
                            Err(error) => panic!("{error}"),
                        }
                    }
                }
                processed
            })
        })
        .collect();
    let mut processed = 0;
    for task in tasks {
        processed += task.await.unwrap();
    }
    assert_eq!(processed, events.len(), "every copy runs");
    let table = &statuses.table;
    assert_eq!(
        db.count(table, "status = 'delivered' AND version = 5")
            .await,
        20
    );
    assert_eq!(db.count(table, "1=1").await, 20);
    assert_eq!(
        db.count(&inbox.table().to_string(), "1=1").await,
        0,
        "no records"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_natural_handler_keeps_the_delivery_policy_on_rabbitmq() {
    let t = Fixture::new().await;
    let statuses = statuses(&t.db).await;
    let consumer = t.start(statuses.apply_handler()).await;
    let events = shuffled_events("o-", 10);
    for event in &events {
        t.send(event, PublishOptions::default()).await;
    }
    let unknown = StatusChanged {
        order_id: "o-0".to_owned(),
        status: "lost in space".to_owned(),
        version: 9,
    };
    t.send(&unknown, PublishOptions::default()).await;
    t.send_bytes(b"{not json", with_id("m-bad")).await;
    t.broker
        .eventually("every event settled", WAIT, || async {
            let stats = consumer.stats();
            stats.acked as usize == events.len() && stats.dead_lettered == 2
        })
        .await;
    let reasons = t.dead_letter_reasons().await;
    assert_eq!(reasons, ["handler-permanent-error", "undecodable"]);
    let table = &statuses.table;
    assert_eq!(
        t.db.count(table, "status = 'delivered' AND version = 5")
            .await,
        10
    );
    assert_eq!(t.db.count(table, "1=1").await, 10);
    assert_eq!(t.depth().await, 0);
    consumer.shutdown().await;
}

#[test]
fn the_statuses_example_ends_in_every_orders_newest_status() {
    let path = std::env::temp_dir().join(format!("idem-statuses-{}.db", std::process::id()));
    let output = Command::new(env!("CARGO_BIN_EXE_statuses"))
        .args(["30", "--json"])
        .env(
            "DATABASE_URL",
            format!("sqlite://{}?mode=rwc", path.display()),
        )
        .env("RUST_LOG", "warn")
        .output()
        .expect("the statuses binary runs");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "statuses failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["orders"], 30);
    assert_eq!(report["events_published"], 300, "five statuses, each twice");
    assert_eq!(report["orders_at_newest"], 30, "{report}");
    assert_eq!(report["orders_stored"], 30, "{report}");
    assert_eq!(
        report["duplicates"], 0,
        "no bookkeeping, no duplicates: {report}"
    );
}

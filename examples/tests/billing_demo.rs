//! The README's main job, run as a newcomer would: the billing demo against the real RabbitMQ
//! and a fresh SQLite file, then PostgreSQL.
//!
//! Run: `cargo test -p idem-examples` with RabbitMQ and PostgreSQL up (see README).

use std::process::Command;

fn run_demo(database_url: &str, orders: usize) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_billing"))
        .args(["--demo", &orders.to_string()])
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

#[test]
fn demo_charges_each_valid_order_once_on_sqlite_and_postgres() {
    let path = std::env::temp_dir().join(format!("idem-demo-{}.db", std::process::id()));
    let sqlite = format!("sqlite://{}?mode=rwc", path.display());
    let postgres = std::env::var("IDEM_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    for url in [sqlite.as_str(), postgres.as_str()] {
        let summary = run_demo(url, 40);
        // 40 orders, one invalid; every tenth published twice; one id reused. Messages an
        // earlier, interrupted run left on the queue can only add to the last two figures.
        assert_eq!(figure(&summary, "invoices written"), 39, "{summary}");
        assert!(figure(&summary, "duplicates skipped") >= 4, "{summary}");
        assert!(figure(&summary, "dead-lettered") >= 2, "{summary}");
    }
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

//! The billing service as a process, against the real RabbitMQ: the README's main job on SQLite
//! and PostgreSQL, then a crash (SIGKILL) in the middle of a burst and a restart.
//!
//! One test function: every scenario uses the service's queue `billing.orders`, so they run one
//! after the other. Run: `cargo test -p idem-examples` with RabbitMQ and PostgreSQL up.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem_examples::orders::{self, OrderPlaced};
use idem_rabbitmq::Publisher;
use idem_tests::TestBroker;
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, Statement};

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

/// The run's id, from the summary's first line: `billing demo <run>: ...`.
fn run_id(summary: &str) -> String {
    summary
        .strip_prefix("billing demo ")
        .and_then(|rest| rest.split(':').next())
        .unwrap_or_else(|| panic!("no run id in {summary}"))
        .to_owned()
}

/// Declares the example's queues and empties them, so that they hold only this test's messages.
async fn empty_the_queues(broker: &TestBroker) {
    let topology = idem_examples::billing::topology();
    broker.declare(&topology).await;
    for queue in [topology.queue(), topology.dead_letter_queue()] {
        broker.purge(queue).await;
    }
}

/// Empties the example's dead-letter queue; returns the `(message id, x-idem-reason)` of what
/// it held, sorted.
async fn drain_dead_letters(broker: &TestBroker) -> Vec<(String, String)> {
    let queue = idem_examples::billing::topology()
        .dead_letter_queue()
        .to_owned();
    let mut letters: Vec<_> = broker
        .drain(&queue)
        .await
        .into_iter()
        .map(|letter| {
            let reason = letter.reason().to_owned();
            (letter.message_id.unwrap_or_default(), reason)
        })
        .collect();
    letters.sort();
    letters
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

/// Starts the service and returns once it consumes.
fn start_billing(database_url: &str) -> Child {
    start_billing_logging(database_url).0
}

/// Starts the service and returns once it consumes, with the line it logged then (which names
/// its database).
fn start_billing_logging(database_url: &str) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_billing"))
        .env("DATABASE_URL", database_url)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .spawn()
        .expect("the billing binary starts");
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let consuming = loop {
        let line = lines
            .next()
            .expect("billing exited before consuming")
            .unwrap();
        if line.contains("billing is consuming") {
            break line;
        }
    };
    // Keep reading, so that the service never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (child, consuming)
}

/// Stops the service with SIGTERM, gracefully: it must exit cleanly.
fn terminate(mut child: Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(child.wait().unwrap().success());
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
    let (child, logged) = start_billing_logging(&with_password(postgres, secret));
    terminate(child);
    for part in ["s3cr", "et@", "%2F", "/#?@%"] {
        assert!(!logged.contains(part), "{logged}");
    }
    assert!(logged.contains(":***@"), "{logged}");
}

async fn invoices(db: &DatabaseConnection, run: &str) -> (i64, i64) {
    let sql = format!(
        "SELECT COUNT(*), COUNT(DISTINCT order_id) FROM invoices WHERE order_id LIKE '{run}-%'"
    );
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await
        .unwrap()
        .unwrap();
    (
        row.try_get_by_index(0).unwrap(),
        row.try_get_by_index(1).unwrap(),
    )
}

/// Kills the service with SIGKILL in the middle of a burst, restarts it, and checks that every
/// order is charged exactly once: no loss, no double charge.
async fn crash_and_restart(database_url: &str) {
    // The burst waits on the queue (the demo runs declared it) before the service starts, so
    // the crash lands in its middle however fast the machine consumes.
    let db = Database::connect(database_url).await.unwrap();
    let publisher = Publisher::connect(idem_examples::amqp_url()).await.unwrap();
    let run = format!("crash{}", std::process::id());
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

    let mut first = start_billing(database_url);
    let deadline = Instant::now() + Duration::from_secs(60);
    while invoices(&db, &run).await.0 < 20 {
        assert!(
            Instant::now() < deadline,
            "no order charged before the crash"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    first.kill().unwrap();
    first.wait().unwrap();
    let charged_at_crash = invoices(&db, &run).await.0;
    eprintln!("charged at the crash: {charged_at_crash} of {count}");

    let second = start_billing(database_url);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (rows, distinct) = invoices(&db, &run).await;
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
    terminate(second);
    assert_eq!(invoices(&db, &run).await, (count, count));
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
    let mut runs = Vec::new();
    for url in [sqlite.as_str(), postgres.as_str()] {
        let summary = run_demo(url, 40);
        // 40 orders, one invalid; every tenth published twice; one id reused. Messages an
        // earlier, interrupted run left on the queue can only add to the last two figures.
        assert_eq!(figure(&summary, "invoices written"), 39, "{summary}");
        assert!(figure(&summary, "duplicates skipped") >= 4, "{summary}");
        assert!(figure(&summary, "dead-lettered") >= 2, "{summary}");
        runs.push(run_id(&summary));
    }
    // Each run's invalid order and reused order id are in the dead-letter queue, with reasons.
    let letters = drain_dead_letters(&broker).await;
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

//! Replicas whose clocks disagree: a worker process whose clock runs two hours behind (a library
//! preloaded into it shifts its wall clock, see `idem_tests::skew`) claims a key with a lease; a worker with a true clock must still see the claim as
//! live. Leases are the database's clock, so no host's clock can shorten them.
//!
//! Run: `cargo test -p idem-tests --test database clocks::` with PostgreSQL and MariaDB up (a C compiler
//! builds the preloaded library). SQLite is left out: its clock is the clock of the process
//! that runs the statement, and one host owns a SQLite file.

use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_runtime::admin::InboxAdmin;
use idem_runtime::admin::Status;
use idem_runtime::{Error, Inbox, Metadata};
use idem_tests::{Backend, Msg, Recorder, TestDb, inbox_and_effects as setup, inbox_key};

const CHILD_URL: &str = "IDEM_CLOCK_CHILD_URL";
const CHILD_INBOX: &str = "IDEM_CLOCK_CHILD_INBOX";
const CHILD_EFFECTS: &str = "IDEM_CLOCK_CHILD_EFFECTS";
const CHILD_BACKEND: &str = "IDEM_CLOCK_CHILD_BACKEND";

/// How far behind the skewed worker's clock runs: far more than the lease.
const SKEW: Duration = Duration::from_secs(2 * 3600);
const LEASE: Duration = Duration::from_secs(20);

fn epoch_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_worker_whose_clock_is_behind_keeps_its_lease() {
    a_worker_whose_clock_is_behind_keeps_its_lease(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_a_worker_whose_clock_is_behind_keeps_its_lease() {
    a_worker_whose_clock_is_behind_keeps_its_lease(Backend::MySql).await
}

async fn a_worker_whose_clock_is_behind_keeps_its_lease(backend: Backend) {
    let (db, inbox, effects) = setup(backend).await;
    // Timers keep the true monotonic clock; only the wall clock is skewed.
    let child = idem_tests::skew::behind(std::env::current_exe().unwrap(), SKEW)
        .args([
            "--exact",
            &idem_tests::test_named(module_path!(), "skewed_worker"),
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_URL, backend.url(""))
        .env(CHILD_BACKEND, format!("{backend:?}"))
        .env(CHILD_INBOX, inbox.table().as_str())
        .env(CHILD_EFFECTS, &effects)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the skewed worker starts");

    // Wait for the skewed worker's claim.
    let key = inbox_key("clocks", "mail-1");
    let mut claimed = false;
    for _ in 0..300 {
        if let Some(record) = inbox.lookup(&key).await.unwrap() {
            assert_eq!(record.status, Status::InProgress);
            claimed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(claimed, "the skewed worker never claimed the key");

    // Its clock really is behind: it wrote what it read.
    let clock = db
        .count(
            &effects,
            &format!("body = 'clock' AND message_key < '{}'", epoch_secs() - 3600),
        )
        .await;
    assert_eq!(clock, 1, "the worker's clock was not skewed");

    // By the true clock the lease has run out long ago; by the database's it has not.
    let fresh = Recorder::new(&db, &effects, "clocks").two_phase(LEASE);
    let busy = inbox
        .process(&fresh, Msg::new("mail-1", "hello"), &Metadata::default())
        .await
        .unwrap_err();
    assert!(
        matches!(busy, Error::InProgressElsewhere { .. }),
        "{busy:?}"
    );

    let output = child.wait_with_output().await.unwrap();
    assert!(
        output.status.success(),
        "the skewed worker failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(db.count(&effects, "body = 'hello'").await, 1);
}

/// The worker whose clock is behind, started by the tests above with its clock skewed; it does
/// nothing when run on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a worker process started by the clock tests with a skewed clock"]
async fn skewed_worker() {
    let (Ok(url), Ok(table), Ok(effects), Ok(backend)) = (
        std::env::var(CHILD_URL),
        std::env::var(CHILD_INBOX),
        std::env::var(CHILD_EFFECTS),
        std::env::var(CHILD_BACKEND),
    ) else {
        return;
    };
    let backend = Backend::of_child(&backend);
    let db = TestDb::connect_url(backend, url, 4).await;
    db.exec(&format!(
        "INSERT INTO {effects} (consumer, message_key, body) VALUES ('clocks', '{}', 'clock')",
        epoch_secs()
    ))
    .await;
    let inbox = Inbox::builder(db.db.clone())
        .table(table)
        .create_table(false)
        .build()
        .await
        .unwrap();
    let handler = Recorder::new(&db, &effects, "clocks")
        .two_phase(LEASE)
        .slow(Duration::from_secs(4));
    let outcome = inbox
        .process(&handler, Msg::new("mail-1", "hello"), &Metadata::default())
        .await
        .unwrap();
    assert!(!outcome.is_duplicate());
}

//! A relay killed (SIGKILL) in the middle of a backlog of 20 000 messages (100 000 with
//! `IDEM_BACKLOG_RUNS=1000`), on PostgreSQL and MariaDB: the relay started after it publishes the rest; every message arrives, each id once
//! after deduplication by message id, and each run's messages in the order they were staged.
//! Copies of what the killed relay published but had not marked sent are allowed: the id is
//! what a consumer deduplicates by.
//!
//! The relay to kill runs in a child process: this test binary run again on
//! `killed_backlog_relay_child`.
//!
//! Run: `cargo test -p idem-tests --test outbox outbox_backlog::` with RabbitMQ, PostgreSQL and MariaDB up
//! (see README).

use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::time::Duration;

use idem_rabbitmq::Relay;
use idem_runtime::outbox::Outbox;
use idem_tests::backlog::{self, Backlog};
use idem_tests::rabbit::amqp_url;
use idem_tests::{Backend, Fixture, TestDb, on_each_backend, unique};
use tokio::process::Child;
use tokio::time::Instant;

on_each_backend!([postgres, mysql]: a_relay_killed_mid_backlog_loses_nothing_and_keeps_runs_in_order);

/// The routing key the test queue is bound with.
const ROUTED: &str = "routed";
/// The backlog: [`runs`] runs of [`PER_RUN`] messages, interleaved.
const PER_RUN: u64 = 100;

/// How many runs the backlog has: `IDEM_BACKLOG_RUNS`, 200 by default.
fn runs() -> u64 {
    std::env::var("IDEM_BACKLOG_RUNS").ok().map_or(200, |runs| {
        runs.parse().expect("IDEM_BACKLOG_RUNS is a number")
    })
}

/// How many messages the child's relay marks sent before it is killed: a fifth of the backlog,
/// which leaves it several seconds of work at the rates of a debug build (some 2 500 messages a
/// second on PostgreSQL, 600 on MariaDB, on two cores).
fn kill_after() -> i64 {
    (runs() * PER_RUN / 5) as i64
}
/// How long the child's relay may take to reach [`kill_after`].
const KILL_WAIT: Duration = Duration::from_secs(120);
/// How long the relay started after the kill may take to publish the rest.
const FINISH_WAIT: Duration = Duration::from_secs(300);
/// How often the outbox table is counted while waiting.
const COUNT_EVERY: Duration = Duration::from_millis(200);
/// How long the queue must stay quiet once empty for everything to have arrived.
const QUIET: Duration = Duration::from_secs(1);

/// The fixture's outbox table, as the backlog fills it and the relays empty it.
trait OutboxTable {
    /// The outbox table.
    fn table(&self) -> &str;
    /// How many of its messages are marked sent.
    async fn sent(&self) -> i64;
    /// How many are not.
    async fn unsent(&self) -> i64;
}

impl OutboxTable for Fixture {
    fn table(&self) -> &str {
        self.outbox().table().as_str()
    }

    async fn sent(&self) -> i64 {
        self.db.count(self.table(), "sent_at IS NOT NULL").await
    }

    async fn unsent(&self) -> i64 {
        self.db.count(self.table(), "sent_at IS NULL").await
    }
}

async fn a_relay_killed_mid_backlog_loses_nothing_and_keeps_runs_in_order(backend: Backend) {
    let started = Instant::now();
    // An outbox, and a queue bound to a fresh direct exchange with `ROUTED`.
    let f = Fixture::builder()
        .on(backend)
        .outbox()
        .routed(ROUTED)
        .build()
        .await;
    let backlog = Backlog {
        prefix: "b",
        exchange: f.exchange(),
        routing_key: ROUTED,
        runs: runs(),
        per_run: PER_RUN,
    };
    backlog.write(&f.db.db, f.table(), false).await;
    let total = backlog.len() as i64;
    assert_eq!(f.unsent().await, total, "the backlog is pending");

    let mut child = start_child_relay(&f).await;
    wait_for_kill_point(&f, &mut child).await;
    child.kill().await.expect("SIGKILL");
    let sent_at_kill = f.sent().await;
    assert!(
        sent_at_kill < total,
        "the child's relay had sent the whole backlog before it was killed: kill sooner than \
         {} messages",
        kill_after()
    );

    let relay = Relay::builder(amqp_url(), f.outbox().clone())
        .connection_name(unique("idem-backlog-relay"))
        .start()
        .await
        .expect("the relay starts");
    let finished = wait_until_all_sent(&f).await;
    let stats = relay.shutdown().await;

    let received = f.broker.consume_all(&f.queue, QUIET).await;
    let distinct = assert_each_arrived_in_order(&backlog, &received);
    println!(
        "{backend:?}: {sent_at_kill} of {total} sent when the child's relay was killed; the next \
         relay published {} in {finished:?} ({stats:?}); {} copies arrived for {distinct} ids; \
         {:?} in all",
        stats.published,
        received.len(),
        started.elapsed(),
    );
    assert_eq!(f.unsent().await, 0, "every message marked sent");
}

/// What the child process is told, through its environment.
const CHILD_URL: &str = "IDEM_BACKLOG_CHILD_URL";
const CHILD_BACKEND: &str = "IDEM_BACKLOG_CHILD_BACKEND";
const CHILD_TABLE: &str = "IDEM_BACKLOG_CHILD_TABLE";
/// How long the child's relay runs if nobody kills it: far longer than the test.
const CHILD_LIFETIME: Duration = Duration::from_secs(900);

/// Starts this test binary again on [`killed_backlog_relay_child`], a relay of the fixture's
/// outbox table; it is killed when the returned handle is dropped.
async fn start_child_relay(f: &Fixture) -> Child {
    tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &idem_tests::test_named(module_path!(), "killed_backlog_relay_child"),
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_URL, f.db.url())
        .env(CHILD_BACKEND, format!("{:?}", f.db.backend))
        .env(CHILD_TABLE, f.table())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the child process starts")
}

/// Waits until the child's relay marked [`kill_after`] messages sent; fails the test if the
/// child exits or takes longer than [`KILL_WAIT`].
async fn wait_for_kill_point(f: &Fixture, child: &mut Child) {
    let deadline = Instant::now() + KILL_WAIT;
    let kill_after = kill_after();
    loop {
        let sent = f.sent().await;
        if sent >= kill_after {
            return;
        }
        if let Some(status) = child.try_wait().expect("the child's status") {
            panic!("the child's relay exited ({status}) after {sent} messages sent");
        }
        assert!(
            Instant::now() < deadline,
            "the child's relay sent {sent} of {kill_after} messages within {KILL_WAIT:?}"
        );
        tokio::time::sleep(COUNT_EVERY).await;
    }
}

/// Waits until no message is left unsent, and returns how long it took; fails the test after
/// [`FINISH_WAIT`].
async fn wait_until_all_sent(f: &Fixture) -> Duration {
    let started = Instant::now();
    loop {
        let unsent = f.unsent().await;
        if unsent == 0 {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < FINISH_WAIT,
            "the relay left {unsent} messages unsent after {FINISH_WAIT:?}"
        );
        tokio::time::sleep(COUNT_EVERY).await;
    }
}

/// Checks `received` (id and body, in the order they arrived) against `backlog`, each id's
/// first arrival kept: every message arrived, no other did, each id with its own body, and each
/// run's messages in the run's order. Returns how many ids arrived.
fn assert_each_arrived_in_order(
    backlog: &Backlog<'_>,
    received: &[(Option<String>, Vec<u8>)],
) -> usize {
    let mut first = HashSet::new();
    let mut places: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut unexpected = Vec::new();
    for (id, body) in received {
        let id = id.as_deref().expect("a message id");
        let (run, place) = backlog::run_and_place(body);
        if run >= backlog.runs || place >= backlog.per_run || backlog.message_id(run, place) != id {
            unexpected.push(id.to_owned());
        } else if first.insert(id) {
            places.entry(run).or_default().push(place);
        }
    }
    assert!(
        unexpected.is_empty(),
        "{} messages that were never staged, or with another's body, arrived: {:?}",
        unexpected.len(),
        &unexpected[..unexpected.len().min(10)]
    );
    let missing = missing(backlog, &first);
    assert!(
        missing.is_empty(),
        "{} of {} messages never arrived ({} copies received), among them {:?}",
        missing.len(),
        backlog.len(),
        received.len(),
        &missing[..missing.len().min(10)]
    );
    assert_eq!(first.len() as u64, backlog.len(), "distinct ids");
    assert_runs_in_order(backlog, &places);
    first.len()
}

/// The ids of `backlog` not in `arrived`.
fn missing(backlog: &Backlog<'_>, arrived: &HashSet<&str>) -> Vec<String> {
    (0..backlog.runs)
        .flat_map(|run| (0..backlog.per_run).map(move |i| backlog.message_id(run, i)))
        .filter(|id| !arrived.contains(id.as_str()))
        .collect()
}

/// Fails unless each run's first arrivals (`places`, by run) are its places `0..per_run` in
/// order; names the runs that are not, with where each went wrong.
fn assert_runs_in_order(backlog: &Backlog<'_>, places: &HashMap<u64, Vec<u64>>) {
    let mut disordered: Vec<(u64, usize, &[u64])> = places
        .iter()
        .filter_map(|(run, arrived)| {
            let wrong = arrived.iter().zip(0..).position(|(&place, i)| place != i)?;
            let around = &arrived[wrong.saturating_sub(2)..(wrong + 3).min(arrived.len())];
            Some((*run, wrong, around))
        })
        .collect();
    disordered.sort();
    assert!(
        disordered.is_empty(),
        "{} of {} runs arrived out of order (run, first wrong arrival, places around it): {:?}",
        disordered.len(),
        backlog.runs,
        &disordered[..disordered.len().min(10)]
    );
}

/// The relay killed by the test above: a relay of the outbox table it is given, until it is
/// killed. It does nothing when run on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a process started, and killed, by the backlog test"]
async fn killed_backlog_relay_child() {
    let (Ok(url), Ok(backend), Ok(table)) = (
        std::env::var(CHILD_URL),
        std::env::var(CHILD_BACKEND),
        std::env::var(CHILD_TABLE),
    ) else {
        return;
    };
    let db = TestDb::connect_url(Backend::of_child(&backend), url, 4).await;
    let outbox = Outbox::builder(db.db.clone())
        .table(table)
        .create_table(false)
        .build()
        .await
        .expect("outbox builds");
    let _relay = Relay::builder(amqp_url(), outbox)
        .connection_name(unique("idem-backlog-child"))
        .start()
        .await
        .expect("the child's relay starts");
    // Killed here, in the middle of the backlog.
    tokio::time::sleep(CHILD_LIFETIME).await;
}

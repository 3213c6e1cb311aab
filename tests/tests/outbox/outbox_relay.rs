//! The outbox relay against the real RabbitMQ and databases: what handlers stage is published
//! once each, in order, with its derived id, promptly after the commit (in this process, and
//! through PostgreSQL `LISTEN` from another); a batch's publishes are in flight together;
//! relays share a table; a closed broker connection, a database outage or an unroutable
//! message loses nothing, and an unroutable message holds back its own run only; a rollback
//! publishes nothing.
//! This binary installs a global metrics recorder; tests read it by their own table.
//!
//! Run: `cargo test -p idem-tests --test outbox outbox_relay::` with RabbitMQ, PostgreSQL and MariaDB up
//! (see README).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use idem_rabbitmq::lapin::ExchangeKind;
use idem_rabbitmq::{Relay, RelayBuilder};
use idem_runtime::admin::HeldSubject;
use idem_runtime::admin::OutboxAdmin;
use idem_runtime::fingerprint::{Fingerprint, FingerprintError};
use idem_runtime::outbox::Outbox;
use idem_runtime::outbox::Relaying;
use idem_runtime::outbox::derived_id;
use idem_runtime::sea_orm::{DbErr, TransactionTrait};
use idem_runtime::{Context, Handler, Inbox, KeyError, MessageKey, Metadata, OutboxMessage};
use idem_tests::proxy::{Proxy, behind_proxy};
use idem_tests::rabbit::{DeadLetter, amqp_addr, amqp_url, amqp_url_through, close_connections};
use idem_tests::{Backend, Fixture, Msg, TestDb, inbox_key, on_each_backend, unique};
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata as MetricMetadata};
use metrics::{SharedString, Unit};
use tokio::sync::Notify;
use tokio::time::Instant;

on_each_backend!(
    staged_messages_are_published_promptly_in_order_and_marked_sent,
    a_batch_is_published_without_waiting_for_each_confirm,
    a_rolled_back_handler_publishes_nothing,
    messages_committed_before_any_relay_runs_are_published_once,
);

/// The database servers, whose relays take messages side by side and whose processes are killed.
mod servers {
    use super::*;
    on_each_backend!([postgres, mysql]:
        two_relays_on_one_table_publish_each_message_once,
        a_process_killed_after_its_commit_loses_and_repeats_nothing,
        a_closed_broker_connection_loses_nothing,
        a_message_committed_behind_the_relays_pass_is_published,
    );
}

/// On PostgreSQL: its wake-ups (`NOTIFY`, `LISTEN`), and the relay's holds of what the broker
/// does not take.
mod server {
    use super::*;
    on_each_backend!([postgres]:
        the_pending_age_grows_while_the_broker_is_down,
        a_run_behind_a_held_exchange_keeps_its_order,
        a_relay_in_another_process_is_woken_by_notify,
        an_unroutable_message_holds_back_the_ones_after_it,
        handlers_announce_nothing_while_a_relay_runs_in_their_process,
        an_unroutable_message_holds_back_its_own_run_only,
        an_unroutable_message_holds_up_no_other_run,
        held_back_messages_do_not_fill_the_batches,
        a_message_to_a_missing_exchange_holds_back_its_own_run_only,
        many_messages_to_a_missing_exchange_hold_up_no_other_run,
        a_database_outage_is_ridden_out_and_listening_resumes,
        a_lifted_hold_is_published_at_once,
        a_relay_started_while_the_broker_is_silent_starts_once_it_answers,
        a_broker_gone_silent_under_the_relay_is_reached_again,
    );
}

const CONSUMER: &str = "relay-test";
/// The routing key the test queue is bound with.
const ROUTED: &str = "routed";
/// The relays' poll interval: longer than any wait below, so that a message that arrives in
/// time was woken for.
const POLL: Duration = Duration::from_secs(30);
/// Well under [`POLL`]: how soon a staged message must arrive.
const PROMPT: Duration = Duration::from_secs(5);
/// How long a test waits for work that involves outages.
const WAIT: Duration = Duration::from_secs(30);
/// The first hold of what the broker did not take, in the tests that wait for several: short,
/// so that three tries take seconds rather than the default's 15.
const FIRST_HOLD: Duration = Duration::from_millis(500);
/// The longest hold (the default's).
const MAX_HOLD: Duration = Duration::from_secs(300);

/// Stages `count` messages to the test exchange, then fails when the body says `fail`.
#[derive(Debug, Clone)]
struct Stager {
    exchange: String,
    count: u32,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct StageError(String);

impl From<DbErr> for StageError {
    fn from(error: DbErr) -> Self {
        Self(error.to_string())
    }
}

impl From<idem_runtime::outbox::StagingError> for StageError {
    fn from(error: idem_runtime::outbox::StagingError) -> Self {
        Self(error.to_string())
    }
}

impl Handler for Stager {
    type Message = Msg;
    type Output = ();
    type Error = StageError;

    fn consumer(&self) -> &str {
        CONSUMER
    }
    fn key(&self, msg: &Msg, _: &Metadata) -> Result<MessageKey, KeyError> {
        MessageKey::new(msg.id.as_str())
    }
    fn fingerprint(&self, _: &Msg, _: &Metadata) -> Result<Option<Fingerprint>, FingerprintError> {
        Ok(None)
    }
    async fn handle(&self, cx: &Context<'_>, msg: Msg) -> Result<(), StageError> {
        for i in 0..self.count {
            let message = OutboxMessage::new(&self.exchange, ROUTED, body(&msg.id, i))
                .content_type("text/plain")
                .header("run", msg.id.as_str());
            cx.stage(message).await?;
        }
        if msg.body == "fail" {
            return Err(StageError("failing after staging".into()));
        }
        Ok(())
    }
}

/// Stages one message to each of `routing_keys` in turn, and after the first one waits for
/// `go_on`, having said so through `paused`: other runs commit meanwhile.
#[derive(Debug, Clone)]
struct Pausing {
    exchange: String,
    routing_keys: Vec<&'static str>,
    paused: Arc<Notify>,
    go_on: Arc<Notify>,
}

impl Handler for Pausing {
    type Message = Msg;
    type Output = ();
    type Error = StageError;

    fn consumer(&self) -> &str {
        CONSUMER
    }
    fn key(&self, msg: &Msg, _: &Metadata) -> Result<MessageKey, KeyError> {
        MessageKey::new(msg.id.as_str())
    }
    fn fingerprint(&self, _: &Msg, _: &Metadata) -> Result<Option<Fingerprint>, FingerprintError> {
        Ok(None)
    }
    async fn handle(&self, cx: &Context<'_>, msg: Msg) -> Result<(), StageError> {
        for (i, routing_key) in self.routing_keys.iter().enumerate() {
            if i == 1 {
                self.paused.notify_one();
                self.go_on.notified().await;
            }
            let message = OutboxMessage::new(&self.exchange, *routing_key, body(&msg.id, i as u32));
            cx.stage(message).await?;
        }
        Ok(())
    }
}

fn body(run: &str, i: u32) -> String {
    format!("{run}:{i}")
}

/// The ids a run of [`Stager`] stages, in order.
fn ids_of(run: &str, count: u32) -> Vec<String> {
    (0..count)
        .map(|i| derived_id(&inbox_key(CONSUMER, run), i))
        .collect()
}

/// The shared fixture with an outbox the inbox stages into, and its queue bound to a fresh
/// exchange with [`ROUTED`].
async fn fixture(backend: Backend) -> Fixture {
    // Installed before any relay counts.
    recorded();
    Fixture::builder()
        .on(backend)
        .outbox()
        .routed(ROUTED)
        .build()
        .await
}

/// What the tests here do with their fixture.
trait RelayFixture {
    /// A stager of `count` messages to the fixture's exchange.
    fn stager(&self, count: u32) -> Stager;
    /// Runs the stager for message `run` and commits.
    async fn stage(&self, run: &str, count: u32);
    /// Another process's outbox on the same table: its own pool and its own wake-ups.
    async fn other_outbox(&self) -> Outbox;
    /// Takes from the queue until `n` messages arrived, failing the test after `timeout`.
    async fn receive(&self, n: usize, timeout: Duration) -> Vec<DeadLetter>;
    /// Fails if a message arrives within half a second.
    async fn assert_quiet(&self);
    /// How many messages of the outbox are not sent yet.
    async fn unsent(&self) -> i64;
}

impl RelayFixture for Fixture {
    fn stager(&self, count: u32) -> Stager {
        Stager {
            exchange: self.exchange().to_owned(),
            count,
        }
    }

    async fn stage(&self, run: &str, count: u32) {
        self.inbox
            .process(
                &self.stager(count),
                Msg::new(run, "ok"),
                &Metadata::default(),
            )
            .await
            .expect("the handler commits");
    }

    async fn other_outbox(&self) -> Outbox {
        Outbox::builder(self.db.another_pool(4).await)
            .table(self.outbox().table().as_str())
            .build()
            .await
            .expect("outbox builds")
    }

    async fn receive(&self, n: usize, timeout: Duration) -> Vec<DeadLetter> {
        let deadline = Instant::now() + timeout;
        let mut got = Vec::new();
        loop {
            got.extend(self.broker.drain(&self.queue).await);
            if got.len() >= n {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {n} messages arrived within {timeout:?}",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn assert_quiet(&self) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let late = self.broker.drain(&self.queue).await;
        assert!(late.is_empty(), "{} unexpected messages", late.len());
    }

    async fn unsent(&self) -> i64 {
        self.db
            .count(self.outbox().table().as_str(), "sent_at IS NULL")
            .await
    }
}

/// A relay of `outbox` for a test: its connection named `name`, polling only every [`POLL`],
/// backing off briefly.
fn relay_of(outbox: &Outbox, name: &str) -> RelayBuilder {
    Relay::builder(amqp_url(), outbox.clone())
        .connection_name(name)
        .poll_interval(POLL)
        .retry_backoff(Duration::from_millis(20), Duration::from_millis(300))
}

async fn start(builder: RelayBuilder) -> Relay {
    let handle = builder.start().await.expect("the relay starts");
    // Let its first look at the table pass, so that what follows is published on a wake-up.
    tokio::time::sleep(Duration::from_millis(300)).await;
    handle
}

fn ids(messages: &[DeadLetter]) -> Vec<String> {
    messages
        .iter()
        .map(|m| m.message_id.clone().expect("a message id"))
        .collect()
}

async fn staged_messages_are_published_promptly_in_order_and_marked_sent(backend: Backend) {
    let f = fixture(backend).await;
    let relay = start(relay_of(f.outbox(), &unique("idem-relay"))).await;
    let staged = Instant::now();
    for run in ["o-1", "o-2", "o-3"] {
        f.stage(run, 3).await;
    }
    let got = f.receive(9, PROMPT).await;
    assert!(staged.elapsed() < PROMPT, "woken, not polled");
    let expected: Vec<String> = ["o-1", "o-2", "o-3"]
        .iter()
        .flat_map(|run| ids_of(run, 3))
        .collect();
    assert_eq!(ids(&got), expected, "once each, in the order staged");
    for (message, (run, i)) in got.iter().zip(
        ["o-1", "o-2", "o-3"]
            .iter()
            .flat_map(|r| (0..3).map(move |i| (*r, i))),
    ) {
        assert_eq!(message.body, body(run, i).into_bytes());
        assert_eq!(message.headers.get("run").map(String::as_str), Some(run));
        assert_eq!(message.content_type.as_deref(), Some("text/plain"));
        assert_eq!(message.delivery_mode, Some(2), "persistent");
    }
    f.broker
        .eventually("the messages marked sent", PROMPT, || async {
            f.unsent().await == 0
        })
        .await;
    assert!(
        f.outbox()
            .take_pending(100)
            .await
            .unwrap()
            .messages()
            .is_empty()
    );
    let stats = relay.shutdown().await;
    assert_eq!(stats.published, 9, "{stats:?}");
    assert_eq!(stats.failed, 0, "{stats:?}");
    let table = f.outbox().table().as_str();
    assert_eq!(counter("idem_outbox_published_total", table, None), 9);
    f.assert_quiet().await;
}

async fn a_batch_is_published_without_waiting_for_each_confirm(backend: Backend) {
    const DELAY: Duration = Duration::from_millis(100);
    let f = fixture(backend).await;
    let runs: Vec<String> = (0..50).map(|i| format!("o-{i}")).collect();
    for run in &runs {
        f.stage(run, 1).await;
    }
    // The broker's answers, its confirms among them, reach the relay 100 ms late.
    let proxy = Proxy::start_with_delay(&amqp_addr(), DELAY).await;
    let url = amqp_url_through(&proxy);
    let relay = Relay::builder(url, f.outbox().clone())
        .connection_name(unique("idem-relay"))
        .poll_interval(POLL)
        .start()
        .await
        .expect("the relay starts");
    let started = Instant::now();
    let got = f.receive(50, WAIT).await;
    let took = started.elapsed();
    // One confirm at a time, the last message would go out 49 delays after the first.
    assert!(took < DELAY * 20, "50 messages took {took:?}");
    let expected: Vec<String> = runs.iter().flat_map(|run| ids_of(run, 1)).collect();
    assert_eq!(ids(&got), expected, "once each, in the order staged");
    f.broker
        .eventually("the messages marked sent", WAIT, || async {
            f.unsent().await == 0
        })
        .await;
    let stats = relay.shutdown().await;
    assert_eq!((stats.published, stats.failed), (50, 0), "{stats:?}");
    f.assert_quiet().await;
}

async fn a_relay_in_another_process_is_woken_by_notify(backend: Backend) {
    let f = fixture(backend).await;
    // Its relay shares no in-process signal with the inbox that stages.
    let other = f.other_outbox().await;
    let relay = start(relay_of(&other, &unique("idem-relay"))).await;
    let staged = Instant::now();
    f.stage("o-1", 2).await;
    let got = f.receive(2, PROMPT).await;
    assert!(staged.elapsed() < PROMPT, "woken by NOTIFY, not polled");
    assert_eq!(ids(&got), ids_of("o-1", 2));
    // Again: one notification does not use the listener up.
    f.stage("o-2", 1).await;
    assert_eq!(ids(&f.receive(1, PROMPT).await), ids_of("o-2", 1));
    let stats = relay.shutdown().await;
    assert_eq!(stats.published, 3, "{stats:?}");
}

async fn handlers_announce_nothing_while_a_relay_runs_in_their_process(backend: Backend) {
    use idem_runtime::sea_orm::sqlx::postgres::PgListener;
    let f = fixture(backend).await;
    let mut listener = PgListener::connect_with(f.db.db.get_postgres_connection_pool())
        .await
        .unwrap();
    listener.listen(&f.outbox().channel()).await.unwrap();
    let relay = start(relay_of(f.outbox(), &unique("idem-relay"))).await;
    let staged = Instant::now();
    f.stage("o-1", 2).await;
    assert_eq!(ids(&f.receive(2, PROMPT).await), ids_of("o-1", 2));
    assert!(
        staged.elapsed() < PROMPT,
        "woken in its process, not polled"
    );
    let heard = tokio::time::timeout(Duration::from_millis(500), listener.recv()).await;
    assert!(heard.is_err(), "announced to other processes: {heard:?}");
    assert_eq!(relay.shutdown().await.published, 2);
    // With no relay here, a run announces its stagings to relays elsewhere again.
    f.stage("o-2", 1).await;
    let heard = tokio::time::timeout(PROMPT, listener.recv()).await;
    assert!(matches!(heard, Ok(Ok(_))), "not announced: {heard:?}");
}

async fn two_relays_on_one_table_publish_each_message_once(backend: Backend) {
    let f = fixture(backend).await;
    let runs: Vec<String> = (0..60).map(|i| format!("o-{i}")).collect();
    for run in &runs {
        f.stage(run, 2).await;
    }
    let (first, second) = (f.other_outbox().await, f.other_outbox().await);
    let builder = |outbox: &Outbox| {
        relay_of(outbox, &unique("idem-relay"))
            .batch_size(4)
            .poll_interval(Duration::from_millis(100))
    };
    let (a, b) = tokio::join!(builder(&first).start(), builder(&second).start());
    let (a, b) = (a.unwrap(), b.unwrap());
    let got = f.receive(120, WAIT).await;
    f.assert_quiet().await;
    let (a, b) = (a.shutdown().await, b.shutdown().await);
    let got = ids(&got);
    assert_eq!(got.len(), 120, "each message once");
    let distinct: BTreeSet<&String> = got.iter().collect();
    let expected: Vec<String> = runs.iter().flat_map(|run| ids_of(run, 2)).collect();
    assert_eq!(distinct, expected.iter().collect());
    for run in &runs {
        let [first, second] = &ids_of(run, 2)[..] else {
            unreachable!()
        };
        let at = |id: &String| got.iter().position(|g| g == id).unwrap();
        assert!(at(first) < at(second), "run {run} out of order");
    }
    assert!(
        a.published > 0 && b.published > 0,
        "both relays worked: {a:?} {b:?}"
    );
    assert_eq!(a.published + b.published, 120, "{a:?} {b:?}");
    assert_eq!(f.unsent().await, 0);
}

async fn a_closed_broker_connection_loses_nothing(backend: Backend) {
    let f = Arc::new(fixture(backend).await);
    let name = unique("idem-relay");
    let relay = start(relay_of(f.outbox(), &name).batch_size(10)).await;
    // Handlers keep committing while the connection is closed under the relay.
    let done = Arc::new(AtomicBool::new(false));
    let stager = {
        let (f, done) = (Arc::clone(&f), Arc::clone(&done));
        tokio::spawn(async move {
            let mut runs = Vec::new();
            while !done.load(Ordering::SeqCst) {
                let run = format!("o-{}", runs.len());
                f.stage(&run, 2).await;
                runs.push(run);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            runs
        })
    };
    let mut got = f.receive(20, WAIT).await;
    assert!(close_connections(&name).await >= 1, "no relay connection");
    f.broker
        .eventually("a new connection", WAIT, || async {
            relay.stats().reconnections >= 1
        })
        .await;
    got.extend(f.receive(20, WAIT).await);
    done.store(true, Ordering::SeqCst);
    let runs = stager.await.unwrap();
    let expected: BTreeSet<String> = runs.iter().flat_map(|run| ids_of(run, 2)).collect();
    let deadline = Instant::now() + WAIT;
    loop {
        let arrived: BTreeSet<String> = ids(&got).into_iter().collect();
        if arrived == expected {
            break;
        }
        assert!(
            arrived.is_subset(&expected),
            "ids that were never staged arrived"
        );
        assert!(
            Instant::now() < deadline,
            "{} of {} messages arrived",
            arrived.len(),
            expected.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        got.extend(f.broker.drain(&f.queue).await);
    }
    // Copies only of a publish whose confirm the closed connection lost.
    let copies = got.len() - expected.len();
    let stats = relay.shutdown().await;
    assert!(copies as u64 <= stats.failed, "{copies} copies, {stats:?}");
    assert_eq!(f.unsent().await, 0);
}

async fn a_rolled_back_handler_publishes_nothing(backend: Backend) {
    let f = fixture(backend).await;
    let relay = start(relay_of(f.outbox(), &unique("idem-relay"))).await;
    let failed = f
        .inbox
        .process(&f.stager(3), Msg::new("bad", "fail"), &Metadata::default())
        .await;
    assert!(failed.is_err());
    // Staged after the failed run: what it had staged would have gone out first.
    f.stage("good", 1).await;
    assert_eq!(ids(&f.receive(1, PROMPT).await), ids_of("good", 1));
    f.assert_quiet().await;
    assert_eq!(f.db.count(f.outbox().table().as_str(), "1=1").await, 1);
    assert_eq!(relay.shutdown().await.published, 1);
}

async fn messages_committed_before_any_relay_runs_are_published_once(backend: Backend) {
    let f = fixture(backend).await;
    f.stage("o-1", 2).await;
    f.stage("o-2", 2).await;
    // A relay took them and died before publishing: its transaction rolls back.
    let taken = f.outbox().take_pending(10).await.unwrap();
    assert_eq!(taken.messages().len(), 4);
    drop(taken);
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let relay = relay_of(f.outbox(), &unique("idem-relay"))
        .start()
        .await
        .unwrap();
    let got = f.receive(4, PROMPT).await;
    let expected: Vec<String> = ["o-1", "o-2"].iter().flat_map(|r| ids_of(r, 2)).collect();
    assert_eq!(ids(&got), expected);
    f.broker
        .eventually("the messages marked sent", PROMPT, || async {
            f.unsent().await == 0
        })
        .await;
    // The next relay (after a restart) finds nothing to publish.
    assert_eq!(relay.shutdown().await.published, 4);
    let again = start(relay_of(f.outbox(), &unique("idem-relay"))).await;
    f.assert_quiet().await;
    assert_eq!(again.shutdown().await.published, 0);

    let table = f.outbox().table().as_str();
    let (last, max) = gauge("idem_outbox_pending_age_seconds", table);
    assert!(max >= 1.0, "the first batch was over a second old: {max}");
    assert_eq!(last, 0.0, "no message pending since");
    // Each relay counted the table's pending messages as it began: four, then none.
    assert_eq!(gauge("idem_outbox_pending", table), (0.0, 4.0));
    assert_eq!(gauge("idem_outbox_relay_connected", table), (0.0, 1.0));
}

/// What the child process of [`a_process_killed_after_its_commit_loses_and_repeats_nothing`]
/// is told, through its environment.
const CHILD_URL: &str = "IDEM_RELAY_CHILD_URL";
const CHILD_BACKEND: &str = "IDEM_RELAY_CHILD_BACKEND";
const CHILD_TABLES: &str = "IDEM_RELAY_CHILD_TABLES";
const CHILD_EXCHANGE: &str = "IDEM_RELAY_CHILD_EXCHANGE";
/// What the child prints once it holds the batch its relay took.
const TAKEN: &str = "taken";

/// A consumer process commits a handler's run with three staged messages, its relay takes them
/// (their rows locked in its transaction), and the process is killed (SIGKILL) before it
/// publishes: another process's relay publishes each of them once, in order.
async fn a_process_killed_after_its_commit_loses_and_repeats_nothing(backend: Backend) {
    use tokio::io::{AsyncBufReadExt, BufReader};

    let f = fixture(backend).await;
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &idem_tests::test_named(module_path!(), "killed_relay_child"),
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_URL, backend.url(""))
        .env(CHILD_BACKEND, format!("{backend:?}"))
        .env(
            CHILD_TABLES,
            format!(
                "{} {}",
                f.inbox.table().as_str(),
                f.outbox().table().as_str()
            ),
        )
        .env(CHILD_EXCHANGE, f.exchange())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the child process starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let taken = tokio::time::timeout(WAIT, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line == TAKEN {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(taken, Ok(true), "the child never took its batch");
    assert_eq!(f.unsent().await, 3, "committed, not published");
    child.kill().await.expect("SIGKILL");

    let relay = start(relay_of(f.outbox(), &unique("idem-relay"))).await;
    let got = f.receive(3, PROMPT).await;
    assert_eq!(ids(&got), ids_of("killed", 3));
    f.assert_quiet().await;
    f.broker
        .eventually("the messages marked sent", PROMPT, || async {
            f.unsent().await == 0
        })
        .await;
    assert_eq!(relay.shutdown().await.published, 3);
}

/// The process killed by the test above; it does nothing when run on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a process started, and killed, by the relay tests"]
async fn killed_relay_child() {
    let (Ok(url), Ok(backend), Ok(tables), Ok(exchange)) = (
        std::env::var(CHILD_URL),
        std::env::var(CHILD_BACKEND),
        std::env::var(CHILD_TABLES),
        std::env::var(CHILD_EXCHANGE),
    ) else {
        return;
    };
    let backend = Backend::of_child(&backend);
    let (inbox_table, outbox_table) = tables.split_once(' ').expect("two tables");
    let db = TestDb::connect_url(backend, url, 4).await;
    let outbox = Outbox::builder(db.db.clone())
        .table(outbox_table)
        .create_table(false)
        .build()
        .await
        .unwrap();
    let inbox = Inbox::builder(db.db.clone())
        .table(inbox_table)
        .create_table(false)
        .outbox(outbox.clone())
        .build()
        .await
        .unwrap();
    let stager = Stager { exchange, count: 3 };
    inbox
        .process(&stager, Msg::new("killed", "ok"), &Metadata::default())
        .await
        .unwrap();
    let batch = outbox.take_pending(10).await.unwrap();
    assert_eq!(batch.messages().len(), 3);
    println!("{TAKEN}");
    // Killed here, its batch in hand.
    tokio::time::sleep(WAIT).await;
    drop(batch);
}

async fn an_unroutable_message_holds_back_the_ones_after_it(backend: Backend) {
    let f = fixture(backend).await;
    // Outside handlers, in one run: its messages go out in order.
    let message = |id: &str, routing_key: &str| {
        OutboxMessage::new(f.exchange(), routing_key, id.as_bytes().to_vec())
            .message_id(id)
            .in_run("order-1")
    };
    let tx = f.db.db.begin().await.unwrap();
    f.outbox()
        .stage(&tx, message("m-1", "unbound"))
        .await
        .unwrap();
    f.outbox().stage(&tx, message("m-2", ROUTED)).await.unwrap();
    tx.commit().await.unwrap();

    let relay = relay_of(f.outbox(), &unique("idem-relay"))
        .hold_backoff(FIRST_HOLD, MAX_HOLD)
        .start()
        .await
        .unwrap();
    // Three tries take their holds' growing pauses.
    f.broker
        .eventually("publishes retried", WAIT * 2, || async {
            relay.stats().failed >= 3
        })
        .await;
    assert_eq!(f.broker.depth(&f.queue).await, 0, "m-2 overtook m-1");
    assert_eq!(relay.stats().published, 0);
    let table = f.outbox().table().as_str();
    assert!(
        counter(
            "idem_outbox_publish_failures_total",
            table,
            Some("unroutable")
        ) >= 3
    );

    // Once routed, m-1 goes out, then m-2.
    f.broker.bind(&f.queue, f.exchange(), "unbound").await;
    assert_eq!(ids(&f.receive(2, WAIT).await), ["m-1", "m-2"]);
    assert_eq!(relay.shutdown().await.published, 2);
}

async fn an_unroutable_message_holds_back_its_own_run_only(backend: Backend) {
    let f = fixture(backend).await;
    let (paused, go_on) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let pausing = Pausing {
        exchange: f.exchange().to_owned(),
        routing_keys: vec!["unbound", ROUTED],
        paused: Arc::clone(&paused),
        go_on: Arc::clone(&go_on),
    };
    let inbox = f.inbox.clone();
    let a = tokio::spawn(async move {
        let msg = Msg::new("a", "ok");
        inbox.process(&pausing, msg, &Metadata::default()).await
    });
    // Run a stages an unroutable message; runs b, c and d commit; then a stages a routed one:
    // one batch holds a-0, b-0, c-0, d-0, a-1 in this order.
    paused.notified().await;
    for run in ["b", "c", "d"] {
        f.stage(run, 1).await;
    }
    go_on.notify_one();
    a.await.unwrap().expect("run a commits");

    let relay = relay_of(f.outbox(), &unique("idem-relay"))
        .hold_backoff(FIRST_HOLD, MAX_HOLD)
        .start()
        .await
        .unwrap();
    let others: Vec<String> = ["b", "c", "d"].iter().flat_map(|r| ids_of(r, 1)).collect();
    assert_eq!(ids(&f.receive(3, WAIT).await), others, "other runs go out");
    f.broker
        .eventually("publishes retried", WAIT * 2, || async {
            relay.stats().failed >= 3
        })
        .await;
    // a-1 never overtakes a-0.
    f.assert_quiet().await;
    assert_eq!(f.unsent().await, 2);

    // Once routed, a's messages go out in order, and nothing else again.
    f.broker.bind(&f.queue, f.exchange(), "unbound").await;
    assert_eq!(ids(&f.receive(2, WAIT).await), ids_of("a", 2));
    f.assert_quiet().await;
    let stats = relay.shutdown().await;
    assert_eq!(stats.published, 5, "{stats:?}");
    assert_eq!(f.unsent().await, 0);
}

/// An operator lifts a run's hold (`idem outbox retry`) once its message is routable: the
/// relay, woken, publishes it at once rather than when the hold, grown to 8 s, runs out.
async fn a_lifted_hold_is_published_at_once(backend: Backend) {
    let f = fixture(backend).await;
    let message = OutboxMessage::new(f.exchange(), "unbound", b"{}".to_vec())
        .message_id("lifted")
        .in_run("a");
    f.outbox().stage(&f.db.db, message).await.unwrap();
    let relay = relay_of(f.outbox(), &unique("idem-relay"))
        .hold_backoff(Duration::from_secs(2), MAX_HOLD)
        .start()
        .await
        .unwrap();
    // Held 2 s, then 4 s, then 8 s: longer than PROMPT.
    f.broker
        .eventually("publishes retried", WAIT * 2, || async {
            relay.stats().failed >= 3
        })
        .await;
    let run = HeldSubject::Run("run:a".to_owned());
    let held = f.outbox().held_runs(10).await.unwrap();
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0].held, run);
    assert!(held[0].hold_left > PROMPT, "{held:?}");

    f.broker.bind(&f.queue, f.exchange(), "unbound").await;
    assert_eq!(f.outbox().lift_holds(&run).await.unwrap(), 1);
    assert_eq!(ids(&f.receive(1, PROMPT).await), ["lifted"]);
    assert_eq!(relay.shutdown().await.published, 1);
    assert_eq!(f.unsent().await, 0);
    assert!(f.outbox().held_runs(10).await.unwrap().is_empty());
}

/// Runs `pausing` for message `run` to its commit, without pausing it.
async fn run_through(f: &Fixture, pausing: &Pausing, run: &str) {
    let task = {
        let (inbox, pausing, run) = (f.inbox.clone(), pausing.clone(), run.to_owned());
        tokio::spawn(async move {
            inbox
                .process(&pausing, Msg::new(run, "ok"), &Metadata::default())
                .await
        })
    };
    if pausing.routing_keys.len() > 1 {
        pausing.paused.notified().await;
        pausing.go_on.notify_one();
    }
    task.await.unwrap().expect("the run commits");
}

fn pausing(f: &Fixture, routing_keys: Vec<&'static str>) -> Pausing {
    Pausing {
        exchange: f.exchange().to_owned(),
        routing_keys,
        paused: Arc::new(Notify::new()),
        go_on: Arc::new(Notify::new()),
    }
}

/// An unroutable message at the head of the batch, its run's next message behind it: every
/// other run goes out meanwhile, in the same rounds.
async fn an_unroutable_message_holds_up_no_other_run(backend: Backend) {
    let f = fixture(backend).await;
    run_through(&f, &pausing(&f, vec!["unbound", ROUTED]), "a").await;
    let runs: Vec<String> = (0..45).map(|i| format!("r{i:02}")).collect();
    for run in &runs {
        f.stage(run, 2).await;
    }
    let relay = relay_of(f.outbox(), &unique("idem-relay"))
        .start()
        .await
        .unwrap();
    let mut got = ids(&f.receive(90, WAIT).await);
    got.sort();
    let mut expected: Vec<String> = runs.iter().flat_map(|run| ids_of(run, 2)).collect();
    expected.sort();
    assert_eq!(got, expected, "every other run goes out");
    // Marked sent once confirmed, a moment after the broker delivered them.
    f.broker
        .eventually("all but run a marked sent", WAIT, || async {
            f.unsent().await == 2
        })
        .await;
    relay.shutdown().await;
}

/// More runs held back than a batch takes: the relay's batches leave them out, and what was
/// staged after them goes out.
async fn held_back_messages_do_not_fill_the_batches(backend: Backend) {
    let f = fixture(backend).await;
    // More than the batch, and than the runs a batch's statement leaves out (100).
    let unbound = pausing(&f, vec!["unbound"]);
    for i in 0..115 {
        run_through(&f, &unbound, &format!("u{i:03}")).await;
    }
    f.stage("after", 1).await;
    // And one staged outside handlers.
    let tx = f.db.db.begin().await.unwrap();
    let outside = OutboxMessage::new(f.exchange(), ROUTED, b"{}".to_vec()).message_id("outside");
    f.outbox().stage(&tx, outside).await.unwrap();
    tx.commit().await.unwrap();
    let relay = relay_of(f.outbox(), &unique("idem-relay"))
        .batch_size(10)
        .start()
        .await
        .unwrap();
    let mut expected = ids_of("after", 1);
    expected.push("outside".to_owned());
    assert_eq!(ids(&f.receive(2, WAIT).await), expected);
    f.broker
        .eventually("all but the held runs marked sent", WAIT, || async {
            f.unsent().await == 115
        })
        .await;
    relay.shutdown().await;
}

/// A message to an exchange that does not exist: the broker closes the channel it was published
/// on, and every publish in flight on it fails. That message is found and held back (it has no
/// run); the other runs all go out.
async fn a_message_to_a_missing_exchange_holds_back_its_own_run_only(backend: Backend) {
    let f = fixture(backend).await;
    let tx = f.db.db.begin().await.unwrap();
    let nowhere = OutboxMessage::new(unique("idem_no_such_exchange"), ROUTED, b"{}".to_vec());
    f.outbox().stage(&tx, nowhere).await.unwrap();
    tx.commit().await.unwrap();
    let runs: Vec<String> = (0..20).map(|i| format!("r{i:02}")).collect();
    for run in &runs {
        f.stage(run, 1).await;
    }
    let relay = relay_of(f.outbox(), &unique("idem-relay"))
        .start()
        .await
        .unwrap();
    let mut got = ids(&f.receive(runs.len(), WAIT).await);
    got.sort();
    let mut expected: Vec<String> = runs.iter().flat_map(|run| ids_of(run, 1)).collect();
    expected.sort();
    assert_eq!(got, expected, "every other run goes out");
    // Marked sent once confirmed, a moment after the broker delivered them.
    f.broker
        .eventually("all but the held message marked sent", WAIT, || async {
            f.unsent().await == 1
        })
        .await;
    relay.shutdown().await;
}

/// Many messages, each its own run, to an exchange that does not exist, staged before the
/// others: each closes the channel it is published on. The exchange is held back once found, and
/// every other run goes out promptly. Found one message at a time, each search a failed round
/// with its back-off, the culprits took turns at the head of the table longer than their holds
/// lasted, and nothing else went out.
async fn many_messages_to_a_missing_exchange_hold_up_no_other_run(backend: Backend) {
    let f = fixture(backend).await;
    let nowhere = Stager {
        exchange: unique("idem_no_such_exchange"),
        count: 1,
    };
    for i in 0..8 {
        f.inbox
            .process(
                &nowhere,
                Msg::new(format!("n{i}"), "ok"),
                &Metadata::default(),
            )
            .await
            .expect("the handler commits");
    }
    let runs: Vec<String> = (0..20).map(|i| format!("r{i:02}")).collect();
    for run in &runs {
        f.stage(run, 1).await;
    }
    // The default back-off (200 ms doubling to 10 s), as in production.
    let relay = Relay::builder(amqp_url(), f.outbox().clone())
        .connection_name(unique("idem-relay"))
        .poll_interval(POLL)
        .start()
        .await
        .unwrap();
    let mut got = ids(&f.receive(runs.len(), Duration::from_secs(20)).await);
    got.sort();
    let mut expected: Vec<String> = runs.iter().flat_map(|run| ids_of(run, 1)).collect();
    expected.sort();
    assert_eq!(got, expected, "every other run goes out");
    f.broker
        .eventually("all but the held messages marked sent", WAIT, || async {
            f.unsent().await == 8
        })
        .await;
    // Found once for the exchange (a channel closed under the batch, then under the message
    // alone), not once per message.
    let stats = relay.shutdown().await;
    assert!(stats.reconnections <= 3, "{stats:?}");
}

async fn a_database_outage_is_ridden_out_and_listening_resumes(backend: Backend) {
    // The relay reaches the database through a proxy; handlers, in another process, do not.
    let (proxied, proxy) = behind_proxy(backend).await;
    let relayed = Outbox::builder(proxied.db.clone())
        .table(proxied.table("outbox"))
        .build()
        .await
        .unwrap();
    let f = fixture(backend).await;
    let staging = Outbox::builder(f.db.db.clone())
        .table(relayed.table().as_str())
        .build()
        .await
        .unwrap();
    let inbox = Inbox::builder(f.db.db.clone())
        .table(f.db.table("inbox"))
        .outbox(staging)
        .build()
        .await
        .unwrap();
    let stage = |run: &'static str| {
        let (inbox, stager) = (inbox.clone(), f.stager(1));
        async move {
            inbox
                .process(&stager, Msg::new(run, "ok"), &Metadata::default())
                .await
                .unwrap();
        }
    };
    let relay = start(relay_of(&relayed, &unique("idem-relay"))).await;

    proxy.cut().await;
    // Woken in its own process, the relay finds no database.
    relayed.notify_staged();
    stage("during").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.restore();
    assert_eq!(ids(&f.receive(1, WAIT).await), ids_of("during", 1));

    // Listening again: a commit elsewhere wakes it long before its next poll.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let staged = Instant::now();
    stage("after").await;
    assert_eq!(ids(&f.receive(1, PROMPT).await), ids_of("after", 1));
    assert!(staged.elapsed() < PROMPT);
    let stats = relay.shutdown().await;
    assert_eq!(stats.published, 2, "{stats:?}");
}

// ---- a metrics recorder for this binary ---------------------------------------------------

/// Counters and gauges by name and sorted labels.
#[derive(Debug, Default)]
struct Recorded {
    counters: Mutex<BTreeMap<String, Arc<AtomicU64>>>,
    gauges: Mutex<BTreeMap<String, Arc<GaugeCell>>>,
}

struct CounterCell(Arc<AtomicU64>);

impl metrics::CounterFn for CounterCell {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::SeqCst);
    }
    fn absolute(&self, value: u64) {
        self.0.fetch_max(value, Ordering::SeqCst);
    }
}

/// A gauge's last value and the highest it was set to.
#[derive(Debug, Default)]
struct GaugeCell(Mutex<(f64, f64)>);

impl metrics::GaugeFn for GaugeCell {
    fn increment(&self, value: f64) {
        let last = self.0.lock().unwrap().0;
        self.set(last + value);
    }
    fn decrement(&self, value: f64) {
        let last = self.0.lock().unwrap().0;
        self.set(last - value);
    }
    fn set(&self, value: f64) {
        let mut cell = self.0.lock().unwrap();
        *cell = (value, cell.1.max(value));
    }
}

fn label(key: &Key) -> String {
    let mut labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl metrics::Recorder for Recorded {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &MetricMetadata<'_>) -> Counter {
        let mut counters = self.counters.lock().unwrap();
        let cell = counters.entry(label(key)).or_default().clone();
        Counter::from_arc(Arc::new(CounterCell(cell)))
    }
    fn register_gauge(&self, key: &Key, _: &MetricMetadata<'_>) -> Gauge {
        let mut gauges = self.gauges.lock().unwrap();
        Gauge::from_arc(gauges.entry(label(key)).or_default().clone())
    }
    fn register_histogram(&self, _: &Key, _: &MetricMetadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

fn recorded() -> &'static Recorded {
    static RECORDED: OnceLock<&'static Recorded> = OnceLock::new();
    RECORDED.get_or_init(|| {
        let recorded: &'static Recorded = Box::leak(Box::default());
        metrics::set_global_recorder(recorded).expect("the only recorder");
        recorded
    })
}

fn counter(name: &str, table: &str, reason: Option<&str>) -> u64 {
    let key = match reason {
        Some(reason) => format!("{name}{{reason={reason},table={table}}}"),
        None => format!("{name}{{table={table}}}"),
    };
    recorded()
        .counters
        .lock()
        .unwrap()
        .get(&key)
        .map_or(0, |c| c.load(Ordering::SeqCst))
}

/// A gauge's last value and its highest.
fn gauge(name: &str, table: &str) -> (f64, f64) {
    let key = format!("{name}{{table={table}}}");
    recorded()
        .gauges
        .lock()
        .unwrap()
        .get(&key)
        .map_or((f64::NAN, f64::NAN), |g| *g.0.lock().unwrap())
}

/// A message whose transaction took its seq first and committed last, while the relay went
/// through batch after batch of the later ones: its pass goes on from each batch's last row,
/// and the next pass, from the first pending row, finds it.
async fn a_message_committed_behind_the_relays_pass_is_published(backend: Backend) {
    let f = fixture(backend).await;
    let late = f.db.db.begin().await.unwrap();
    let behind = OutboxMessage::new(f.exchange(), ROUTED, b"{}".to_vec()).message_id("behind");
    f.outbox().stage(&late, behind).await.unwrap();
    let runs: Vec<String> = (0..35).map(|i| format!("r{i:02}")).collect();
    for run in &runs {
        f.stage(run, 1).await;
    }
    // A transaction committed outside the outbox wakes no relay on MySQL: its poll finds it.
    let relay = relay_of(f.outbox(), &unique("idem-relay"))
        .batch_size(10)
        .poll_interval(Duration::from_secs(1))
        .start()
        .await
        .unwrap();
    assert_eq!(f.receive(runs.len(), WAIT).await.len(), runs.len());
    late.commit().await.unwrap();
    assert_eq!(ids(&f.receive(1, WAIT).await), ["behind"]);
    f.broker
        .eventually("every message marked sent", WAIT, || async {
            f.unsent().await == 0
        })
        .await;
    relay.shutdown().await;
}

/// A relay of `outbox` to the broker behind `proxy`, giving up on a session that does not open
/// within a second.
fn relay_through(proxy: &Proxy, outbox: &Outbox) -> RelayBuilder {
    Relay::builder(amqp_url_through(proxy), outbox.clone())
        .connection_name(unique("idem-relay"))
        .poll_interval(POLL)
        .retry_backoff(Duration::from_millis(20), Duration::from_millis(300))
        .open_timeout(Duration::from_secs(1))
}

/// Lets `proxy` forward new connections again after `silence`.
fn restore_after(proxy: &Proxy, silence: Duration) -> tokio::task::JoinHandle<()> {
    let proxy = proxy.clone();
    tokio::spawn(async move {
        tokio::time::sleep(silence).await;
        proxy.restore();
    })
}

/// A relay started while the broker accepts connections and never answers (as a node killed
/// under the session being opened leaves it): each attempt is given up after the open timeout,
/// and the relay starts once the broker answers.
async fn a_relay_started_while_the_broker_is_silent_starts_once_it_answers(backend: Backend) {
    let f = fixture(backend).await;
    let proxy = Proxy::start(&amqp_addr()).await;
    proxy.silence().await;
    let answering = restore_after(&proxy, Duration::from_secs(3));
    let relay = tokio::time::timeout(WAIT, relay_through(&proxy, f.outbox()).start())
        .await
        .expect("start gives up on a session that does not open")
        .expect("the relay starts once the broker answers");
    answering.await.unwrap();
    f.stage("o-1", 2).await;
    assert_eq!(ids(&f.receive(2, WAIT).await), ids_of("o-1", 2));
    relay.shutdown().await;
    proxy.cut().await;
}

/// A broker that goes silent under a running relay (a host gone behind a load balancer): the
/// sessions the relay opens into the silence are given up after the open timeout, and what was
/// staged meanwhile is published once the broker answers.
async fn a_broker_gone_silent_under_the_relay_is_reached_again(backend: Backend) {
    let f = fixture(backend).await;
    let proxy = Proxy::start(&amqp_addr()).await;
    let relay = start(relay_through(&proxy, f.outbox())).await;
    f.stage("o-1", 1).await;
    assert_eq!(ids(&f.receive(1, WAIT).await), ids_of("o-1", 1));
    proxy.silence().await;
    f.stage("o-2", 2).await;
    restore_after(&proxy, Duration::from_secs(3)).await.unwrap();
    assert_eq!(ids(&f.receive(2, WAIT).await), ids_of("o-2", 2));
    // Marked sent once confirmed, a moment after the broker delivered them.
    f.broker
        .eventually("both marked sent", WAIT, || async { f.unsent().await == 0 })
        .await;
    let stats = relay.shutdown().await;
    assert!(stats.reconnections >= 1, "{stats:?}");
    proxy.cut().await;
}

/// While the broker cannot be reached, the relay takes no batch, yet what waits grows older:
/// the pending-age gauge follows the table's oldest pending message, so that an alert on it
/// fires during the outage, not after.
async fn the_pending_age_grows_while_the_broker_is_down(backend: Backend) {
    let f = fixture(backend).await;
    let proxy = Proxy::start(&amqp_addr()).await;
    let relay = start(relay_through(&proxy, f.outbox())).await;
    f.stage("o-1", 1).await;
    assert_eq!(ids(&f.receive(1, WAIT).await), ids_of("o-1", 1));
    proxy.cut().await;
    f.stage("o-2", 2).await;
    let table = f.outbox().table().as_str().to_owned();
    // The gauge is read from the table every ten seconds at most.
    let waited = WAIT.max(Duration::from_secs(30));
    f.broker
        .eventually(
            "the pending age gauged during the outage",
            waited,
            || async { gauge("idem_outbox_pending_age_seconds", &table).0 >= 2.0 },
        )
        .await;
    assert_eq!(gauge("idem_outbox_pending", &table).0, 2.0);
    proxy.restore();
    assert_eq!(ids(&f.receive(2, WAIT).await), ids_of("o-2", 2));
    relay.shutdown().await;
}

/// A relay that the broker refused an exchange (it holds messages to it on sight for a while)
/// takes a run staged after the refusal: its first message, to that exchange, is held on sight,
/// and the run's later message, to another exchange, waits behind it instead of going out first.
/// (Found by the protocol's model: `idem-model`, the relay's holds.)
async fn a_run_behind_a_held_exchange_keeps_its_order(backend: Backend) {
    let f = fixture(backend).await;
    let missing = unique("idem_late_exchange");
    let stage_run = |run: &'static str, to: Vec<String>| {
        let f = &f;
        async move {
            let tx = f.db.db.begin().await.unwrap();
            for (i, exchange) in to.into_iter().enumerate() {
                let message = OutboxMessage::new(exchange, ROUTED, b"{}".to_vec())
                    .in_run(run)
                    .message_id(format!("{run}-{i}"));
                f.outbox().stage(&tx, message).await.unwrap();
            }
            tx.commit().await.unwrap();
        }
    };
    stage_run("a", vec![missing.clone()]).await;
    let relay = start(relay_of(f.outbox(), &unique("idem-relay"))).await;
    // The broker refuses the missing exchange: the relay holds it, and its run.
    f.broker
        .eventually("run a held back", WAIT, || async {
            let held = "sent_at IS NULL AND held_until IS NOT NULL";
            f.db.count(f.outbox().table().as_str(), held).await == 1
        })
        .await;
    stage_run("b", vec![missing.clone(), f.exchange().to_owned()]).await;
    f.outbox().notify_staged();
    // b-0 is held on sight; b-1 must wait behind it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let early = ids(&f.broker.drain(&f.queue).await);
    assert!(
        early.is_empty(),
        "published before the run's first: {early:?}"
    );
    relay.shutdown().await;

    // The exchange made, and a relay that remembers no hold: the runs go out in their order.
    f.broker
        .declare_exchange(&missing, ExchangeKind::Direct)
        .await;
    f.broker.bind(&f.queue, &missing, ROUTED).await;
    for run in ["run:a", "run:b"] {
        f.outbox()
            .lift_holds(&HeldSubject::Run(run.to_owned()))
            .await
            .unwrap();
    }
    let relay = start(relay_of(f.outbox(), &unique("idem-relay"))).await;
    let got = ids(&f.receive(3, WAIT).await);
    let at = |id: &str| got.iter().position(|g| g == id).expect(id);
    assert!(at("b-0") < at("b-1"), "run b out of order: {got:?}");
    relay.shutdown().await;
}

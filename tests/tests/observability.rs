//! Metrics through the `metrics` facade: a counter per outcome for the inbox, per settlement for
//! the RabbitMQ consumer, the cleaner's deletions, the duplicates' ages, the processing and
//! batch histograms, and the consumer's and relay's gauges. This binary installs a global
//! recorder, so it holds these tests alone.
//!
//! Run: `cargo test -p idem-tests --test observability` with PostgreSQL and RabbitMQ up.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use idem_rabbitmq::{Consumer, PublishOptions};
use idem_runtime::transport::BatchItem;
use idem_runtime::{MessageKey, Metadata, Outcome, RetentionPolicy, idempotent};
use idem_tests::proxy::Proxy;
use idem_tests::rabbit::{amqp_addr, amqp_url, amqp_url_through, consumer_builder_at};
use idem_tests::{Fixture, Msg, unique};
use metrics::{
    Counter, Gauge, Histogram, Key, KeyName, Metadata as MetricMetadata, SharedString, Unit,
};

/// Counters and histograms by name and sorted labels.
#[derive(Debug, Default)]
struct Counters {
    counters: Mutex<BTreeMap<String, Arc<AtomicU64>>>,
    histograms: Mutex<BTreeMap<String, Arc<Values>>>,
    gauges: Mutex<BTreeMap<String, Arc<Level>>>,
}

/// A gauge's value, as the bits of an `f64`.
#[derive(Debug, Default)]
struct Level(AtomicU64);

impl Level {
    fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::SeqCst))
    }

    fn update(&self, change: impl Fn(f64) -> f64) {
        let _ = (self.0).fetch_update(Ordering::SeqCst, Ordering::SeqCst, |bits| {
            Some(change(f64::from_bits(bits)).to_bits())
        });
    }
}

impl metrics::GaugeFn for Level {
    fn increment(&self, value: f64) {
        self.update(|level| level + value);
    }
    fn decrement(&self, value: f64) {
        self.update(|level| level - value);
    }
    fn set(&self, value: f64) {
        self.update(|_| value);
    }
}

/// A histogram's recorded values.
#[derive(Debug, Default)]
struct Values(Mutex<Vec<f64>>);

impl metrics::HistogramFn for Values {
    fn record(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

struct Cell(Arc<AtomicU64>);

impl metrics::CounterFn for Cell {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::SeqCst);
    }
    fn absolute(&self, value: u64) {
        self.0.fetch_max(value, Ordering::SeqCst);
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

impl metrics::Recorder for Counters {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &MetricMetadata<'_>) -> Counter {
        Counter::from_arc(Arc::new(Cell(entry(&self.counters, key))))
    }
    fn register_gauge(&self, key: &Key, _: &MetricMetadata<'_>) -> Gauge {
        Gauge::from_arc(entry(&self.gauges, key))
    }
    fn register_histogram(&self, key: &Key, _: &MetricMetadata<'_>) -> Histogram {
        Histogram::from_arc(entry(&self.histograms, key))
    }
}

/// The metric of `key` in `metrics`, made when it is first registered.
fn entry<T: Default>(metrics: &Mutex<BTreeMap<String, Arc<T>>>, key: &Key) -> Arc<T> {
    let mut metrics = metrics.lock().unwrap();
    metrics.entry(label(key)).or_default().clone()
}

fn counters() -> &'static Counters {
    static COUNTERS: OnceLock<&'static Counters> = OnceLock::new();
    COUNTERS.get_or_init(|| {
        let counters: &'static Counters = Box::leak(Box::default());
        metrics::set_global_recorder(counters).expect("the only recorder");
        counters
    })
}

fn count(name_and_labels: &str) -> u64 {
    counters()
        .counters
        .lock()
        .unwrap()
        .get(name_and_labels)
        .map_or(0, |cell| cell.load(Ordering::SeqCst))
}

/// A gauge's value, if it was ever set.
fn gauge(name_and_labels: &str) -> Option<f64> {
    let gauges = counters().gauges.lock().unwrap();
    gauges.get(name_and_labels).map(|level| level.get())
}

/// Waits up to `timeout` for the gauge to read `want`.
async fn wait_for_gauge(name_and_labels: &str, want: f64, timeout: Duration) {
    let deadline = tokio::time::Instant::now() + timeout;
    while gauge(name_and_labels) != Some(want) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name_and_labels} is {:?}, not {want}, after {timeout:?}",
            gauge(name_and_labels)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn recorded(name_and_labels: &str) -> Vec<f64> {
    counters()
        .histograms
        .lock()
        .unwrap()
        .get(name_and_labels)
        .map_or_else(Vec::new, |values| values.0.lock().unwrap().clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outcomes_settlements_and_cleanup_are_counted() {
    counters();
    let t = Fixture::builder()
        .inbox(|inbox| {
            inbox.retention(
                RetentionPolicy::default().with_consumer("short", Duration::from_millis(1)),
            )
        })
        .build()
        .await;
    let (inbox, table) = (&t.inbox, t.inbox.table().as_str());
    let consumer = unique("observed");
    let handler = t.recorder(&consumer);
    let meta = Metadata::default();

    inbox
        .process(&handler, Msg::new("a", "1"), &meta)
        .await
        .unwrap();
    inbox
        .process(&handler, Msg::new("a", "1"), &meta)
        .await
        .unwrap();
    inbox
        .process(&handler, Msg::new("a", "2"), &meta)
        .await
        .unwrap_err();
    inbox
        .process(&handler, Msg::new("", "1"), &meta)
        .await
        .unwrap_err();
    let outcome = |outcome: &str| {
        count(&format!(
            "idem_messages_total{{consumer={consumer},outcome={outcome}}}"
        ))
    };
    assert_eq!(outcome("processed"), 1);
    assert_eq!(outcome("duplicate"), 1);
    assert_eq!(outcome("fingerprint-mismatch"), 1);
    assert_eq!(outcome("invalid-key"), 1);

    // The cleaner reports what it deleted.
    let short = t.recorder("short");
    for id in ["x", "y", "z"] {
        inbox
            .process(&short, Msg::new(id, "1"), &meta)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(inbox.cleaner().run_once().await.unwrap().deleted, 3);
    assert_eq!(
        count(&format!("idem_cleanup_deleted_total{{table={table}}}")),
        3
    );

    // The consumer counts settlements per queue.
    let queue = &t.queue;
    let running = Consumer::builder(amqp_url(), inbox.clone())
        .bind(t.topology.clone(), handler.clone())
        .start()
        .await
        .unwrap();
    t.send(&Msg::new("b", "1"), PublishOptions::default()).await;
    t.send(&Msg::new("b", "1"), PublishOptions::default()).await;
    t.send_bytes(b"not json", PublishOptions::default()).await;
    let settle = |settle: &str| {
        count(&format!(
            "idem_rabbitmq_deliveries_total{{queue={queue},settle={settle}}}"
        ))
    };
    t.broker
        .eventually(
            "three settlements counted",
            Duration::from_secs(30),
            || async { settle("acked") + settle("duplicate") + settle("dead-lettered") == 3 },
        )
        .await;
    assert_eq!(
        (
            settle("acked"),
            settle("duplicate"),
            settle("dead-lettered")
        ),
        (1, 1, 1)
    );
    running.shutdown().await;
}

/// A naturally idempotent handler keeps no record, and keeps the metrics: every copy is counted
/// as processed, its duration recorded, and its failure counted by its code.
#[idempotent(key = msg.id, consumer = "observed.natural", mode = natural)]
async fn touch(msg: Msg) -> Result<(), std::io::Error> {
    match msg.body.as_str() {
        "fail" => Err(std::io::Error::other("failing on purpose")),
        _ => Ok(()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn natural_runs_are_counted_as_every_run_is() {
    counters();
    let t = Fixture::new().await;
    let meta = Metadata::default();
    let handler = touch_handler();
    for _ in 0..2 {
        let done = t.inbox.process(&handler, Msg::new("n-1", "1"), &meta).await;
        assert_eq!(done.unwrap(), Outcome::Processed(()));
    }
    let failed = t
        .inbox
        .process(&handler, Msg::new("n-2", "fail"), &meta)
        .await;
    assert_eq!(failed.unwrap_err().code(), "handler-error");
    let outcome = |outcome: &str| {
        count(&format!(
            "idem_messages_total{{consumer=observed.natural,outcome={outcome}}}"
        ))
    };
    assert_eq!((outcome("processed"), outcome("duplicate")), (2, 0));
    assert_eq!(outcome("handler-error"), 1);
    let durations =
        recorded("idem_processing_duration_seconds{consumer=observed.natural,outcome=processed}");
    assert_eq!(durations.len(), 2);
}

/// Each duplicate records how long before its key's record was completed, once, when its result
/// is settled: one at a time, in a batch (run twice here: a failing handler on PostgreSQL rolls
/// the first try back), and a copy in its original's batch (zero).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicates_record_their_age() {
    counters();
    let t = Fixture::builder().build().await;
    let inbox = &t.inbox;
    let consumer = unique("aged");
    let handler = t.recorder(&consumer);
    let meta = Metadata::default();
    inbox
        .process(&handler, Msg::new("a", "1"), &meta)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let again = inbox.process(&handler, Msg::new("a", "1"), &meta).await;
    assert!(again.unwrap().is_duplicate());
    let item = |id: &str| BatchItem {
        key: MessageKey::new(id),
        message: Msg::new(id, "1"),
        metadata: Metadata::default(),
    };
    // The first handler to run ("0", first in key order) fails: the batch runs again.
    handler.fail_next(1);
    let results = inbox
        .process_batch(&handler, vec![item("a"), item("b"), item("b"), item("0")])
        .await;
    let duplicates = results
        .iter()
        .filter(|result| matches!(result, Ok(outcome) if outcome.is_duplicate()))
        .count();
    assert_eq!(duplicates, 2, "{results:?}");
    assert!(results[3].is_err(), "{results:?}");
    let mut ages = recorded(&format!(
        "idem_duplicate_age_seconds{{consumer={consumer}}}"
    ));
    ages.sort_by(f64::total_cmp);
    assert_eq!(ages.len(), 3, "one age per duplicate: {ages:?}");
    assert!(ages[0] < 1.0, "the copy in its original's batch: {ages:?}");
    for age in &ages[1..] {
        assert!((1.0..60.0).contains(age), "an age of {age} s");
    }
}

/// A consumer's gauges: its deliveries in flight while their handlers run, and its session's
/// connection, 0 while the broker is cut off and 1 again once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gauges_follow_the_deliveries_in_flight_and_the_connection() {
    counters();
    let t = Fixture::new().await;
    let proxy = Proxy::start(&amqp_addr()).await;
    let consumer = unique("gauged");
    let handler = t.recorder(&consumer).slow(Duration::from_millis(1_500));
    let running = consumer_builder_at(&amqp_url_through(&proxy), &t.inbox, &consumer)
        .reconnect_delay(Duration::from_millis(100))
        .bind_with(t.binding(handler))
        .start()
        .await
        .expect("the consumer starts");
    let in_flight = format!("idem_rabbitmq_in_flight{{queue={}}}", t.queue);
    let connected = format!("idem_rabbitmq_connected{{queue={}}}", t.queue);
    assert_eq!(gauge(&connected), Some(1.0));
    for i in 0..3 {
        t.send(&Msg::new(format!("m{i}"), "x"), PublishOptions::default())
            .await;
    }
    wait_for_gauge(&in_flight, 3.0, Duration::from_secs(10)).await;
    wait_for_gauge(&in_flight, 0.0, Duration::from_secs(20)).await;
    assert_eq!(t.effects("1 = 1").await, 3);
    let durations = recorded(&format!(
        "idem_processing_duration_seconds{{consumer={consumer},outcome=processed}}"
    ));
    assert_eq!(durations.len(), 3, "{durations:?}");
    assert!(
        durations.iter().all(|d| (1.5..60.0).contains(d)),
        "{durations:?}"
    );

    proxy.cut().await;
    wait_for_gauge(&connected, 0.0, Duration::from_secs(30)).await;
    proxy.restore();
    wait_for_gauge(&connected, 1.0, Duration::from_secs(60)).await;
    running.shutdown().await;
    assert_eq!(gauge(&connected), Some(0.0));
}

/// A batch's size and duration are recorded once per transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_record_their_size_and_duration() {
    counters();
    let t = Fixture::new().await;
    let consumer = unique("batched");
    let handler = t.recorder(&consumer);
    let item = |id: &str| BatchItem {
        key: MessageKey::new(id),
        message: Msg::new(id, "1"),
        metadata: Metadata::default(),
    };
    let results = t
        .inbox
        .process_batch(&handler, vec![item("a"), item("b"), item("c")])
        .await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let results = t.inbox.process_batch(&handler, vec![item("a")]).await;
    assert!(results[0].as_ref().unwrap().is_duplicate());
    assert_eq!(
        recorded(&format!("idem_batch_size{{consumer={consumer}}}")),
        [3.0, 1.0]
    );
    assert_eq!(
        recorded(&format!(
            "idem_batch_duration_seconds{{consumer={consumer}}}"
        ))
        .len(),
        2
    );
}

/// A copy that comes after its record expired is processed again and counted as late, once
/// however often it is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn late_duplicates_are_counted() {
    counters();
    let t = Fixture::new().await;
    let consumer = unique("late");
    let handler = t.recorder(&consumer);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let completed = now - 600_000;
    t.db.exec(&format!(
        "INSERT INTO {} (consumer, message_key, status, attempts, claim_token, created_at, \
         claimed_at, completed_at, expires_at) VALUES ('{consumer}', 'k', 'completed', 1, 0, \
         {completed}, {completed}, {completed}, {})",
        t.inbox.table(),
        now - 1_000
    ))
    .await;
    // The first try fails and rolls back; its retry is the same late copy.
    handler.fail_next(1);
    let meta = Metadata::default();
    assert!(
        t.inbox
            .process(&handler, Msg::new("k", "1"), &meta)
            .await
            .is_err()
    );
    let outcome = t.inbox.process(&handler, Msg::new("k", "1"), &meta).await;
    assert!(!outcome.unwrap().is_duplicate());
    let late = format!("idem_late_duplicates_total{{consumer={consumer}}}");
    assert_eq!(count(&late), 1);
}

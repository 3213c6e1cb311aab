//! The billing demo (`billing --demo N`): publishes N orders to a running billing service,
//! waits until billing has charged them, its outbox relay has published their `InvoiceIssued`
//! events and, with a notifications provider, each order was notified; then reports what the
//! run did and checks it.
//!
//! The report counts this run only. The queues are shared, and their other messages are
//! processed as they should be (events that other billing processes published while no
//! notifications service ran, orders an earlier run left), but they are not this run's:
//!
//! - its orders and invoices are told by the run's id, the prefix of their order ids;
//! - its events by the message ids derived from its orders, which the outbox table holds;
//! - its notifications by the idempotency keys derived from its orders, which the provider
//!   saw ([`Stub::calls_with`]).
//!
//! Only the consumer's counters (duplicates skipped, dead letters) cannot tell runs apart: the
//! report gives them with the number of messages billing's queue held before the run
//! (`earlier_messages`), which they may include.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

use idem_rabbitmq::lapin::options::QueueDeclareOptions;
use idem_rabbitmq::lapin::types::FieldTable;
use idem_rabbitmq::running::DeliveryStats;
use idem_rabbitmq::{AmqpUrl, Consumer, Publisher};
use idem_runtime::outbox::Outbox;
use sea_orm::DatabaseConnection;
use serde::Serialize;

use crate::orders::{self, DemoPlan};
use crate::progress::Progress;
use crate::stub::{KeyedCalls, Stub};
use crate::{amqp_error, billing, notifications};

/// Any error of a demo run, with the message it prints.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a run may take, from its last order published to its last notification.
pub const WAIT: Duration = Duration::from_secs(120);

/// The running services a demo watches.
#[derive(Debug, Clone, Copy)]
pub struct Services<'a> {
    /// Billing's consumer.
    pub consumer: &'a Consumer,
    /// Billing's outbox, whose table tells which events were published.
    pub outbox: &'a Outbox,
    /// Billing's database, with the invoices.
    pub db: &'a DatabaseConnection,
    /// The loopback provider the notifications service calls; `None` with a provider of the
    /// user's, whose calls are not measured.
    pub stub: Option<&'a Stub>,
}

/// What a demo run publishes, and where.
#[derive(Debug, Clone, Copy)]
pub struct Settings<'a> {
    /// The broker.
    pub amqp_url: &'a AmqpUrl,
    /// The exchange orders are published to.
    pub exchange: &'a str,
    /// The queue billing consumes.
    pub queue: &'a str,
    /// How many orders to publish.
    pub count: usize,
    /// Print the report as one JSON object rather than a summary.
    pub json: bool,
}

/// Runs a demo: publishes `settings.count` orders, waits until they went through every hop,
/// prints the report and checks it.
///
/// # Errors
///
/// The broker or the database failed, the run did not finish within [`WAIT`], or the report
/// shows a lost order, a missing dead letter or an order notified other than once.
pub async fn run(services: Services<'_>, settings: Settings<'_>) -> Result<(), BoxError> {
    let earlier_messages = ready_messages(settings.amqp_url, settings.queue).await?;
    let before = services.consumer.stats();
    let progress = Arc::new(DemoProgress::default());
    let line = Progress::start({
        let progress = Arc::clone(&progress);
        let count = settings.count;
        move || progress.line(count)
    });
    let plan = publish_orders(settings, &progress.published).await?;
    let ids = RunIds::of(&plan);
    let due = Due {
        invoices: ids.events.len() as i64,
        settled: earlier_messages + plan.deliveries as u64,
    };
    progress.expected.store(due.invoices, Ordering::Relaxed);
    let measured = wait_until_done(services, &ids, before, due, &progress).await?;
    line.finish();
    let report = Report::new(&plan, earlier_messages, &measured, services.stub.is_some());
    if settings.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_summary(settings.queue, &report);
    }
    check(&report, due.invoices, services.stub.is_some())
}

/// How many messages are ready in `queue`: those an earlier run, or an orders service with no
/// billing running, left there.
async fn ready_messages(amqp_url: &AmqpUrl, queue: &str) -> Result<u64, idem_rabbitmq::Error> {
    let connection = idem_rabbitmq::amqp::connect(amqp_url, "billing demo").await?;
    let channel = connection.create_channel().await;
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let declared = match channel {
        Ok(channel) => channel
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await
            .map_err(amqp_error(format!("counting the messages of {queue:?}"))),
        Err(error) => Err(amqp_error("channel.open")(error)),
    };
    let _ = idem_rabbitmq::amqp::close_within(&connection, "counted", Duration::from_secs(5)).await;
    Ok(u64::from(declared?.message_count()))
}

async fn publish_orders(
    settings: Settings<'_>,
    published: &AtomicUsize,
) -> Result<DemoPlan, idem_rabbitmq::Error> {
    let publisher = Publisher::connect(settings.amqp_url.clone()).await?;
    let plan = orders::publish_demo(&publisher, settings.exchange, settings.count, published).await;
    publisher.close().await;
    plan
}

/// What tells this run's effects from the others': its order ids' prefix, and what derives
/// from each valid order.
#[derive(Debug)]
struct RunIds {
    prefix: String,
    /// The message ids of the `InvoiceIssued` events of its valid orders.
    events: Vec<String>,
    /// The `Idempotency-Key`s of their notifications.
    notifications: Vec<String>,
}

impl RunIds {
    fn of(plan: &DemoPlan) -> Self {
        let derive = |id_of: fn(&str) -> Option<String>| -> Vec<String> {
            plan.valid.iter().filter_map(|order| id_of(order)).collect()
        };
        Self {
            prefix: plan.run.clone(),
            events: derive(billing::invoice_event_id),
            notifications: derive(notifications::idempotency_key),
        }
    }
}

/// When a run is done: every valid order invoiced, and as many deliveries settled as the run
/// published and the queue held before.
#[derive(Debug, Clone, Copy)]
struct Due {
    invoices: i64,
    settled: u64,
}

/// What the services did for this run, as last measured.
#[derive(Debug, Clone, Copy, Default)]
struct Measured {
    invoices: i64,
    /// Counted only once every order is invoiced: a statement per 500 orders.
    events_published: u64,
    /// The provider's calls with this run's keys.
    notified: Option<KeyedCalls>,
    /// The consumer's counters since the run began: deliveries that left the queue, and among
    /// them duplicates and dead letters.
    settled: u64,
    duplicates: u64,
    dead_lettered: u64,
}

impl Measured {
    fn is_done(&self, due: Due) -> bool {
        let expected = due.invoices as u64;
        self.invoices >= due.invoices
            && self.settled >= due.settled
            && self.events_published >= expected
            && self
                .notified
                .is_none_or(|calls| calls.distinct_keys >= expected)
    }
}

async fn measure(
    services: Services<'_>,
    ids: &RunIds,
    before: DeliveryStats,
    due: Due,
) -> Result<Measured, sea_orm::DbErr> {
    let invoices = billing::count_invoices(services.db, &ids.prefix).await?;
    let events_published = if invoices >= due.invoices {
        billing::count_events_sent(services.outbox, &ids.events).await?
    } else {
        0
    };
    let now = services.consumer.stats();
    Ok(Measured {
        invoices,
        events_published,
        notified: services
            .stub
            .map(|stub| stub.calls_with(&ids.notifications)),
        settled: settled(&now) - settled(&before),
        duplicates: now.duplicates - before.duplicates,
        dead_lettered: now.dead_lettered - before.dead_lettered,
    })
}

/// Deliveries that left the queue: acknowledged, duplicates, dead-lettered.
fn settled(stats: &DeliveryStats) -> u64 {
    stats.acked + stats.duplicates + stats.dead_lettered
}

async fn wait_until_done(
    services: Services<'_>,
    ids: &RunIds,
    before: DeliveryStats,
    due: Due,
    progress: &DemoProgress,
) -> Result<Measured, BoxError> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let measured = measure(services, ids, before, due).await?;
        progress
            .invoiced
            .store(measured.invoices, Ordering::Relaxed);
        if measured.is_done(due) {
            return Ok(measured);
        }
        if tokio::time::Instant::now() > deadline {
            let notified = measured.notified.unwrap_or_default().distinct_keys;
            return Err(format!(
                "after {WAIT:?}, {} of {} orders are invoiced, {} of {} deliveries settled, {} \
                 events published and {notified} orders notified",
                measured.invoices,
                due.invoices,
                measured.settled,
                due.settled,
                measured.events_published,
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What a demo run did, hop by hop: printed, or as JSON with `--json`.
#[derive(Debug, Serialize)]
struct Report {
    run: String,
    orders: usize,
    messages_published: usize,
    producer_retries: usize,
    reused_ids: usize,
    invalid: usize,
    /// Messages billing's queue held before the run: the consumer's counters may include them.
    earlier_messages: u64,
    invoices: i64,
    duplicates: u64,
    dead_lettered: u64,
    events_published: u64,
    notified: u64,
    /// The provider's calls with this run's keys (more than `notified` if it was called twice
    /// with a key, which it deduplicates).
    stub_calls: u64,
    stub_calls_distinct_keys: u64,
    lost: u64,
}

impl Report {
    fn new(plan: &DemoPlan, earlier_messages: u64, measured: &Measured, stub: bool) -> Self {
        let expected = plan.valid.len() as u64;
        let calls = measured.notified.unwrap_or_default();
        // How far each order went: invoiced, announced, and notified when that is measured.
        let mut reached = (measured.invoices as u64).min(measured.events_published);
        if stub {
            reached = reached.min(calls.distinct_keys);
        }
        Self {
            run: plan.run.clone(),
            orders: plan.orders,
            messages_published: plan.deliveries,
            producer_retries: plan.producer_retries,
            reused_ids: plan.reused_ids,
            invalid: plan.invalid,
            earlier_messages,
            invoices: measured.invoices,
            duplicates: measured.duplicates,
            dead_lettered: measured.dead_lettered,
            events_published: measured.events_published,
            notified: calls.distinct_keys,
            stub_calls: calls.calls,
            stub_calls_distinct_keys: calls.distinct_keys,
            lost: expected.saturating_sub(reached),
        }
    }
}

/// Fails the run when an order is missing at a hop, or was refused but not dead-lettered.
fn check(report: &Report, expected: i64, stub: bool) -> Result<(), BoxError> {
    if report.invoices != expected {
        return Err(format!("expected {expected} invoices, found {}", report.invoices).into());
    }
    if report.events_published != expected as u64 {
        return Err(format!(
            "{} of {expected} invoices announced",
            report.events_published
        )
        .into());
    }
    // The invalid order and the reused id go to the dead-letter queue.
    let refused = (report.invalid + report.reused_ids) as u64;
    if report.dead_lettered < refused {
        return Err(format!(
            "{refused} messages should have been dead-lettered, {} were",
            report.dead_lettered
        )
        .into());
    }
    if stub && report.notified != expected as u64 {
        return Err(format!("{} of {expected} orders notified", report.notified).into());
    }
    Ok(())
}

/// How far a demo run is, for its progress line.
#[derive(Debug, Default)]
struct DemoProgress {
    /// Orders published so far.
    published: AtomicUsize,
    /// Valid orders of the run, once all are published; 0 before.
    expected: AtomicI64,
    /// Orders of the run invoiced, as last counted.
    invoiced: AtomicI64,
}

impl DemoProgress {
    fn line(&self, count: usize) -> String {
        let published = self.published.load(Ordering::Relaxed);
        match self.expected.load(Ordering::Relaxed) {
            0 => format!("billing demo: published {published}/{count} orders"),
            expected => format!(
                "billing demo: published {published}/{count} orders, charged {}/{expected}",
                self.invoiced.load(Ordering::Relaxed)
            ),
        }
    }
}

fn print_summary(queue: &str, report: &Report) {
    println!(
        "billing demo {}: {} orders published as {} messages \
         ({} producer retries, {} reused order id, {} invalid order)",
        report.run,
        report.orders,
        report.messages_published,
        report.producer_retries,
        report.reused_ids,
        report.invalid
    );
    println!(
        "  invoices written     {:>6}   (one per valid order)",
        report.invoices
    );
    println!("  duplicates skipped   {:>6}", report.duplicates);
    println!(
        "  dead-lettered        {:>6}   (queue {queue}.dlq, reason in x-idem-reason)",
        report.dead_lettered
    );
    if report.earlier_messages > 0 {
        println!(
            "  earlier messages     {:>6}   (on {queue} before this run: the two lines above \
             may count theirs)",
            report.earlier_messages
        );
    }
    println!(
        "  events published     {:>6}   (InvoiceIssued, through the outbox)",
        report.events_published
    );
    println!(
        "  notified             {:>6}   (provider calls {}, distinct idempotency keys {})",
        report.notified, report.stub_calls, report.stub_calls_distinct_keys
    );
    println!("  lost                 {:>6}", report.lost);
}

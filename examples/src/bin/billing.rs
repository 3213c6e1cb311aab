//! The billing service: consumes `billing.orders` into the database and charges each order once.
//!
//! `cargo run -p idem-examples --bin billing` consumes until Ctrl-C or SIGTERM;
//! `-- --demo 100` first publishes 100 demo orders, waits until every delivery is settled,
//! checks the invoices and exits (non-zero if anything is off). The environment variables of
//! the crate's docs choose the broker, database, exchange, queue and connection name; while it
//! consumes, the service logs its delivery counters (`billing stats acked=.. duplicates=..`)
//! every `BILLING_STATS_EVERY_MS` when they changed, and once more when it stops.

use std::process::ExitCode;
use std::time::Duration;

use idem_examples::billing::{self, CONSUMER_TIMEOUT, DELIVERY_LIMIT, charge_handler};
use idem_examples::orders::{self, DemoPlan};
use idem_rabbitmq::{Binding, Consumer, ConsumerStats, Publisher};
use idem_runtime::{Inbox, RedeliveryWindow, RetentionPolicy};
use sea_orm::{ConnectOptions, Database, DatabaseConnection};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> ExitCode {
    idem_examples::init_logging();
    let demo = match parse_demo(std::env::args().skip(1)) {
        Ok(demo) => demo,
        Err(usage) => {
            eprintln!("{usage}");
            return ExitCode::from(2);
        }
    };
    match run(demo).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("billing: {error}");
            ExitCode::FAILURE
        }
    }
}

fn parse_demo(mut args: impl Iterator<Item = String>) -> Result<Option<usize>, String> {
    let usage = "usage: billing [--demo N]";
    match (args.next().as_deref(), args.next(), args.next()) {
        (None, _, _) => Ok(None),
        (Some("--demo"), None, None) => Ok(Some(100)),
        (Some("--demo"), Some(n), None) => n.parse().map(Some).map_err(|_| usage.to_owned()),
        _ => Err(usage.to_owned()),
    }
}

async fn run(demo: Option<usize>) -> Result<(), BoxError> {
    let database_url = idem_examples::database_url();
    let amqp_url = idem_examples::amqp_url();
    let exchange = idem_examples::orders_exchange();
    let queue = idem_examples::billing_queue();
    let stats_interval = idem_examples::billing_stats_interval()?;
    let batch = idem_examples::billing_batch()?;
    let mut options = ConnectOptions::new(database_url.as_str());
    options.sqlx_logging(false);
    if database_url.starts_with("sqlite:") {
        options.max_connections(4);
    }
    let db = Database::connect(options).await?;
    billing::create_tables(&db).await?;

    // Records must outlive every redelivery: the broker's delivery limit times its consumer
    // timeout, plus three days in which an operator may resubmit from the dead-letter queue.
    let window = RedeliveryWindow::new(DELIVERY_LIMIT, CONSUMER_TIMEOUT)
        .with_dead_letter_resubmission(Duration::from_secs(3 * 24 * 3600));
    let inbox = Inbox::builder(db.clone())
        .retention(RetentionPolicy::default())
        .redelivery_window(window)
        .build()
        .await?;
    // The consumer also runs the inbox's cleaner, until it stops.
    let binding = Binding::new(billing::topology_on(&queue, &exchange), charge_handler());
    let (binding, prefetch) = match batch {
        // Room for the next batch to gather while one commits.
        Some(size) => (
            binding.batch(size, Duration::from_millis(20)),
            u16::try_from(size * 2).unwrap_or(u16::MAX).max(32),
        ),
        None => (binding, 32),
    };
    let consumer = Consumer::builder(amqp_url.as_str(), inbox)
        .connection_name(idem_examples::billing_connection_name())
        .prefetch(prefetch)
        .bind_with(binding)
        .start()
        .await?;
    tracing::info!(queue, database = %idem_rabbitmq::redact_url(&database_url), "billing is consuming");

    let result = match demo {
        Some(count) => run_demo(&consumer, &db, &amqp_url, &exchange, &queue, count).await,
        None => {
            let mut logged = ConsumerStats::default();
            let mut every = tokio::time::interval(stats_interval);
            let signal = wait_for_signal();
            tokio::pin!(signal);
            loop {
                tokio::select! {
                    _ = &mut signal => break,
                    _ = every.tick() => {
                        let now = consumer.stats();
                        if now != logged {
                            log_stats(&now);
                            logged = now;
                        }
                    }
                }
            }
            Ok(())
        }
    };
    let stats = consumer.stats();
    let report = consumer.shutdown().await;
    log_stats(&stats);
    tracing::info!(
        completed = report.completed,
        abandoned = report.abandoned,
        expired_records_deleted = report.cleanup.map_or(0, |cleanup| cleanup.deleted),
        "billing stopped"
    );
    result
}

/// Logs the consumer's counters in one line of `name=value` fields.
fn log_stats(stats: &ConsumerStats) {
    tracing::info!(
        acked = stats.acked,
        duplicates = stats.duplicates,
        dead_lettered = stats.dead_lettered,
        requeued = stats.requeued,
        settle_lost = stats.settle_lost,
        recoveries = stats.recoveries,
        reconnections = stats.reconnections,
        "billing stats"
    );
}

async fn run_demo(
    consumer: &Consumer,
    db: &DatabaseConnection,
    amqp_url: &str,
    exchange: &str,
    queue: &str,
    count: usize,
) -> Result<(), BoxError> {
    let before = consumer.stats();
    let publisher = Publisher::connect(amqp_url).await?;
    let plan = orders::publish_demo(&publisher, exchange, count).await?;
    publisher.close().await;

    // Done when every valid order of this run is invoiced and as many deliveries as this run
    // published are settled (messages left on the queue by an earlier run may be among them).
    let expected = (plan.orders - plan.invalid) as i64;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let invoices = loop {
        let invoices = billing::count_invoices(db, &plan.run).await?;
        let now = consumer.stats();
        let settled = (now.acked + now.duplicates + now.dead_lettered)
            - (before.acked + before.duplicates + before.dead_lettered);
        if invoices >= expected && settled >= plan.deliveries as u64 {
            break invoices;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "after 120 s, {invoices} of {expected} orders are invoiced and {settled} of {} \
                 deliveries settled",
                plan.deliveries
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let stats = consumer.stats();
    print_summary(
        queue,
        &plan,
        invoices,
        stats.duplicates - before.duplicates,
        stats.dead_lettered - before.dead_lettered,
    );
    if invoices != expected {
        return Err(format!("expected {expected} invoices, found {invoices}").into());
    }
    Ok(())
}

fn print_summary(queue: &str, plan: &DemoPlan, invoices: i64, duplicates: u64, dead_lettered: u64) {
    println!(
        "billing demo {}: {} orders published as {} messages \
         ({} producer retries, {} reused order id, {} invalid order)",
        plan.run,
        plan.orders,
        plan.deliveries,
        plan.producer_retries,
        plan.reused_ids,
        plan.invalid
    );
    println!("  invoices written     {invoices:>6}   (one per valid order)");
    println!("  duplicates skipped   {duplicates:>6}");
    println!(
        "  dead-lettered        {dead_lettered:>6}   (queue {queue}.dlq, reason in x-idem-reason)"
    );
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

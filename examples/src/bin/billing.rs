//! The billing service: consumes `billing.orders` into the database and charges each order once.
//!
//! `cargo run -p idem-examples --bin billing` consumes until Ctrl-C or SIGTERM;
//! `-- --demo 100` first publishes 100 demo orders, waits until every delivery is settled,
//! checks the invoices and exits (non-zero if anything is off). Options, or the environment
//! variables of the crate's docs, choose the broker, database, exchange, queue and connection
//! name (`--help` lists them); while it consumes, the service logs its delivery counters
//! (`billing stats acked=.. duplicates=..`) every `--stats-every-ms` when they changed, and once
//! more when it stops.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

use clap::Parser;
use idem_examples::billing::{self, CONSUMER_TIMEOUT, DELIVERY_LIMIT, charge_handler};
use idem_examples::cli::{
    BrokerArgs, DEFAULT_DATABASE_URL, parse_batch, parse_count, parse_millis,
};
use idem_examples::orders::{self, DemoPlan};
use idem_examples::progress::Progress;
use idem_rabbitmq::{Binding, Consumer, ConsumerStats, Publisher};
use idem_runtime::{Inbox, MAX_BATCH, RedeliveryWindow, RetentionPolicy};
use sea_orm::{ConnectOptions, Database, DatabaseConnection};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Consumes orders from RabbitMQ into the database and charges each one exactly once, whatever
/// the broker redelivers; until Ctrl-C or SIGTERM, or with `--demo`, for one checked run.
#[derive(Debug, Parser)]
#[command(name = "billing")]
struct Args {
    /// Publish N demo orders (100 if N is left out), wait until each is settled, print and
    /// check the invoices, and exit
    #[arg(
        long,
        value_name = "N",
        num_args = 0..=1,
        default_missing_value = "100",
        value_parser = parse_count,
    )]
    demo: Option<usize>,

    #[command(flatten)]
    broker: BrokerArgs,

    /// The database: SQLite, PostgreSQL or MySQL
    #[arg(long, value_name = "URL", env = "DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
    // The value may hold a password: `--help` must not print it.
    #[arg(hide_env_values = true)]
    database_url: String,

    /// The quorum queue to consume; its dead letters go to <QUEUE>.dlq
    #[arg(long, env = "BILLING_QUEUE", default_value = billing::QUEUE)]
    queue: String,

    /// The name the broker connections carry (`rabbitmqctl list_connections client_properties`)
    #[arg(
        long,
        value_name = "NAME",
        env = "BILLING_CONNECTION_NAME",
        default_value = "billing"
    )]
    connection_name: String,

    /// How often to log the delivery counters (`billing stats`) when they changed, in
    /// milliseconds
    #[arg(
        long = "stats-every-ms",
        value_name = "MS",
        env = "BILLING_STATS_EVERY_MS",
        default_value = "60000",
        value_parser = parse_millis,
    )]
    stats_every: Duration,

    #[arg(
        long,
        help = format!(
            "Process up to N deliveries per transaction, from 1 to {MAX_BATCH}; one at a time \
             without it"
        ),
        value_name = "N",
        env = "BILLING_BATCH",
        value_parser = parse_batch,
    )]
    batch: Option<usize>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    idem_examples::init_logging();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("billing: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), BoxError> {
    let Args {
        demo,
        broker: BrokerArgs {
            amqp_url, exchange, ..
        },
        database_url,
        queue,
        connection_name,
        stats_every,
        batch,
    } = args;
    tracing::info!(
        broker = %idem_rabbitmq::redact_url(&amqp_url),
        database = %idem_rabbitmq::redact_url(&database_url),
        exchange,
        queue,
        connection_name,
        batch = batch.unwrap_or(1),
        "billing starting"
    );
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
        .connection_name(connection_name)
        .prefetch(prefetch)
        .bind_with(binding)
        .start()
        .await?;
    tracing::info!(queue, database = %idem_rabbitmq::redact_url(&database_url), "billing is consuming");

    let result = match demo {
        Some(count) => run_demo(&consumer, &db, &amqp_url, &exchange, &queue, count).await,
        None => {
            let mut logged = ConsumerStats::default();
            let mut every = tokio::time::interval(stats_every);
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
    let demo = Arc::new(DemoProgress::default());
    let progress = Progress::start({
        let demo = Arc::clone(&demo);
        move || demo.line(count)
    });
    let publisher = Publisher::connect(amqp_url).await?;
    let plan = orders::publish_demo(&publisher, exchange, count, &demo.published).await?;
    publisher.close().await;

    // Done when every valid order of this run is invoiced and as many deliveries as this run
    // published are settled (messages left on the queue by an earlier run may be among them).
    let expected = (plan.orders - plan.invalid) as i64;
    demo.expected.store(expected, Ordering::Relaxed);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let invoices = loop {
        let invoices = billing::count_invoices(db, &plan.run).await?;
        demo.invoiced.store(invoices, Ordering::Relaxed);
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
    progress.finish();
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

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
use idem_examples::billing::{self, Billing, CONSUMER_TIMEOUT, DELIVERY_LIMIT};
use idem_examples::cli::{
    BrokerArgs, DEFAULT_DATABASE_URL, parse_batch, parse_count, parse_millis,
};
use idem_examples::notifications;
use idem_examples::orders;
use idem_examples::progress::Progress;
use idem_examples::stub::Stub;
use idem_rabbitmq::lapin::ExchangeKind;
use idem_rabbitmq::{Binding, Consumer, ConsumerStats, Publisher, Relay, RelayHandle};
use idem_runtime::{BatchChecks, Inbox, MAX_BATCH, Outbox, RedeliveryWindow, RetentionPolicy};
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

    /// The quorum queue to consume; its dead letters go to `<QUEUE>.dlq`
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

    /// With --batch: check each batch's transaction once, before its commit, instead of after
    /// each message (billing's handler returns every database error and never ends its
    /// transaction)
    #[arg(long, env = "BILLING_TRUST_HANDLERS", requires_if("true", "batch"))]
    trust_handlers: bool,

    /// With --batch: charge each batch's fresh orders in one call, their invoices in one
    /// multi-row insert (the slice handler `charge_all`)
    #[arg(
        long,
        env = "BILLING_SLICES",
        requires_if("true", "batch"),
        conflicts_with = "trust_handlers"
    )]
    slices: bool,

    /// The exchange billing publishes `InvoiceIssued` events to, through its outbox
    #[arg(
        long,
        value_name = "NAME",
        env = "BILLING_EVENTS_EXCHANGE",
        default_value = billing::EVENTS_EXCHANGE
    )]
    events_exchange: String,

    /// Also run the notifications service in this process, calling the provider at URL
    /// (`http://host:port/path`); the demo runs it against a loopback stub of its own
    #[arg(long, value_name = "URL", env = "NOTIFICATIONS_PROVIDER_URL")]
    provider_url: Option<String>,

    /// The quorum queue the notifications service consumes, bound to the events exchange
    #[arg(long, value_name = "QUEUE", env = "NOTIFICATIONS_QUEUE", default_value = notifications::QUEUE)]
    notifications_queue: String,

    /// With --demo: print the report as one JSON object on standard output
    #[arg(long, requires = "demo")]
    json: bool,
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
        trust_handlers,
        slices,
        events_exchange,
        provider_url,
        notifications_queue,
        json,
    } = args;
    tracing::info!(
        broker = %idem_rabbitmq::redact_url(&amqp_url),
        database = %idem_rabbitmq::redact_url(&database_url),
        exchange,
        queue,
        connection_name,
        batch = batch.unwrap_or(1),
        trust_handlers,
        slices,
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
    // Events are staged in the outbox with the invoices, and the relay publishes them.
    let outbox = Outbox::builder(db.clone()).build().await?;
    let inbox = Inbox::builder(db.clone())
        .retention(RetentionPolicy::default())
        .redelivery_window(window)
        .outbox(outbox.clone())
        .build()
        .await?;
    let publisher = Publisher::connect(amqp_url.as_str()).await?;
    publisher
        .declare_exchange(&events_exchange, ExchangeKind::Topic)
        .await?;
    publisher.close().await;
    let relay = Relay::builder(amqp_url.as_str(), outbox)
        .connection_name(format!("{connection_name} relay"))
        .start()
        .await?;
    // The consumer also runs the inbox's cleaner, until it stops.
    let service = Arc::new(Billing {
        events_exchange: events_exchange.clone(),
    });
    let topology = billing::topology_on(&queue, &exchange);
    let consumer = Consumer::builder(amqp_url.as_str(), inbox.clone())
        .connection_name(connection_name.clone())
        // Room for the next batch to gather while one commits.
        .prefetch(batch.map_or(32, |size| {
            u16::try_from(size * 2).unwrap_or(u16::MAX).max(32)
        }));
    let wait = Duration::from_millis(20);
    let consumer = match batch {
        Some(size) if slices => consumer
            .bind_with(Binding::new(topology, service.charge_all_handler()).slices(size, wait)),
        Some(size) => consumer.bind_with(
            Binding::new(topology, service.charge_handler())
                .batch(size, wait)
                .batch_checks(if trust_handlers {
                    BatchChecks::BeforeCommit
                } else {
                    BatchChecks::EachMessage
                }),
        ),
        None => consumer.bind_with(Binding::new(topology, service.charge_handler())),
    }
    .start()
    .await?;
    // The notifications hop: against the given provider, or in the demo a stub of its own.
    let stub = match (&provider_url, demo) {
        (None, Some(_)) => Some(Stub::start("127.0.0.1:0").await?),
        _ => None,
    };
    let provider = provider_url.or_else(|| stub.as_ref().map(Stub::notify_url));
    let notifier = match provider {
        Some(provider) => Some(
            notifications::start(
                &amqp_url,
                inbox,
                &notifications_queue,
                &events_exchange,
                provider,
                &format!("{connection_name} notifications"),
            )
            .await?,
        ),
        None => None,
    };
    tracing::info!(queue, database = %idem_rabbitmq::redact_url(&database_url), "billing is consuming");

    let result = match demo {
        Some(count) => {
            let hops = Hops {
                consumer: &consumer,
                relay: &relay,
                stub: stub.as_ref(),
            };
            run_demo(&hops, &db, &amqp_url, &exchange, &queue, count, json).await
        }
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
    if let Some(notifier) = notifier {
        notifier.shutdown().await;
    }
    let relayed = relay.shutdown().await;
    log_stats(&stats);
    tracing::info!(events_published = relayed.published, "relay stopped");
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

/// What a demo run watches: billing's consumer, its relay, and the notifications provider.
struct Hops<'a> {
    consumer: &'a Consumer,
    relay: &'a RelayHandle,
    stub: Option<&'a Stub>,
}

/// How many of `orders` the provider stub was called for, by the key derived from each.
fn notified_orders(stub: &Stub, orders: &[String]) -> u64 {
    let keys = stub.keys();
    orders
        .iter()
        .filter_map(|order| notifications::idempotency_key(order))
        .filter(|key| keys.contains(key))
        .count() as u64
}

/// What a demo run did, hop by hop: printed, or as JSON with `--json`.
#[derive(Debug, serde::Serialize)]
struct Report {
    run: String,
    orders: usize,
    messages_published: usize,
    producer_retries: usize,
    reused_ids: usize,
    invalid: usize,
    invoices: i64,
    duplicates: u64,
    events_published: u64,
    notified: u64,
    stub_calls: u64,
    stub_calls_distinct_keys: u64,
    dead_lettered: u64,
    lost: u64,
}

async fn run_demo(
    hops: &Hops<'_>,
    db: &DatabaseConnection,
    amqp_url: &str,
    exchange: &str,
    queue: &str,
    count: usize,
    json: bool,
) -> Result<(), BoxError> {
    let before = hops.consumer.stats();
    let relayed_before = hops.relay.stats().published;
    let stub_before = hops.stub.map(Stub::stats).unwrap_or_default();
    let demo = Arc::new(DemoProgress::default());
    let progress = Progress::start({
        let demo = Arc::clone(&demo);
        move || demo.line(count)
    });
    let publisher = Publisher::connect(amqp_url).await?;
    let plan = orders::publish_demo(&publisher, exchange, count, &demo.published).await?;
    publisher.close().await;

    // Done when every valid order of this run is invoiced, as many deliveries as this run
    // published are settled (messages left on the queue by an earlier run may be among them),
    // and, with the notifications hop, every invoice is notified.
    let expected = (plan.orders - plan.invalid) as i64;
    demo.expected.store(expected, Ordering::Relaxed);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let invoices = loop {
        let invoices = billing::count_invoices(db, &plan.run).await?;
        demo.invoiced.store(invoices, Ordering::Relaxed);
        let now = hops.consumer.stats();
        let settled = (now.acked + now.duplicates + now.dead_lettered)
            - (before.acked + before.duplicates + before.dead_lettered);
        let notified = hops
            .stub
            .map_or(expected as u64, |stub| notified_orders(stub, &plan.valid));
        if invoices >= expected && settled >= plan.deliveries as u64 && notified >= expected as u64
        {
            break invoices;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "after 120 s, {invoices} of {expected} orders are invoiced, {settled} of {} \
                 deliveries settled and {notified} invoices notified",
                plan.deliveries
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    progress.finish();
    let stats = hops.consumer.stats();
    let stub = hops.stub.map(Stub::stats).unwrap_or_default();
    let distinct_keys = stub.distinct_keys - stub_before.distinct_keys;
    // This run's orders notified: the provider saw each one's key (events an earlier run left
    // on the queue may be notified too, and counted among the calls).
    let notified = hops
        .stub
        .map_or(0, |stub| notified_orders(stub, &plan.valid));
    let report = Report {
        run: plan.run.clone(),
        orders: plan.orders,
        messages_published: plan.deliveries,
        producer_retries: plan.producer_retries,
        reused_ids: plan.reused_ids,
        invalid: plan.invalid,
        invoices,
        duplicates: stats.duplicates - before.duplicates,
        events_published: hops.relay.stats().published - relayed_before,
        notified,
        stub_calls: stub.calls - stub_before.calls,
        stub_calls_distinct_keys: distinct_keys,
        dead_lettered: stats.dead_lettered - before.dead_lettered,
        // With an outside provider, notifications are not measured: invoices are as far as it
        // goes.
        lost: (expected as u64).saturating_sub(match hops.stub {
            Some(_) => notified.min(invoices as u64),
            None => invoices as u64,
        }),
    };
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_summary(queue, &report);
    }
    if invoices != expected {
        return Err(format!("expected {expected} invoices, found {invoices}").into());
    }
    // The invalid order and the reused id go to the dead-letter queue (messages an earlier run
    // left on the queue may add to them).
    let refused = (plan.invalid + plan.reused_ids) as u64;
    if report.dead_lettered < refused {
        return Err(format!(
            "{refused} messages should have been dead-lettered, {} were",
            report.dead_lettered
        )
        .into());
    }
    if hops.stub.is_some() && notified != expected as u64 {
        return Err(format!("{notified} of {expected} orders notified").into());
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

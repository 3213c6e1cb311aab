//! The billing service: consumes `billing.orders` into the database and charges each order once.
//!
//! `cargo run -p idem-examples --bin billing` consumes until Ctrl-C or SIGTERM;
//! `-- --demo 100` first publishes 100 demo orders, waits until every delivery is settled,
//! checks the invoices and exits (non-zero if anything is off). Options, or the environment
//! variables of the crate's docs, choose the broker, database, exchange, queue and connection
//! name (`--help` lists them); while it consumes, the service logs its delivery counters
//! (`billing stats acked=.. duplicates=..`) every `--stats-every-ms` when they changed, and once
//! more when it stops.
//!
//! `run` is the service, step by step: open the database, the inbox and the outbox; declare
//! the events exchange; start the relay, the consumer and (with a provider, or in the demo)
//! the notifications service; then consume until a signal, or run the demo; then stop, in
//! order.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use idem_examples::billing::{self, Billing, CONSUMER_TIMEOUT, DELIVERY_LIMIT};
use idem_examples::cli::{
    BrokerArgs, DEFAULT_DATABASE_URL, parse_batch, parse_count, parse_millis,
};
use idem_examples::demo::{self, BoxError};
use idem_examples::notifications;
use idem_examples::stub::Stub;
use idem_rabbitmq::lapin::ExchangeKind;
use idem_rabbitmq::running::DeliveryStats;
use idem_rabbitmq::{AmqpUrl, Binding, Consumer, Relay};
use idem_runtime::outbox::Outbox;
use idem_runtime::retention::RedeliveryWindow;
use idem_runtime::transport::BatchChecks;
use idem_runtime::{Inbox, RetentionPolicy, transport::MAX_BATCH};
use sea_orm::DatabaseConnection;

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

    /// Where the key of a charged order lives: `inbox` (an inbox record beside the invoice) or
    /// `entity` (the invoice itself, keyed by its order, in `invoices_by_order`)
    #[arg(
        long,
        value_enum,
        env = "BILLING_KEYS",
        default_value = "inbox",
        conflicts_with = "batch"
    )]
    keys: Keys,

    /// With --batch: check each batch's transaction after each message rather than once before
    /// its commit, for handlers not trusted to return every database error and leave their
    /// transaction open (billing's handler does both)
    #[arg(long, env = "BILLING_CHECK_EACH_HANDLER", requires_if("true", "batch"))]
    check_each_handler: bool,

    /// With --batch: charge each batch's fresh orders in one call, their invoices in one
    /// multi-row insert (the slice handler `charge_all`)
    #[arg(
        long,
        env = "BILLING_SLICES",
        requires_if("true", "batch"),
        conflicts_with = "check_each_handler"
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

    #[arg(
        long,
        value_name = "QUEUE",
        env = "NOTIFICATIONS_QUEUE",
        default_value = notifications::QUEUE,
        help = format!(
            "The quorum queue the notifications service declares, bound to the events exchange \
             and holding at most {} events, and consumes",
            notifications::MAX_LENGTH
        ),
    )]
    notifications_queue: String,

    /// How long a notification's claim stays the claimer's while it calls the provider, in
    /// milliseconds; the handler's own (30 s) without it. A process killed in the call holds
    /// that notification for as long
    #[arg(
        long = "notifications-lease-ms",
        value_name = "MS",
        env = "NOTIFICATIONS_LEASE_MS",
        value_parser = parse_millis,
    )]
    notifications_lease: Option<Duration>,

    /// With --demo: print the report as one JSON object on standard output
    #[arg(long, requires = "demo")]
    json: bool,

    /// Serve Prometheus metrics at ADDR (e.g. 127.0.0.1:9464; any path answers, /metrics by
    /// convention)
    #[arg(long, value_name = "ADDR", env = "BILLING_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
}

/// Where the key of a charged order lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Keys {
    /// An inbox record beside the invoice.
    Inbox,
    /// The invoice itself, keyed by its order (entity mode).
    Entity,
}

fn main() -> ExitCode {
    idem_examples::run_service(async {
        let args = Args::parse();
        idem_examples::init_logging();
        match run(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("billing: {error}");
                ExitCode::FAILURE
            }
        }
    })
}

/// The service: its parts started one after the other, then its work, then its stop.
async fn run(args: Args) -> Result<(), BoxError> {
    log_settings(&args);
    if let Some(addr) = args.metrics_addr {
        idem_examples::metrics::serve(addr)
            .map_err(|error| format!("cannot serve metrics at {addr}: {error}"))?;
        tracing::info!(%addr, "serving Prometheus metrics");
    }
    // A signal while the service starts (a broker or database slow to answer) stops it there,
    // dropping what had started; later, it stops the service (or the demo) in order.
    let signal = idem_examples::cli::wait_for_signal();
    tokio::pin!(signal);
    let started = tokio::select! {
        started = start(&args) => started?,
        () = &mut signal => {
            tracing::info!("billing stopped before it started consuming");
            return Ok(());
        }
    };
    let Started {
        db,
        outbox,
        broker,
        relay,
        consumer,
        notifications,
    } = started;
    tracing::info!(
        queue = args.queue,
        database = %idem_rabbitmq::amqp::redact_url(&args.database_url),
        "billing is consuming"
    );

    let result = match args.demo {
        Some(count) => {
            let services = demo::Services {
                consumer: &consumer,
                outbox: &outbox,
                db: &db,
                stub: notifications.stub.as_ref(),
            };
            tokio::select! {
                result = demo::run(services, demo_settings(&args, &broker, count)) => result,
                () = &mut signal => Err("the demo was interrupted".into()),
            }
        }
        None => {
            log_stats_until_signal(&consumer, args.stats_every, signal).await;
            Ok(())
        }
    };
    stop(consumer, notifications, relay).await;
    result
}

/// What [`start`] started.
struct Started {
    db: DatabaseConnection,
    outbox: Outbox,
    broker: AmqpUrl,
    relay: Relay,
    consumer: Consumer,
    notifications: NotificationsHop,
}

/// The service's parts, started one after the other.
async fn start(args: &Args) -> Result<Started, BoxError> {
    let db = idem_examples::cli::connect_database(&args.database_url).await?;
    billing::create_tables(&db).await?;
    let (inbox, outbox) = open_inbox(&db, args.notifications_lease).await?;
    let broker = args.broker.url()?;
    declare_events_exchange(args, &broker).await?;
    let relay = start_relay(args, &broker, outbox.clone()).await?;
    let consumer = start_consumer(args, &broker, inbox.clone()).await?;
    let notifications = start_notifications(args, &broker, inbox).await?;
    Ok(Started {
        db,
        outbox,
        broker,
        relay,
        consumer,
        notifications,
    })
}

fn log_settings(args: &Args) {
    tracing::info!(
        broker = %idem_rabbitmq::amqp::redact_url(&args.broker.amqp_url),
        database = %idem_rabbitmq::amqp::redact_url(&args.database_url),
        exchange = args.broker.exchange,
        queue = args.queue,
        connection_name = args.connection_name,
        batch = args.batch.unwrap_or(1),
        check_each_handler = args.check_each_handler,
        slices = args.slices,
        keys = ?args.keys,
        "billing starting"
    );
}

/// The inbox, with the outbox beside it: events are staged in the outbox with the invoices,
/// and the relay publishes them.
async fn open_inbox(
    db: &DatabaseConnection,
    notifications_lease: Option<Duration>,
) -> Result<(Inbox, Outbox), BoxError> {
    // Records must outlive every redelivery: the broker's delivery limit times its consumer
    // timeout, plus three days in which an operator may resubmit from the dead-letter queue.
    let window = RedeliveryWindow::new(DELIVERY_LIMIT, CONSUMER_TIMEOUT)
        .with_dead_letter_resubmission(Duration::from_secs(3 * 24 * 3600));
    let outbox = Outbox::builder(db.clone()).build().await?;
    let mut inbox = Inbox::builder(db.clone())
        .retention(RetentionPolicy::default())
        .redelivery_window(window)
        .outbox(outbox.clone());
    if let Some(lease) = notifications_lease {
        inbox = inbox.lease(notifications::CONSUMER, lease);
    }
    let inbox = inbox.build().await?;
    Ok((inbox, outbox))
}

/// Billing owns the exchange it publishes its events to, and declares it; the queues bound to
/// it belong to the services that read them (see `idem_examples::notifications`).
async fn declare_events_exchange(args: &Args, broker: &AmqpUrl) -> Result<(), BoxError> {
    // The first contact with the broker: a demo gives up after a bounded wait, a service waits.
    let wait = args.demo.map(|_| args.broker.broker_wait);
    let publisher = idem_examples::broker::reach(broker, wait).await?;
    let declared = publisher
        .declare_exchange(&args.events_exchange, ExchangeKind::Topic)
        .await;
    publisher.close().await;
    Ok(declared?)
}

async fn start_relay(args: &Args, broker: &AmqpUrl, outbox: Outbox) -> Result<Relay, BoxError> {
    Ok(Relay::builder(broker.clone(), outbox)
        .connection_name(format!("{} relay", args.connection_name))
        .start()
        .await?)
}

/// The consumer of billing's queue, charging one order at a time, per batch, or per slice; it
/// also runs the inbox's cleaner, until it stops.
async fn start_consumer(args: &Args, broker: &AmqpUrl, inbox: Inbox) -> Result<Consumer, BoxError> {
    let service = Arc::new(Billing {
        events_exchange: args.events_exchange.clone(),
    });
    let topology = billing::topology_on(&args.queue, &args.broker.exchange);
    let consumer = Consumer::builder(broker.clone(), inbox)
        .connection_name(args.connection_name.clone())
        // Room for the next batch to gather while one commits.
        .prefetch(args.batch.map_or(32, |size| {
            u16::try_from(size * 2).unwrap_or(u16::MAX).max(32)
        }));
    let wait = Duration::from_millis(20);
    let checks = if args.check_each_handler {
        BatchChecks::EachMessage
    } else {
        BatchChecks::BeforeCommit
    };
    let consumer = match args.batch {
        Some(size) if args.slices => consumer
            .bind_with(Binding::new(topology, service.charge_all_handler()).slices(size, wait)),
        Some(size) => consumer.bind_with(
            Binding::new(topology, service.charge_handler())
                .batch(size, wait)
                .batch_checks(checks),
        ),
        None if args.keys == Keys::Entity => {
            consumer.bind_with(Binding::new(topology, service.charge_by_entity_handler()))
        }
        None => consumer.bind_with(Binding::new(topology, service.charge_handler())),
    };
    Ok(consumer.start().await?)
}

/// The notifications hop, when it runs in this process: its consumer, and in the demo the
/// loopback provider it calls.
struct NotificationsHop {
    consumer: Option<Consumer>,
    stub: Option<Stub>,
}

/// Starts the notifications service against the given provider or, in the demo, a loopback
/// stub of its own; without either, billing runs alone.
async fn start_notifications(
    args: &Args,
    broker: &AmqpUrl,
    inbox: Inbox,
) -> Result<NotificationsHop, BoxError> {
    let stub = match (&args.provider_url, args.demo) {
        (None, Some(_)) => Some(Stub::start("127.0.0.1:0").await?),
        _ => None,
    };
    let Some(provider) = args
        .provider_url
        .clone()
        .or_else(|| stub.as_ref().map(Stub::notify_url))
    else {
        return Ok(NotificationsHop {
            consumer: None,
            stub,
        });
    };
    let consumer = notifications::start(
        broker,
        inbox,
        &args.notifications_queue,
        &args.events_exchange,
        provider,
        &format!("{} notifications", args.connection_name),
    )
    .await?;
    Ok(NotificationsHop {
        consumer: Some(consumer),
        stub,
    })
}

fn demo_settings<'a>(args: &'a Args, broker: &'a AmqpUrl, count: usize) -> demo::Settings<'a> {
    demo::Settings {
        amqp_url: broker,
        exchange: &args.broker.exchange,
        queue: &args.queue,
        count,
        json: args.json,
    }
}

/// Logs the consumer's counters every `every` while they change, until Ctrl-C or SIGTERM.
async fn log_stats_until_signal(
    consumer: &Consumer,
    every: Duration,
    mut signal: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) {
    let mut logged = DeliveryStats::default();
    let mut ticks = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = &mut signal => return,
            _ = ticks.tick() => {
                let now = consumer.stats();
                if now != logged {
                    log_stats(&now);
                    logged = now;
                }
            }
        }
    }
}

/// Stops billing's consumer (its in-flight charges finish and are settled) and the
/// notifications service side by side, each within its own shutdown deadline, then the relay,
/// which publishes what they staged until it stops. Side by side, the service exits within one
/// consumer's deadline, not the sum of both: what an orchestrator's grace period allows for.
async fn stop(consumer: Consumer, notifications: NotificationsHop, relay: Relay) {
    let stats = consumer.stats();
    let notifier = async {
        if let Some(notifier) = notifications.consumer {
            notifier.shutdown().await;
        }
    };
    let (report, ()) = tokio::join!(consumer.shutdown(), notifier);
    let relayed = relay.shutdown().await;
    log_stats(&stats);
    tracing::info!(events_published = relayed.published, "relay stopped");
    tracing::info!(
        completed = report.completed,
        abandoned = report.abandoned,
        expired_records_deleted = report.cleanup.map_or(0, |cleanup| cleanup.deleted),
        "billing stopped"
    );
}

/// Logs the consumer's counters in one line of `name=value` fields.
fn log_stats(stats: &DeliveryStats) {
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

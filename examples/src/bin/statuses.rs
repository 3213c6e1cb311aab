//! The statuses service: applies order-status events that come out of order and twice each,
//! with a naturally idempotent handler (`mode = natural`, no inbox record), and ends in each
//! order's newest status.
//!
//! `cargo run -p idem-examples --bin statuses` publishes 20 orders' five statuses, each twice,
//! in a random order, consumes them into SQLite (`statuses.db`), and prints how many orders
//! ended in their newest status; `--json` prints the report as JSON; `--help` lists the options.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use idem_examples::cli::{BrokerArgs, parse_count, parse_millis};
use idem_examples::statuses::{self, Statuses};
use idem_rabbitmq::lapin::ExchangeKind;
use idem_rabbitmq::{Consumer, PublishOptions};
use idem_runtime::Inbox;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Applies order-status events, delivered out of order and twice each, and checks that every
/// order ends in its newest status.
#[derive(Debug, Parser)]
#[command(name = "statuses")]
struct Args {
    /// How many orders to publish the statuses of
    #[arg(value_name = "ORDERS", default_value_t = 20, value_parser = parse_count)]
    orders: usize,

    /// The database the statuses are kept in (SQLite, PostgreSQL or MySQL)
    #[arg(
        long,
        value_name = "URL",
        env = "DATABASE_URL",
        default_value = "sqlite://statuses.db?mode=rwc",
        hide_env_values = true
    )]
    database_url: String,

    #[command(flatten)]
    broker: BrokerArgs,

    /// How long to wait for every order to reach its newest status, in milliseconds
    #[arg(long = "wait-ms", value_name = "MS", default_value = "60000", value_parser = parse_millis)]
    wait: Duration,

    /// Print the report as one JSON object on standard output
    #[arg(long)]
    json: bool,
}

/// What a run saw.
#[derive(Debug, serde::Serialize)]
struct Report {
    run: String,
    orders: usize,
    events_published: usize,
    events_applied: u64,
    duplicates: u64,
    orders_at_newest: i64,
    orders_stored: i64,
}

fn main() -> ExitCode {
    idem_examples::run_service(async {
        let args = Args::parse();
        idem_examples::init_logging();
        match run(&args).await {
            Ok(report) => {
                if args.json {
                    println!(
                        "{}",
                        serde_json::to_string(&report).expect("a report serializes")
                    );
                } else {
                    println!(
                        "statuses {}: {} orders, {} events published (five statuses each, every \
                         one twice, in a random order), {} applied, {} duplicates; {} of {} orders \
                         in their newest status",
                        report.run,
                        report.orders,
                        report.events_published,
                        report.events_applied,
                        report.duplicates,
                        report.orders_at_newest,
                        report.orders_stored,
                    );
                }
                if report.orders_at_newest == report.orders as i64 {
                    ExitCode::SUCCESS
                } else {
                    eprintln!("statuses: not every order reached its newest status");
                    ExitCode::FAILURE
                }
            }
            Err(error) => {
                eprintln!("statuses: {error}");
                ExitCode::FAILURE
            }
        }
    })
}

async fn run(args: &Args) -> Result<Report, BoxError> {
    let db = idem_examples::cli::connect_database(&args.database_url).await?;
    let service = Arc::new(Statuses {
        table: "order_statuses".to_owned(),
    });
    service.create_table(&db).await?;
    let inbox = Inbox::builder(db.clone()).build().await?;
    let url = args.broker.url()?;
    let publisher = idem_examples::broker::reach(&url, Some(args.broker.broker_wait)).await?;
    publisher
        .declare_exchange(statuses::EXCHANGE, ExchangeKind::Topic)
        .await?;
    let consumer = Consumer::builder(url, inbox)
        .connection_name("statuses")
        .bind(statuses::topology(), service.apply_handler())
        .start()
        .await?;

    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let prefix = format!("{run}-");
    let events = statuses::shuffled_events(&prefix, args.orders);
    for event in &events {
        let options = PublishOptions::default();
        (publisher.publish(statuses::EXCHANGE, statuses::ROUTING_KEY, event, options)).await?;
    }
    tracing::info!(run, events = events.len(), "published");

    let started = Instant::now();
    let (orders_at_newest, orders_stored) = loop {
        let counts = service.count(&db, &prefix).await?;
        let settled = consumer.stats().acked as usize >= events.len();
        if (settled && counts.0 == args.orders as i64) || started.elapsed() > args.wait {
            break counts;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let stats = consumer.stats();
    consumer.shutdown().await;
    Ok(Report {
        run,
        orders: args.orders,
        events_published: events.len(),
        events_applied: stats.acked,
        duplicates: stats.duplicates,
        orders_at_newest,
        orders_stored,
    })
}

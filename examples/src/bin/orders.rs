//! The orders service: publishes `OrderPlaced` events for a running billing service, or, with
//! `--http ADDR`, takes orders over HTTP with an `Idempotency-Key` and stages each one's event in
//! its outbox, which its relay publishes.
//!
//! `cargo run -p idem-examples --bin orders -- 100` publishes 100 orders (every tenth twice, as
//! a producer retry would) and prints their ids' prefix; `--http 127.0.0.1:8080` serves
//! `POST /orders` (on SQLite, `orders.db`, by default) until Ctrl-C or SIGTERM, and
//! `--http 127.0.0.1:8080 --demo 20` places 20 orders through it with retrying clients, a billing
//! service started beside it; `--help` lists the options.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use clap::Parser;
use idem_examples::cli::{BrokerArgs, parse_count};
use idem_examples::demo::BoxError;
use idem_examples::progress::Progress;
use idem_examples::{orders, orders_http, placing};
use idem_rabbitmq::lapin::ExchangeKind;

/// Publishes `OrderPlaced` events for a running billing service: every tenth order twice, as a
/// producer retry would, one with an invalid amount, and one more message that reuses the
/// first order's id. With `--http`, serves `POST /orders` instead.
#[derive(Debug, Parser)]
#[command(name = "orders")]
struct Args {
    /// How many orders to publish (not with `--http`)
    #[arg(
        value_name = "COUNT",
        default_value_t = 10,
        value_parser = parse_count,
    )]
    count: usize,

    /// Serve `POST /orders` at this address, an `OrderPlaced` as JSON with an `Idempotency-Key`
    /// and a bearer token
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,

    /// With `--http`: the orders service's database (SQLite, PostgreSQL or MySQL)
    #[arg(
        long,
        value_name = "URL",
        env = "ORDERS_DATABASE_URL",
        default_value = placing::DEFAULT_DATABASE_URL,
        hide_env_values = true
    )]
    database_url: String,

    /// With `--http`: place N orders through the service with retrying clients, a billing
    /// service started beside it, check each order went through once, and exit
    #[arg(long, value_name = "N", requires = "http", num_args = 0..=1, default_missing_value = "20", value_parser = parse_count)]
    demo: Option<usize>,

    /// With `--demo`: print the report as one JSON object
    #[arg(long, requires = "demo")]
    json: bool,

    /// With `--demo`: the database of the billing service it starts, where invoices are counted
    #[arg(
        long,
        value_name = "URL",
        env = "DATABASE_URL",
        default_value = idem_examples::cli::DEFAULT_DATABASE_URL,
        hide_env_values = true
    )]
    billing_database_url: String,

    #[command(flatten)]
    broker: BrokerArgs,
}

fn main() -> ExitCode {
    idem_examples::run_service(async {
        let args = Args::parse();
        idem_examples::init_logging();
        let result = match args.http {
            Some(addr) => {
                let settings = orders_http::Settings {
                    addr,
                    database_url: &args.database_url,
                    broker: &args.broker,
                    demo: args.demo,
                    json: args.json,
                    billing_database_url: &args.billing_database_url,
                };
                orders_http::run(settings).await
            }
            None => publish(&args).await,
        };
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("orders: {error}");
                ExitCode::FAILURE
            }
        }
    })
}

/// Publishes the demo's orders straight to the exchange.
async fn publish(args: &Args) -> Result<(), BoxError> {
    let published = Arc::new(AtomicUsize::new(0));
    let progress = Progress::start({
        let published = Arc::clone(&published);
        let count = args.count;
        move || {
            format!(
                "published {}/{count} orders",
                published.load(Ordering::Relaxed)
            )
        }
    });
    let result = async {
        let exchange = &args.broker.exchange;
        tracing::info!(
            count = args.count,
            exchange,
            broker = %idem_rabbitmq::amqp::redact_url(&args.broker.amqp_url),
            "publishing orders"
        );
        let wait = Some(args.broker.broker_wait);
        let publisher = idem_examples::broker::reach(&args.broker.url()?, wait).await?;
        publisher
            .declare_exchange(exchange, ExchangeKind::Topic)
            .await?;
        let plan = orders::publish_demo(&publisher, exchange, args.count, &published).await?;
        publisher.close().await;
        Ok::<_, BoxError>(plan)
    }
    .await;
    progress.finish();
    let plan = result?;
    println!(
        "published {} orders as {} messages (order ids {}-*)",
        plan.orders, plan.deliveries, plan.run
    );
    Ok(())
}

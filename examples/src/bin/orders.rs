//! The orders service: publishes `OrderPlaced` events for a running billing service.
//!
//! `cargo run -p idem-examples --bin orders -- 100` publishes 100 orders (every tenth twice, as
//! a producer retry would) and prints their ids' prefix; `--help` lists the options.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use clap::Parser;
use idem_examples::cli::{BrokerArgs, parse_count};
use idem_examples::orders;
use idem_examples::progress::Progress;
use idem_rabbitmq::lapin::ExchangeKind;

/// Publishes `OrderPlaced` events for a running billing service: every tenth order twice, as a
/// producer retry would, one with an invalid amount, and one more message that reuses the
/// first order's id.
#[derive(Debug, Parser)]
#[command(name = "orders")]
struct Args {
    /// How many orders to publish
    #[arg(
        value_name = "COUNT",
        default_value_t = 10,
        value_parser = parse_count,
    )]
    count: usize,

    #[command(flatten)]
    broker: BrokerArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    idem_examples::init_logging();
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
            broker = %idem_rabbitmq::redact_url(&args.broker.amqp_url),
            "publishing orders"
        );
        let wait = Some(args.broker.broker_wait);
        let publisher = idem_examples::broker::reach(&args.broker.url()?, wait).await?;
        publisher
            .declare_exchange(exchange, ExchangeKind::Topic)
            .await?;
        let plan = orders::publish_demo(&publisher, exchange, args.count, &published).await?;
        publisher.close().await;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(plan)
    }
    .await;
    progress.finish();
    match result {
        Ok(plan) => {
            println!(
                "published {} orders as {} messages (order ids {}-*)",
                plan.orders, plan.deliveries, plan.run
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("orders: {error}");
            ExitCode::FAILURE
        }
    }
}

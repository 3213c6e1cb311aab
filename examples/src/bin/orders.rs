//! The orders service: publishes `OrderPlaced` events for a running billing service.
//!
//! `cargo run -p idem-examples --bin orders -- 100` publishes 100 orders (every tenth twice, as
//! a producer retry would) and prints their ids' prefix.

use std::process::ExitCode;

use idem_examples::orders;
use idem_rabbitmq::Publisher;
use idem_rabbitmq::lapin::ExchangeKind;

#[tokio::main]
async fn main() -> ExitCode {
    idem_examples::init_logging();
    let count = match std::env::args().nth(1).map(|n| n.parse::<usize>()) {
        None => 10,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            eprintln!("usage: orders [COUNT]");
            return ExitCode::from(2);
        }
    };
    let result = async {
        let exchange = idem_examples::orders_exchange();
        let publisher = Publisher::connect(idem_examples::amqp_url()).await?;
        publisher
            .declare_exchange(&exchange, ExchangeKind::Topic)
            .await?;
        let plan = orders::publish_demo(&publisher, &exchange, count).await?;
        publisher.close().await;
        Ok::<_, idem_rabbitmq::Error>(plan)
    }
    .await;
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

//! Runnable idem services: an orders service publishes `OrderPlaced` events and a billing
//! service charges each order exactly once, whatever the broker redelivers.
//!
//! - `cargo run -p idem-examples --bin billing -- --demo 100` publishes 100 demo orders (with
//!   producer retries, a reused order id and an invalid order), consumes them into SQLite
//!   (`billing.db`, or `DATABASE_URL` for PostgreSQL or MySQL), checks the result and exits;
//!   without `--demo` it consumes until Ctrl-C or SIGTERM.
//! - `cargo run -p idem-examples --bin orders -- 100` publishes 100 orders to a running billing
//!   service.
//!
//! The environment points them elsewhere:
//!
//! | variable | default | what |
//! |---|---|---|
//! | `AMQP_URL` | `amqp://guest:guest@127.0.0.1:5672/%2f` | the broker |
//! | `DATABASE_URL` | `sqlite://billing.db?mode=rwc` | billing's database (SQLite, PostgreSQL or MySQL) |
//! | `ORDERS_EXCHANGE` | `orders` | the exchange orders are published to, and billing's queue bound to |
//! | `BILLING_QUEUE` | `billing.orders` | the quorum queue billing consumes (its dead letters go to `<queue>.dlq`) |
//! | `BILLING_CONNECTION_NAME` | `billing` | the name billing's broker connections carry (`rabbitmqctl list_connections client_properties`) |
//! | `BILLING_STATS_EVERY_MS` | `60000` | how often billing logs its delivery counters (`billing stats`), when they changed |
//!
//! Several services on one broker and one database server stay apart with their own exchange,
//! queue and database (or PostgreSQL schema, through the URL's
//! `options=-c search_path=<schema>`).

pub mod billing;
pub mod notifications;
pub mod orders;
pub mod stub;

/// The broker to use: `AMQP_URL`, or the local RabbitMQ.
pub fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// The exchange orders are published to: `ORDERS_EXCHANGE`, or [`orders::EXCHANGE`].
pub fn orders_exchange() -> String {
    std::env::var("ORDERS_EXCHANGE").unwrap_or_else(|_| orders::EXCHANGE.to_owned())
}

/// The queue billing consumes: `BILLING_QUEUE`, or [`billing::QUEUE`].
pub fn billing_queue() -> String {
    std::env::var("BILLING_QUEUE").unwrap_or_else(|_| billing::QUEUE.to_owned())
}

/// The name billing's broker connections carry: `BILLING_CONNECTION_NAME`, or `billing`.
pub fn billing_connection_name() -> String {
    std::env::var("BILLING_CONNECTION_NAME").unwrap_or_else(|_| "billing".to_owned())
}

/// How often billing logs its delivery counters: `BILLING_STATS_EVERY_MS`, or a minute.
///
/// # Errors
///
/// A value that is not a positive number of milliseconds.
pub fn billing_stats_interval() -> Result<std::time::Duration, String> {
    match std::env::var("BILLING_STATS_EVERY_MS") {
        Err(_) => Ok(std::time::Duration::from_secs(60)),
        Ok(value) => match value.parse::<u64>() {
            Ok(ms) if ms > 0 => Ok(std::time::Duration::from_millis(ms)),
            _ => Err(format!(
                "BILLING_STATS_EVERY_MS must be a positive number of milliseconds, not {value:?}"
            )),
        },
    }
}

/// How many deliveries billing processes per transaction: `BILLING_BATCH`, or one at a time.
///
/// # Errors
///
/// A value that is not a number from 1 to 1000.
pub fn billing_batch() -> Result<Option<usize>, String> {
    match std::env::var("BILLING_BATCH") {
        Err(_) => Ok(None),
        Ok(value) => match value.parse::<usize>() {
            Ok(size) if (1..=idem_runtime::MAX_BATCH).contains(&size) => Ok(Some(size)),
            _ => Err(format!(
                "BILLING_BATCH must be a number of deliveries from 1 to {}, not {value:?}",
                idem_runtime::MAX_BATCH
            )),
        },
    }
}

/// The database to use: `DATABASE_URL`, or the embedded SQLite file `billing.db`.
pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "sqlite://billing.db?mode=rwc".to_owned())
}

/// Logs to standard error at `info` (or the level in `RUST_LOG`: `error`, `warn`, `info`,
/// `debug`, `trace`).
pub fn init_logging() {
    let level = std::env::var("RUST_LOG")
        .ok()
        .and_then(|level| level.parse().ok())
        .unwrap_or(tracing::Level::INFO);
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .init();
}

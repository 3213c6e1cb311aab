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
//! `AMQP_URL` names the broker (default `amqp://guest:guest@127.0.0.1:5672/%2f`).

pub mod billing;
pub mod orders;

/// The broker to use: `AMQP_URL`, or the local RabbitMQ.
pub fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
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

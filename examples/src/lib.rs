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
//! Options (or the environment variables beside them) point them elsewhere; `--help` lists
//! them, and a bad value is refused (exit code 2) rather than replaced by a default:
//!
//! | option | variable | default | what |
//! |---|---|---|---|
//! | `--amqp-url` | `AMQP_URL` | `amqp://guest:guest@127.0.0.1:5672/%2f` | the broker, or a cluster's nodes separated by commas (tried in turn, see [`idem_rabbitmq::AmqpUrl`]) |
//! | `--amqp-ca-file` | `AMQP_CA_FILE` | none | for `amqps://` (built with `--features tls`): a PEM file of the CA that signed the broker's certificate, trusted besides the platform's roots |
//! | `--amqp-client-cert`, `--amqp-client-key` | `AMQP_CLIENT_CERT`, `AMQP_CLIENT_KEY` | none | the client certificate and key (PEM) for a broker that authenticates clients by certificate |
//! | `--broker-wait-ms` | `BROKER_WAIT_MS` | `30000` | with `--demo`, and for `orders`: how long to wait for the broker before giving up (a service waits as long as it takes, logging each try) |
//! | `--exchange` | `ORDERS_EXCHANGE` | `orders` | the exchange orders are published to, and billing's queue bound to |
//! | `--database-url` | `DATABASE_URL` | `sqlite://billing.db?mode=rwc` | billing's database (SQLite, PostgreSQL or MySQL) |
//! | `--queue` | `BILLING_QUEUE` | `billing.orders` | the quorum queue billing consumes (its dead letters go to `<queue>.dlq`) |
//! | `--connection-name` | `BILLING_CONNECTION_NAME` | `billing` | the name billing's broker connections carry (`rabbitmqctl list_connections client_properties`) |
//! | `--stats-every-ms` | `BILLING_STATS_EVERY_MS` | `60000` | how often billing logs its delivery counters (`billing stats`), when they changed |
//! | `--batch` | `BILLING_BATCH` | one at a time | how many deliveries billing processes per transaction, 1 to [`idem_runtime::transport::MAX_BATCH`] |
//! | `--check-each-handler` | `BILLING_CHECK_EACH_HANDLER` | off | with `--batch`, check each batch's transaction after each message rather than once before its commit ([`idem_runtime::transport::BatchChecks::EachMessage`]) |
//! | `--slices` | `BILLING_SLICES` | off | with `--batch`, charge each batch's fresh orders in one call of the slice handler `charge_all` ([`idem_runtime::SliceHandler`]) |
//! | `--keys` | `BILLING_KEYS` | `inbox` | where a charged order's key lives: `inbox` (an inbox record beside the invoice) or `entity` (the invoice itself, keyed by its order, [`invoice`]); not with `--batch` |
//! | `--events-exchange` | `BILLING_EVENTS_EXCHANGE` | `billing.events` | the exchange billing publishes `InvoiceIssued` to, through its outbox |
//! | `--provider-url` | `NOTIFICATIONS_PROVIDER_URL` | none | also run the notifications service, calling this provider (the demo runs a loopback stub of its own) |
//! | `--notifications-queue` | `NOTIFICATIONS_QUEUE` | `notifications.invoices` | the quorum queue the notifications service declares, bounded to [`notifications::MAX_LENGTH`] events, and consumes |
//! | `--metrics-addr` | `BILLING_METRICS_ADDR` | none | serve Prometheus metrics at this address (`127.0.0.1:9464`: any path answers, `/metrics` by convention), see [`metrics`] |
//! | `--demo [N]` | | | publish N demo orders (100 without N), check orders → charges → invoices → notifications, exit non-zero if anything is off; the report counts this run's orders only ([`demo`]) |
//! | `--json` | | off | with `--demo`, print the report as one JSON object (`orders`, `messages_published`, `earlier_messages`, `invoices`, `events_published`, `notified`, `stub_calls`, `stub_calls_distinct_keys`, `dead_lettered`, `lost`, ...) |
//!
//! Logs go to standard error, in colour only on a terminal and without `NO_COLOR`; on a terminal
//! a progress line follows long runs (the demo, publishing orders).
//!
//! Several services on one broker and one database server stay apart with their own exchange,
//! queue and database (or PostgreSQL schema, through the URL's
//! `options=-c search_path=<schema>`).
//!
//! Each queue is declared by the service that reads it: billing declares `billing.orders` and
//! the exchange it publishes its events to; the notifications service declares
//! `notifications.invoices`, bounded, so that a billing service running without it does not
//! fill the broker (see [`notifications`]).

pub mod billing;
pub mod broker;
pub mod cli;
pub mod demo;
pub mod http_client;
pub mod http_demo;
pub mod invoice;
pub mod metrics;
pub mod notifications;
pub mod orders;
pub mod orders_http;
pub mod placing;
pub mod progress;
pub mod statuses;
pub mod stub;

pub use cli::{init_logging, run_service};

// The crates' READMEs, run as doc tests here (where every crate and feature they use is at
// hand), so that their examples keep to the API.
#[cfg(doctest)]
#[doc = include_str!("../../idem-runtime/README.md")]
mod readme_runtime {}
#[cfg(doctest)]
#[doc = include_str!("../../idem-macros/README.md")]
mod readme_macros {}
#[cfg(doctest)]
#[doc = include_str!("../../idem-rabbitmq/README.md")]
mod readme_rabbitmq {}

/// An AMQP operation's error, for the examples' own declarations and counts.
pub(crate) fn amqp_error(
    operation: impl Into<String>,
) -> impl FnOnce(idem_rabbitmq::lapin::Error) -> idem_rabbitmq::Error {
    let operation = operation.into();
    move |source| idem_rabbitmq::Error::Amqp { operation, source }
}

/// The broker to use: `AMQP_URL`, or [`cli::DEFAULT_AMQP_URL`], as the binaries choose it by
/// default (for tests that talk to the broker the binaries use).
pub fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| cli::DEFAULT_AMQP_URL.to_owned())
}

//! What the example binaries share on their command lines: the broker options, typed value
//! parsers, logging that leaves colour codes out where they do not belong, and the runtime
//! they run on.

use std::ffi::OsStr;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use idem_rabbitmq::{AmqpUrl, TlsError, TlsSettings};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::progress::LogWriter;

/// How long a binary's runtime waits, once its work is done, for the threads still busy.
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(5);

/// Runs a binary's `main` on a multi-threaded tokio runtime, and then exits without waiting
/// more than 5 s for the runtime's threads. A worker thread blocked inside
/// lapin (4.12 can deadlock a connection when a channel's recovery is cut short) would
/// otherwise keep a stopped service from exiting.
pub fn run_service(main: impl Future<Output = ExitCode>) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime starts");
    let code = runtime.block_on(main);
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
    code
}

/// The broker both services use unless told otherwise: the local RabbitMQ.
pub const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// The database billing uses unless told otherwise: the embedded SQLite file `billing.db`.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://billing.db?mode=rwc";

/// Where the orders go: the broker and the exchange, shared by both binaries.
#[derive(Debug, Clone, clap::Args)]
#[non_exhaustive]
pub struct BrokerArgs {
    /// The RabbitMQ broker, or a cluster's nodes separated by commas
    #[arg(long, value_name = "URL", env = "AMQP_URL", default_value = DEFAULT_AMQP_URL)]
    // The value may hold a password: `--help` must not print it.
    #[arg(hide_env_values = true)]
    pub amqp_url: String,

    /// For `amqps://` URLs: a PEM file of the CA that signed the broker's certificate, trusted
    /// besides the platform's roots
    #[arg(long, value_name = "FILE", env = "AMQP_CA_FILE")]
    pub amqp_ca_file: Option<PathBuf>,

    /// For a broker that authenticates clients by certificate: this client's certificate (PEM),
    /// with `--amqp-client-key`
    #[arg(
        long,
        value_name = "FILE",
        env = "AMQP_CLIENT_CERT",
        requires = "amqp_client_key"
    )]
    pub amqp_client_cert: Option<PathBuf>,

    /// The private key (PEM) of `--amqp-client-cert`
    #[arg(
        long,
        value_name = "FILE",
        env = "AMQP_CLIENT_KEY",
        requires = "amqp_client_cert"
    )]
    pub amqp_client_key: Option<PathBuf>,

    /// With `--demo`, and for `orders`: how long to wait for the broker before giving up, in
    /// milliseconds (a service waits as long as it takes)
    #[arg(
        long = "broker-wait-ms",
        value_name = "MS",
        env = "BROKER_WAIT_MS",
        default_value = "30000",
        value_parser = parse_millis,
    )]
    pub broker_wait: Duration,

    /// The exchange orders are published to, and billing's queue is bound to
    #[arg(long, value_name = "NAME", env = "ORDERS_EXCHANGE", default_value = crate::orders::EXCHANGE)]
    pub exchange: String,
}

impl BrokerArgs {
    /// The broker's URL with its TLS settings.
    ///
    /// # Errors
    ///
    /// A TLS file cannot be read or holds no PEM block of its kind.
    pub fn url(&self) -> Result<AmqpUrl, TlsError> {
        let mut tls = TlsSettings::new();
        if let Some(ca) = &self.amqp_ca_file {
            tls = tls.ca_file(ca)?;
        }
        if let (Some(certificate), Some(key)) = (&self.amqp_client_cert, &self.amqp_client_key) {
            tls = tls.client_certificate(certificate, key)?;
        }
        Ok(AmqpUrl::new(self.amqp_url.as_str()).tls(tls))
    }
}

/// Parses a count of at least one.
///
/// # Errors
///
/// A value that is not a whole number above zero.
pub fn parse_count(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(count) => Ok(count),
        Err(_) => Err(format!("{value:?} is not a whole number")),
    }
}

/// Parses a batch size: a count from 1 to [`idem_runtime::transport::MAX_BATCH`].
///
/// # Errors
///
/// A value that is not a whole number in that range.
pub fn parse_batch(value: &str) -> Result<usize, String> {
    match parse_count(value)? {
        size if size <= idem_runtime::transport::MAX_BATCH => Ok(size),
        _ => Err(format!(
            "must be at most {}",
            idem_runtime::transport::MAX_BATCH
        )),
    }
}

/// Parses a positive number of milliseconds into a [`Duration`].
///
/// # Errors
///
/// A value that is not a whole number of milliseconds above zero.
pub fn parse_millis(value: &str) -> Result<Duration, String> {
    match value.parse::<u64>() {
        Ok(0) => Err("must be at least 1 millisecond".to_owned()),
        Ok(ms) => Ok(Duration::from_millis(ms)),
        Err(_) => Err(format!("{value:?} is not a whole number of milliseconds")),
    }
}

/// Logs to standard error at `info` (or the level in `RUST_LOG`: `error`, `warn`, `info`,
/// `debug`, `trace`), in colour only when standard error is a terminal and `NO_COLOR` is unset
/// or empty. Log lines first clear a [`Progress`](crate::progress::Progress) line shown on the
/// terminal, which redraws itself below them.
///
/// lapin's own records show at `debug` and `trace` only ([`targets`]).
pub fn init_logging() {
    let level = std::env::var("RUST_LOG")
        .ok()
        .and_then(|level| level.parse().ok())
        .unwrap_or(tracing::Level::INFO);
    let ansi = colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(LogWriter)
        .with_filter(targets(level));
    tracing_subscriber::registry().with(logs).init();
}

/// What is logged at `level`: everything, except lapin's records below `debug`. lapin logs at
/// `error` every channel and connection the broker closes, those closed on purpose included
/// (the consumer's check of the type of a queue it did not declare, such as the notifications
/// queue, is a connection the broker refuses a global prefetch), and idem reports the failures
/// that matter itself, with what it was doing: the examples show lapin's lines when asked for
/// detail.
pub fn targets(level: tracing::Level) -> Targets {
    let lapin = if level >= tracing::Level::DEBUG {
        LevelFilter::from_level(level)
    } else {
        LevelFilter::OFF
    };
    Targets::new()
        .with_default(level)
        .with_target("lapin", lapin)
}

/// Whether logs may carry colour codes: on a terminal, unless `NO_COLOR` is set to anything
/// but the empty string (<https://no-color.org>).
fn colour(is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    is_terminal && no_color.is_none_or(OsStr::is_empty)
}

/// Connects to the database at `url`, without logging each statement; SQLite's pool is kept
/// to four connections (one writes at a time).
///
/// # Errors
///
/// The database cannot be reached.
pub async fn connect_database(url: &str) -> Result<sea_orm::DatabaseConnection, sea_orm::DbErr> {
    let mut options = sea_orm::ConnectOptions::new(url);
    options.sqlx_logging(false);
    if url.starts_with("sqlite:") {
        options.max_connections(4);
    }
    sea_orm::Database::connect(options).await
}

/// Returns on Ctrl-C or SIGTERM.
pub async fn wait_for_signal() {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A service whose work is done exits even though a runtime worker is blocked for good,
    /// as one waiting on a lock lapin's deadlocked io loop holds is.
    #[test]
    fn a_worker_blocked_for_good_does_not_hold_the_exit() {
        let (done, exited) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let code = run_service(async {
                let (blocked, worker_blocked) = tokio::sync::oneshot::channel();
                tokio::spawn(async move {
                    let _ = blocked.send(());
                    loop {
                        std::thread::park();
                    }
                });
                worker_blocked.await.expect("the worker runs");
                ExitCode::SUCCESS
            });
            let _ = done.send(code);
        });
        let waited = RUNTIME_SHUTDOWN * 4;
        assert!(
            exited.recv_timeout(waited).is_ok(),
            "still running {waited:?} after its work was done"
        );
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some(OsStr::new(""))));
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None));
        assert!(!colour(false, Some(OsStr::new(""))));
    }

    #[test]
    fn lapin_logs_only_in_detail() {
        use tracing::Level;
        assert!(!targets(Level::INFO).would_enable("lapin::channel", &Level::ERROR));
        assert!(targets(Level::INFO).would_enable("idem_rabbitmq::relay", &Level::INFO));
        assert!(!targets(Level::INFO).would_enable("idem_rabbitmq::relay", &Level::DEBUG));
        assert!(targets(Level::DEBUG).would_enable("lapin::channel", &Level::ERROR));
        assert!(!targets(Level::DEBUG).would_enable("lapin::channel", &Level::TRACE));
    }

    #[test]
    fn counts_start_at_one() {
        assert_eq!(parse_count("1"), Ok(1));
        assert_eq!(parse_count("0"), Err("must be at least 1".to_owned()));
        assert!(parse_count("-1").is_err());
        assert!(parse_count("x").is_err());
    }

    #[test]
    fn batches_stay_within_the_runtime_maximum() {
        assert_eq!(parse_batch("1"), Ok(1));
        let max = idem_runtime::transport::MAX_BATCH;
        assert_eq!(parse_batch(&max.to_string()), Ok(max));
        assert!(parse_batch(&(max + 1).to_string()).is_err());
        assert!(parse_batch("0").is_err());
    }

    #[test]
    fn millis_are_positive_whole_numbers() {
        assert_eq!(parse_millis("20"), Ok(Duration::from_millis(20)));
        assert!(parse_millis("0").is_err());
        assert!(parse_millis("-5").is_err());
        assert!(parse_millis("1.5").is_err());
        assert!(parse_millis("").is_err());
    }
}

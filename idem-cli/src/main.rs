//! The `idem` command: an operator's view of idem's inbox and outbox, on the same database as
//! the services (`DATABASE_URL`: SQLite, PostgreSQL, MySQL/MariaDB), and of their dead-letter
//! queues on the broker (`AMQP_URL`).
//!
//! Exit codes: 0 done; 1 a failure (the database or the broker unreachable or failing, a table
//! that is not what this version reads); 2 a usage error or a declined confirmation; 3 the
//! record, run or queue named does not exist; 4 refused as things stand, or changed meanwhile
//! (nothing done); 5 done in part (a replay that could not move every message asked for).

mod dlq;
mod inbox;
mod outbox;
mod output;
mod retention;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use idem_runtime::sea_orm::{ConnectOptions, Database, DatabaseConnection, DbErr};
use output::{note, out};

/// An operator's view of idem's inbox, outbox and dead-letter queues: records per consumer, one
/// record, stuck claims, messages waiting to be published, dead letters by reason and their
/// replay.
#[derive(Debug, Parser)]
#[command(
    name = "idem",
    version,
    after_help = "Exit codes: 0 done; 1 a failure (the database or the broker unreachable or \
                  failing, a table that is not what this version reads); 2 a usage error or a \
                  declined confirmation; 3 the record, run or queue named does not exist; 4 \
                  refused as things stand, or changed meanwhile (nothing done); 5 done in part. \
                  With --json, a failure prints {\"error\": \"...\"} on standard output."
)]
struct Args {
    /// The database the services use: sqlite://file.db, postgres://..., mysql://...
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true)]
    database_url: Option<String>,
    /// Prints JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The inbox: processed message keys per consumer.
    #[command(subcommand)]
    Inbox(inbox::InboxCommand),
    /// The outbox: messages staged for publishing.
    #[command(subcommand)]
    Outbox(outbox::OutboxCommand),
    /// Retention: each consumer's, against the duplicates' ages and the late duplicates seen.
    #[command(subcommand)]
    Retention(retention::RetentionCommand),
    /// Dead-letter queues: their messages by reason, moved back to a queue.
    #[command(subcommand)]
    Dlq(dlq::DlqCommand),
}

/// How a command ended, short of a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Done {
    /// It did what was asked.
    Ok,
    /// What was asked is not a valid request (a key idem would refuse).
    Usage,
    /// The operator declined to confirm.
    Declined,
    /// The record, run or queue asked for does not exist.
    NotFound,
    /// Refused as things stand (a live claim, a queue whose letters a look would count), or
    /// the record changed while the command ran: nothing was done.
    Refused,
    /// Done in part: what was asked could not all be done.
    Partly,
}

impl Done {
    fn exit_code(self) -> ExitCode {
        ExitCode::from(match self {
            Done::Ok => 0,
            Done::Usage | Done::Declined => 2,
            Done::NotFound => 3,
            Done::Refused => 4,
            Done::Partly => 5,
        })
    }
}

/// A failure because what the command was asked about does not exist (exit 3).
#[derive(Debug)]
struct NotFound(String);

/// A failure because the command refuses to act as things stand (exit 4): doing it could make
/// things worse.
#[derive(Debug)]
struct Refused(String);

/// A failure the command already reported on standard output (exit 1).
#[derive(Debug)]
struct Reported(String);

macro_rules! message_error {
    ($($name:ident),*) => {$(
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl std::error::Error for $name {}
    )*};
}
message_error!(NotFound, Refused, Reported);

/// The exit code of a failure: its kind's, 1 for any other.
fn failure_code(error: &(dyn std::error::Error + 'static)) -> ExitCode {
    if error.is::<NotFound>() {
        Done::NotFound.exit_code()
    } else if error.is::<Refused>() {
        Done::Refused.exit_code()
    } else {
        ExitCode::FAILURE
    }
}

/// How long reaching the database is waited for.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A small pool on the database at `url`, as every command needs. A server that cannot be
/// reached is said at once, with the reason (a refused port, a name that does not resolve).
async fn connect(url: &str) -> Result<DatabaseConnection, String> {
    if let Some(address) = server_address(url) {
        let reaching = tokio::net::TcpStream::connect(address.clone());
        match tokio::time::timeout(CONNECT_TIMEOUT, reaching).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                return Err(format!("cannot reach the database at {address}: {error}"));
            }
            Err(_) => {
                return Err(format!(
                    "cannot reach the database at {address}: no answer within {CONNECT_TIMEOUT:?}"
                ));
            }
        }
    }
    let mut options = ConnectOptions::new(url);
    options
        .max_connections(2)
        .connect_timeout(CONNECT_TIMEOUT)
        .acquire_timeout(CONNECT_TIMEOUT)
        .sqlx_logging(false);
    Database::connect(options)
        .await
        .map_err(|error: DbErr| format!("cannot connect to the database: {error}"))
}

/// `host:port` of a PostgreSQL or MySQL URL that names a host (not a socket): what a
/// connection must reach first.
fn server_address(url: &str) -> Option<String> {
    let parsed = url::Url::parse(url).ok()?;
    let default_port = match parsed.scheme() {
        "postgres" | "postgresql" => 5432,
        "mysql" | "mariadb" => 3306,
        _ => return None,
    };
    let host = parsed.host_str().filter(|host| !host.is_empty())?;
    Some(format!("{host}:{}", parsed.port().unwrap_or(default_port)))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = Args::parse();
    let database_url = args.database_url.as_deref();
    let ran = match (args.command, database_url) {
        (Command::Dlq(command), url) => dlq::run(url, command, args.json).await,
        (Command::Inbox(command), Some(url)) => inbox::run(url, command, args.json).await,
        (Command::Outbox(command), Some(url)) => outbox::run(url, command, args.json).await,
        (Command::Retention(command), Some(url)) => retention::run(url, command, args.json).await,
        (_, None) => {
            let needed = "the database is needed: --database-url or DATABASE_URL";
            if args.json {
                out!("{}", serde_json::json!({ "error": needed }));
            } else {
                note!("idem: {needed}");
            }
            Ok(Done::Usage)
        }
    };
    match ran {
        Ok(done) => done.exit_code(),
        Err(error) => {
            if error.is::<Reported>() {
                note!("idem: {error}");
            } else if args.json {
                out!("{}", serde_json::json!({ "error": error.to_string() }));
            } else {
                note!("idem: {error}");
            }
            failure_code(error.as_ref())
        }
    }
}

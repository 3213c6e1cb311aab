//! The `idem` command: an operator's view of idem's inbox and outbox, on the same database as
//! the services (`DATABASE_URL`: SQLite, PostgreSQL, MySQL/MariaDB), and of their dead-letter
//! queues on the broker (`AMQP_URL`).
//!
//! Exit codes: 0 done, 1 a failure (the database, the table), 2 a usage error or a refused
//! confirmation, 3 no such record, 4 the record changed meanwhile (nothing done).

mod dlq;
mod inbox;
mod outbox;
mod output;
mod retention;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use idem_runtime::sea_orm::{ConnectOptions, Database, DatabaseConnection, DbErr};

/// An operator's view of idem's inbox, outbox and dead-letter queues: records per consumer, one
/// record, stuck claims, messages waiting to be published, dead letters by reason and their
/// replay.
#[derive(Debug, Parser)]
#[command(
    name = "idem",
    version,
    after_help = "Exit codes: 0 done, 1 a failure (the database, the table), 2 a usage error or \
                  a refused confirmation, 3 no such record, 4 the record changed meanwhile \
                  (nothing done)."
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
    /// The record asked for does not exist.
    NotFound,
    /// The record changed while the command ran: nothing was done.
    Changed,
}

/// A small pool on the database at `url`, as every command needs.
async fn connect(url: &str) -> Result<DatabaseConnection, String> {
    let mut options = ConnectOptions::new(url);
    options.max_connections(2).sqlx_logging(false);
    Database::connect(options)
        .await
        .map_err(|error: DbErr| format!("cannot connect to the database: {error}"))
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
            eprintln!("idem: the database is needed: --database-url or DATABASE_URL");
            Ok(Done::Usage)
        }
    };
    match ran {
        Ok(Done::Ok) => ExitCode::SUCCESS,
        Ok(Done::Usage | Done::Declined) => ExitCode::from(2),
        Ok(Done::NotFound) => ExitCode::from(3),
        Ok(Done::Changed) => ExitCode::from(4),
        Err(error) => {
            eprintln!("idem: {error}");
            ExitCode::FAILURE
        }
    }
}

//! The `idem` command: an operator's view of idem's inbox and outbox, on the same database as
//! the services (`DATABASE_URL`: SQLite, PostgreSQL, MySQL/MariaDB), and of their dead-letter
//! queues on the broker (`AMQP_URL`).
//!
//! Exit codes: 0 done; 1 a failure (the database or the broker unreachable or failing, a table
//! that is not what this version reads); 2 a usage error or a declined confirmation; 3 the
//! record, run or queue named does not exist; 4 refused as things stand, or changed meanwhile
//! (nothing done); 5 done in part (a replay that could not move every message asked for).

mod database;
mod dlq;
mod duration;
mod inbox;
mod outbox;
mod outcome;
mod output;
mod retention;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use outcome::{Done, Reported, failure_code};
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

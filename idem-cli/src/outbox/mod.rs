//! `idem outbox`: what waits to be published, what is held back and why, what the cleaner has
//! yet to delete; a hold lifted.

mod holds;

use std::time::Duration;

use clap::Subcommand;
use idem_runtime::admin::OutboxAdmin;
use idem_runtime::outbox::Outbox;
use serde_json::json;

use crate::outcome::Done;
use crate::output::{age, print_table};
use crate::output::{note, out};

use crate::outcome::Result;

/// The outbox's subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum OutboxCommand {
    /// Pending messages (the oldest one's age), those held back by exchange (a missing
    /// exchange, a refused message, and the rest of their runs), sent ones and those past the
    /// retention awaiting the cleaner.
    Stats {
        #[command(flatten)]
        table: Table,
        /// The outbox's retention in the services (`90s`, `30m`, `24h`, `7d`): sent messages
        /// older than that await the cleaner.
        #[arg(long, default_value = "24h", value_parser = crate::duration::parse_duration)]
        retention: Duration,
    },
    /// The runs the relays hold back (and messages of no run), the oldest first; with RUN (or
    /// --message), that run's pending messages.
    Show {
        #[command(flatten)]
        table: Table,
        #[command(flatten)]
        subject: holds::SubjectArgs,
        /// At most this many lines.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Lifts the hold of RUN (or of the message of no run --message ID) now: the relays take
    /// its messages at their next look at the table (at once on PostgreSQL).
    Retry {
        #[command(flatten)]
        table: Table,
        #[command(flatten)]
        subject: holds::SubjectArgs,
    },
}

/// The outbox table.
#[derive(Debug, clap::Args)]
pub(crate) struct Table {
    /// The outbox table, when it is not the default.
    #[arg(long, env = "IDEM_OUTBOX_TABLE", default_value = Outbox::DEFAULT_TABLE)]
    table: String,
}

/// Runs `command` on the outbox of the database at `url`.
pub(crate) async fn run(url: &str, command: OutboxCommand, json: bool) -> Result<Done> {
    match command {
        OutboxCommand::Stats { table, retention } => {
            stats(&open(url, &table, Some(retention)).await?, json).await
        }
        OutboxCommand::Show {
            table,
            subject,
            limit,
        } => holds::show(&open(url, &table, None).await?, &subject, limit, json).await,
        OutboxCommand::Retry { table, subject } => {
            let Some(subject) = subject.subject() else {
                note!("idem: name the run to retry, or --message ID");
                return Ok(Done::Usage);
            };
            holds::retry(&open(url, &table, None).await?, &subject, json).await
        }
    }
}

/// The outbox in `table`, which must exist: the command creates nothing.
async fn open(url: &str, table: &Table, retention: Option<Duration>) -> Result<Outbox> {
    let db = crate::database::connect(url).await?;
    let mut outbox = Outbox::builder(db)
        .table(table.table.as_str())
        .create_table(false);
    if let Some(retention) = retention {
        outbox = outbox.retention(retention);
    }
    Ok(outbox.build().await?)
}

async fn stats(outbox: &Outbox, json: bool) -> Result<Done> {
    let stats = outbox.stats().await?;
    let held: Vec<_> = stats
        .held
        .iter()
        .map(|held| {
            json!({
                "exchange": held.exchange,
                "messages": held.messages,
                "runs": held.runs,
                "longest_hold_s": held.longest_hold.as_secs_f64(),
            })
        })
        .collect();
    if json {
        let all = json!({
            "pending": stats.pending,
            "oldest_pending_age_s": stats.oldest_pending_age.map(|age| age.as_secs_f64()),
            "held": held,
            "sent": stats.sent,
            "sent_expired": stats.sent_expired,
        });
        out!("{all}");
        return Ok(Done::Ok);
    }
    let oldest = stats.oldest_pending_age.map_or_else(|| "-".into(), age);
    out!("pending       {} (oldest {oldest})", stats.pending);
    out!(
        "sent          {} ({} past the retention, awaiting the cleaner)",
        stats.sent,
        stats.sent_expired
    );
    if stats.held.is_empty() {
        out!("held          none");
        return Ok(Done::Ok);
    }
    out!("held back, by exchange:");
    let rows: Vec<Vec<String>> = stats
        .held
        .iter()
        .map(|held| {
            vec![
                holds::exchange(&held.exchange),
                held.messages.to_string(),
                held.runs.to_string(),
                age(held.longest_hold),
            ]
        })
        .collect();
    print_table(&["exchange", "messages", "runs", "held for up to"], &rows);
    Ok(Done::Ok)
}

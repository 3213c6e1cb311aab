//! `idem dlq`: a dead-letter queue's messages counted by reason, and moved back to a queue one
//! at a time with publisher confirms.
//!
//! Both read the queue with `basic.get` without acknowledging, so that every message they do
//! not move stays where it was: the broker puts the unacknowledged ones back in their places
//! when the command ends (or dies). A moved message is acknowledged only once the broker
//! confirmed its copy: a command killed in between leaves it in both queues (at least once;
//! the inbox takes the second copy as a duplicate), never in neither.

mod browse;
mod list;
mod replay;

use std::error::Error;
use std::time::Duration;

use clap::{Args as ClapArgs, Subcommand};
use idem_runtime::Inbox;

use crate::Done;
use browse::Browse;
use list::Reasons;
use replay::{Progress, dry_run, replay};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// The dead-letter queues' subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum DlqCommand {
    /// Counts a dead-letter queue's messages by reason (`x-idem-reason`), with the first and
    /// last of each and sample bodies. Every message stays in its place. (On a quorum queue,
    /// RabbitMQ before 4.3 counts each listing as a delivery, against its delivery limit.)
    List {
        #[command(flatten)]
        queue: QueueArgs,
        /// Sample bodies shown per reason.
        #[arg(long, default_value_t = 3)]
        samples: usize,
    },
    /// Moves messages to the queue TARGET (through the default exchange), one at a time: each
    /// is acknowledged once the broker confirmed its copy. The others stay in their places.
    Replay {
        #[command(flatten)]
        queue: QueueArgs,
        /// The queue to move them to (the one their consumer reads: `x-idem-queue`).
        #[arg(long, value_name = "TARGET")]
        to: String,
        /// At most this many messages.
        #[arg(long)]
        limit: Option<u64>,
        /// Moves nothing: says for each message whether the inbox holds its key (a duplicate
        /// that would be acknowledged), holds an expired record, a claim in progress, or
        /// nothing (it would be processed). Needs `DATABASE_URL` for the inbox.
        #[arg(long)]
        dry_run: bool,
        /// The inbox table, for `--dry-run`.
        #[arg(long, env = "IDEM_INBOX_TABLE", default_value = "idem_inbox")]
        table: String,
    },
}

/// The dead-letter queue, the broker, and which reason.
#[derive(Debug, ClapArgs)]
pub(crate) struct QueueArgs {
    /// The dead-letter queue (`<queue>.dlq` for idem's topologies).
    pub(super) queue: String,
    /// Only messages dead-lettered for this reason (`x-idem-reason`: `undecodable`,
    /// `fingerprint-mismatch`, `delivery-limit`, ...).
    #[arg(long, value_name = "CODE")]
    pub(super) reason: Option<String>,
    /// The broker.
    #[arg(
        long,
        env = "AMQP_URL",
        hide_env_values = true,
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    pub(super) amqp_url: String,
    /// Seconds one step with the broker (connecting, reading a message, moving one) is waited
    /// for before the command gives up; what it holds goes back to the queue.
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) timeout: u64,
}

impl QueueArgs {
    /// How long one step with the broker is waited for.
    pub(super) fn step_limit(&self) -> Duration {
        Duration::from_secs(self.timeout)
    }
}

/// Runs `step`, one exchange with the broker, given up after `limit` with an error that says
/// what was waited for.
pub(super) async fn answered<T, E: Into<Box<dyn Error>>>(
    limit: Duration,
    what: &str,
    step: impl Future<Output = std::result::Result<T, E>>,
) -> Result<T> {
    match tokio::time::timeout(limit, step).await {
        Ok(done) => done.map_err(Into::into),
        Err(_) => Err(unanswered(limit, what)),
    }
}

/// The error of a step with the broker given up after `limit`.
pub(super) fn unanswered(limit: Duration, what: &str) -> Box<dyn Error> {
    format!("the broker did not answer within {limit:?} ({what})").into()
}

/// Runs `command` against the broker, and for a dry run the inbox of `database_url`.
pub(crate) async fn run(
    database_url: Option<&str>,
    command: DlqCommand,
    json: bool,
) -> Result<Done> {
    match command {
        DlqCommand::List { queue, samples } => {
            let mut browse = Browse::open(&queue).await?;
            let mut reasons = Reasons::new(samples);
            let progress = Progress::new("read", browse.count);
            let read = async {
                while let Some((_, letter)) = browse.next().await? {
                    reasons.add(letter);
                    progress.show(reasons.total);
                }
                Ok::<_, Box<dyn Error>>(())
            }
            .await;
            progress.finish();
            browse.close().await;
            read?;
            reasons.print(&queue.queue, json);
            Ok(Done::Ok)
        }
        DlqCommand::Replay {
            queue,
            to,
            limit,
            dry_run: true,
            table,
        } => {
            let inbox = match database_url {
                Some(url) => Some(open_inbox(url, &table).await?),
                None => None,
            };
            let mut browse = Browse::open(&queue).await?;
            let letters = browse.read(limit).await;
            browse.close().await;
            dry_run(&to, &letters?, inbox.as_ref(), json).await
        }
        DlqCommand::Replay {
            queue, to, limit, ..
        } => replay(&queue, &to, limit, json).await,
    }
}

async fn open_inbox(url: &str, table: &str) -> Result<Inbox> {
    let db = crate::connect(url).await?;
    Ok(Inbox::builder(db)
        .table(table)
        .create_table(false)
        .build()
        .await?)
}

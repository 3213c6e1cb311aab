//! `idem dlq`: a dead-letter queue's messages counted by reason, and moved back to a queue one
//! at a time with publisher confirms.
//!
//! Both read the queue with `basic.get` without acknowledging, so that every message they do
//! not move stays where it was: the broker puts the unacknowledged ones back in their places
//! when the command ends (or dies). A moved message is acknowledged only once the broker
//! confirmed its copy: a command killed in between leaves it in both queues (at least once;
//! the inbox takes the second copy as a duplicate), never in neither.
//!
//! A quorum queue counts each letter given back toward its delivery limit, and drops a letter
//! past it: a look that gives letters back first reads the queue's limit from the management API
//! (`guard.rs`) and refuses a queue that has one. Replays of one queue take turns.

mod browse;
mod guard;
mod list;
mod management;
mod queue;
mod replay;

use std::error::Error;

use clap::Subcommand;

use crate::outcome::{Done, Result};
use browse::Browse;
use list::Reasons;
pub(crate) use queue::QueueArgs;
use queue::said_unread;
use replay::{Progress, dry_run, replay};

/// The dead-letter queues' subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum DlqCommand {
    /// Counts a dead-letter queue's messages by reason (`x-idem-reason`), with the first and
    /// last of each and sample bodies. Every message stays in its place. A quorum queue with a
    /// delivery limit is refused (exit 4): each look would bring its letters closer to it.
    List {
        #[command(flatten)]
        queue: QueueArgs,
        /// Sample bodies shown per reason.
        #[arg(long, default_value_t = 3)]
        samples: usize,
    },
    /// Moves messages to the queue TARGET (through the default exchange), one at a time: each
    /// is acknowledged once the broker confirmed its copy. The others stay in their places. One
    /// replay of a queue runs at a time (another is refused, exit 4); one that could not read
    /// every message the queue held at its start says so (exit 5).
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

/// Runs `command` against the broker, and for a dry run the inbox of `database_url`.
pub(crate) async fn run(
    database_url: Option<&str>,
    command: DlqCommand,
    json: bool,
) -> Result<Done> {
    match command {
        DlqCommand::List { queue, samples } => {
            guard::returns_are_free(&queue).await?;
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
            let unread = browse.unread;
            browse.close().await;
            read?;
            reasons.print(&queue.queue, unread, json);
            Ok(said_unread(unread))
        }
        DlqCommand::Replay {
            queue,
            to,
            limit,
            dry_run: true,
            table,
        } => {
            guard::returns_are_free(&queue).await?;
            let inbox = match database_url {
                Some(url) => Some(crate::inbox::open_table(url, &table, false).await?),
                None => None,
            };
            let mut browse = Browse::open(&queue).await?;
            let letters = browse.read(limit).await;
            let unread = browse.unread;
            browse.close().await;
            dry_run(&to, &letters?, inbox.as_ref(), json).await?;
            Ok(said_unread(unread))
        }
        DlqCommand::Replay {
            queue, to, limit, ..
        } => {
            if queue.reason.is_some() {
                // The letters of other reasons are given back.
                guard::returns_are_free(&queue).await?;
            }
            replay(&queue, &to, limit, json).await
        }
    }
}

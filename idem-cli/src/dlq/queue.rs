//! The dead-letter queue a command reads, and each exchange with the broker about it: given up
//! after the command's `--timeout`, with an error that says what was waited for.

use std::error::Error;
use std::time::Duration;

use clap::Args as ClapArgs;

use crate::outcome::{Done, Result};
use crate::output::note;

/// The dead-letter queue, the broker, and which reason.
#[derive(Debug, ClapArgs)]
pub(crate) struct QueueArgs {
    /// The dead-letter queue (`<queue>.dlq` for idem's topologies).
    pub(crate) queue: String,
    /// Only messages dead-lettered for this reason (`x-idem-reason`: `undecodable`,
    /// `fingerprint-mismatch`, `delivery-limit`, ...).
    #[arg(long, value_name = "CODE")]
    pub(crate) reason: Option<String>,
    /// The broker.
    #[arg(
        long,
        env = "AMQP_URL",
        hide_env_values = true,
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    pub(crate) amqp_url: String,
    /// Seconds one step with the broker (connecting, reading a message, moving one) is waited
    /// for before the command gives up; what it holds goes back to the queue.
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) timeout: u64,
    /// The broker's management API, which tells a queue's type and delivery limit (default:
    /// http://<the first node's host>:15672, asked with the AMQP URL's user, which needs the
    /// monitoring or management tag).
    #[arg(long, env = "RABBITMQ_MANAGEMENT_URL", value_name = "URL")]
    pub(crate) management_url: Option<String>,
    /// Takes the queue to have no delivery limit without asking the management API: for a
    /// broker whose API cannot be read, by an operator who checked the queue's arguments and
    /// policies.
    #[arg(long)]
    pub(crate) no_delivery_limit: bool,
}

impl QueueArgs {
    /// How long one step with the broker is waited for.
    pub(crate) fn step_limit(&self) -> Duration {
        Duration::from_secs(self.timeout)
    }
}

/// Runs `step`, one exchange with the broker, given up after `limit` with an error that says
/// what was waited for.
pub(crate) async fn answered<T, E: Into<Box<dyn Error>>>(
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
pub(crate) fn unanswered(limit: Duration, what: &str) -> Box<dyn Error> {
    format!("the broker did not answer within {limit:?} ({what})").into()
}

/// Says, when letters the queue held at the start could not be read (another client held
/// them), that the command did what it was asked in part only.
pub(crate) fn said_unread(unread: u32) -> Done {
    if unread == 0 {
        return Done::Ok;
    }
    note!(
        "idem: {unread} messages the queue held at the start could not be read: another \
         client (a replay, a listing, a consumer) held them, or more kept coming. Run the command \
         again once it is done"
    );
    Done::Partly
}

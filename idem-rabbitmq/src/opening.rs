//! Opening a session with the broker: each step given up on after a time limit, and the first
//! session of a consumer or a relay tried again while the broker's state keeps it from opening.

use std::time::Duration;

use idem_runtime::transport::Backoff;

use crate::error::{Error, Result};

/// How long `start` keeps opening the first session while the broker's state refuses it (a node
/// going away, a cluster without the majority a quorum queue needs, a silence past the open
/// timeout) before it gives up.
const START_PATIENCE: Duration = Duration::from_secs(60);

/// The longest wait between two tries at start.
const MOST_BETWEEN_TRIES: Duration = Duration::from_secs(5);

/// `step`, given up on after `limit` as [`Error::TimedOut`] doing `operation`.
pub(crate) async fn within<T>(
    limit: Duration,
    operation: &str,
    step: impl Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, step).await.unwrap_or_else(|_| {
        Err(Error::TimedOut {
            operation: operation.to_owned(),
            after: limit,
        })
    })
}

/// The first session of `what` (a queue's consumer, a table's relay), opened by `open`: a
/// failure the broker's state explains ([`Error::is_transient`]) is tried again, `first_delay`
/// after it and longer after each next one, with no new try begun after a minute (the one under
/// way may last its own time limits); any other fails at once, so that a wrong URL or topology
/// fails `start`.
pub(crate) async fn patiently<T, F>(
    what: &str,
    first_delay: Duration,
    mut open: impl FnMut() -> F,
) -> Result<T>
where
    F: Future<Output = Result<T>>,
{
    let begun = tokio::time::Instant::now();
    let mut delays = Backoff::new(first_delay, MOST_BETWEEN_TRIES).delays();
    let mut attempt = 1;
    loop {
        match open().await {
            Ok(session) => return Ok(session),
            Err(error) if error.is_transient() && begun.elapsed() < START_PATIENCE => {
                tracing::warn!(what, %error, attempt, "the broker could not open the session now; trying again");
                tokio::time::sleep(delays.next().unwrap_or(MOST_BETWEEN_TRIES)).await;
                attempt += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

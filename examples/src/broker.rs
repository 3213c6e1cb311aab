//! Reaching the broker as a service and as a one-off run do: a service waits as long as it
//! takes, a run gives up after a bounded wait with an error that says what to do.

use std::time::Duration;

use idem_rabbitmq::{AmqpUrl, Publisher};
use tokio::time::Instant;

/// The broker could not be reached within the wait.
#[derive(Debug, thiserror::Error)]
#[error(
    "RabbitMQ at {url} could not be reached within {waited:?} (every attempt is logged above); \
     is it running? Start it with `rabbitmq-server -detached` (or `bash .ci/run`, which starts \
     every service the tests use), or point `--amqp-url` / `AMQP_URL` at your broker"
)]
pub struct BrokerUnreachable {
    /// The broker's URL, password hidden.
    pub url: String,
    /// How long it was tried.
    pub waited: Duration,
}

/// How long `--demo` and `orders` wait for the broker before giving up.
pub const DEFAULT_BROKER_WAIT: Duration = Duration::from_secs(30);

/// A publisher of the broker at `url`: within `wait`, or, without one, for as long as it takes,
/// trying again with a growing delay and logging each failed try.
///
/// # Errors
///
/// [`BrokerUnreachable`] once `wait` is over. A broker that refuses the connection (wrong
/// credentials, no such virtual host) is tried again like one that is down, its reason logged.
pub async fn reach(url: &AmqpUrl, wait: Option<Duration>) -> Result<Publisher, BrokerUnreachable> {
    let unreachable = || BrokerUnreachable {
        url: url.redacted(),
        waited: wait.unwrap_or_default(),
    };
    let deadline = wait.map(|wait| Instant::now() + wait);
    let mut delay = Duration::from_secs(1);
    loop {
        let connecting = Publisher::connect(url.clone());
        let tried = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, connecting).await {
                Ok(tried) => tried,
                Err(_) => return Err(unreachable()),
            },
            None => connecting.await,
        };
        match tried {
            Ok(publisher) => return Ok(publisher),
            Err(error) => {
                tracing::warn!(broker = %url, %error, retry_in = ?delay, "RabbitMQ cannot be reached; trying again");
            }
        }
        if deadline.is_some_and(|deadline| Instant::now() + delay >= deadline) {
            return Err(unreachable());
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}

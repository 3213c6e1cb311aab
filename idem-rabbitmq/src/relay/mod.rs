//! The outbox relay: publishes what was staged in the outbox, once its transaction committed,
//! with publisher confirms, in the order each run staged it.

mod held;
mod listen;
mod pipeline;
mod run;
mod session;
mod settings;
mod stats;

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::outbox::{Outbox, Relaying};
use idem_runtime::transport::Backoff;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::connect::Retirees;
use crate::error::{Error, Result, SettingError};
use crate::opening::patiently;
use crate::stop::StopSignal;
use crate::url::AmqpUrl;

use run::Runner;
use session::RelaySession;
use settings::{HoldTimes, RelaySettings};
use stats::RelayCounters;
pub use stats::RelayStats;

/// How long a replaced connection is watched, so that a reconnection lapin had under way when
/// it was replaced is closed: a handshake, seconds at most.
const RETIRE_TIMEOUT: Duration = Duration::from_secs(60);

/// Configures a relay; see [`Relay`].
#[derive(Debug)]
#[must_use = "a relay does nothing until it is started"]
pub struct RelayBuilder {
    outbox: Outbox,
    settings: RelaySettings,
}

/// Publishes the messages committed to an [`Outbox`], and marks them sent.
///
/// Handlers stage messages in their own transaction
/// ([`Context::stage`](idem_runtime::Context::stage)); they commit with the handler's effects and
/// its inbox record, or not at all. A relay takes committed, unsent messages in batches
/// ([`Relaying::take_pending`](idem_runtime::outbox::Relaying::take_pending)), publishes each one with the message id it was staged with, its
/// headers and content type, persistent and `mandatory`, waits for the broker's confirms, and
/// marks the confirmed ones sent in the batch's transaction.
///
/// In short: the messages of one run go out in the order they were staged; a message the
/// broker does not take is held back with the rest of its run while other runs go on; a message
/// whose confirm is lost goes out again with the same id, for the next hop's inbox; several
/// relays can share a table on PostgreSQL and MySQL/MariaDB. The whole of it, holds and
/// wake-ups included: [`guide::relay`](crate::guide::relay).
///
/// The relay needs no inbox. It uses one connection of the outbox's pool for each batch, and a
/// second one on PostgreSQL for `LISTEN`. Without an inbox, whose cleaner deletes the sent
/// messages, call [`Outbox::delete_sent`](idem_runtime::outbox::Outbox::delete_sent) now and then.
///
/// # Metrics
///
/// `idem_outbox_published_total{table}` counts confirmed publishes,
/// `idem_outbox_publish_failures_total{table, reason}` publishes the broker did not take
/// (`unroutable`, `refused`, `no-confirm`, `channel`), and the gauge
/// `idem_outbox_pending_age_seconds{table}` is the age of the oldest message of the last batch
/// taken (0 when there was none).
///
/// ```no_run
/// # async fn demo(db: idem_runtime::sea_orm::DatabaseConnection) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use idem_rabbitmq::Relay;
/// use idem_runtime::outbox::Outbox;
///
/// let outbox = Outbox::builder(db).build().await?;
/// let relay = Relay::builder("amqp://guest:guest@127.0.0.1:5672/%2f", outbox)
///     .batch_size(200)
///     .poll_interval(Duration::from_secs(5))
///     .start()
///     .await?;
/// let _ = tokio::signal::ctrl_c().await;
/// let stats = relay.shutdown().await;
/// println!("published {}", stats.published);
/// # Ok(()) }
/// ```
///
/// [`RelayBuilder::start`] returns the running relay: its counts, and its shutdown. Dropping it
/// stops the relay too, after the batch in hand, without waiting for it.
#[derive(Debug)]
#[must_use = "dropping the relay stops it"]
pub struct Relay {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    counters: Arc<RelayCounters>,
}

impl Relay {
    /// Starts configuring a relay that publishes `outbox`'s messages to the broker at `url`.
    pub fn builder(url: impl Into<AmqpUrl>, outbox: Outbox) -> RelayBuilder {
        RelayBuilder {
            outbox,
            settings: RelaySettings::new(url.into()),
        }
    }
}

/// The running relay's former name.
#[deprecated(note = "`RelayBuilder::start` returns `Relay` itself")]
pub type RelayHandle = Relay;

/// The most messages a relay batch may take: its statements bind one parameter per message,
/// and databases bind 32 766 (SQLite) or 65 535 at most.
pub const MAX_RELAY_BATCH: u32 = 10_000;

impl RelayBuilder {
    /// How many messages one batch takes, publishes and marks sent in one transaction
    /// (default 100, at most [`MAX_RELAY_BATCH`]).
    pub fn batch_size(mut self, size: u32) -> Self {
        self.settings.batch_size = size;
        self
    }

    /// How often the relay looks for messages when nothing woke it (default 1 s): a fallback
    /// for relays that no commit notifies (another process on MySQL/MariaDB or SQLite).
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.settings.poll_interval = interval;
        self
    }

    /// The name the relay's connection shows in the broker's management tools (default
    /// `idem relay`).
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.settings.connection_name = name.into();
        self
    }

    /// How long to wait for the broker's confirm of a publish (default 10 s); a publish not
    /// confirmed in time is tried again, with the same message id, after the back-off.
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.settings.confirm_timeout = timeout;
        self
    }

    /// How long opening a session (its connection and channel) is waited for before the attempt
    /// is given up and the next one made (default 30 s): a broker that accepts connections but
    /// never answers (a host gone behind a load balancer, a node killed while the session
    /// opened) would otherwise hold the relay for good.
    pub fn open_timeout(mut self, timeout: Duration) -> Self {
        self.settings.open_timeout = timeout;
        self
    }

    /// The wait after a failure (a publish not taken, the broker or the database unreachable)
    /// before trying again: `base`, doubling with each consecutive failure, at most `max`
    /// (defaults 200 ms and 10 s).
    pub fn retry_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.settings.backoff = Backoff::new(base, max);
        self
    }

    /// How long a message the broker refused is held back, with the rest of its run, before
    /// it is tried again: `first` for a message the broker did not take (unroutable, negatively
    /// confirmed), six times as long for one whose publish closed the channel (its exchange
    /// missing or forbidden), each hold doubling the one before, at most `max` (defaults 5 s,
    /// 30 s and 300 s). An operator who fixed the cause lifts a hold at once with
    /// `idem outbox retry`.
    pub fn hold_backoff(mut self, first: Duration, max: Duration) -> Self {
        self.settings.holds = HoldTimes::new(first, max);
        self
    }

    /// Connects to the broker (and, on PostgreSQL, listens on the outbox's channel), then
    /// publishes in a task of its own until [`Relay::shutdown`].
    ///
    /// # Errors
    ///
    /// A setting is zero, the broker cannot be reached, or the PostgreSQL listening connection
    /// cannot be opened. Nothing is left running then.
    pub async fn start(self) -> Result<Relay> {
        self.validate()?;
        crate::metrics::describe();
        let settings = Arc::new(self.settings);
        let retirees = Retirees::new(RETIRE_TIMEOUT);
        let what = format!("relay of {}", self.outbox.table().as_str());
        let first_delay = settings.backoff.base();
        let open = || RelaySession::open(&settings, &retirees);
        let session = patiently(&what, first_delay, open).await?;
        let wake = Arc::new(Notify::new());
        let (stop, stopped) = watch::channel(false);
        let stopped = StopSignal::new(stopped);
        let mut tasks = Vec::new();
        if self.outbox.announces() {
            match listen::start(&self.outbox, &wake, &settings, stopped.clone()).await {
                Ok(Some(task)) => tasks.push(task),
                Ok(None) => tracing::warn!(
                    table = self.outbox.table().as_str(),
                    "idem-rabbitmq is built without its `postgres` feature: this relay is not \
                     woken by commits in other processes, only by polling"
                ),
                Err(error) => {
                    session.retire(&retirees);
                    retirees.wait_until_gone(Duration::from_secs(5)).await;
                    return Err(error);
                }
            }
        }
        let counters = Arc::new(RelayCounters::default());
        let runner = Runner::new(
            self.outbox,
            settings,
            Arc::clone(&counters),
            retirees,
            session,
            wake,
            stopped,
        );
        tasks.push(tokio::spawn(runner.run()));
        Ok(Relay {
            stop,
            tasks,
            counters,
        })
    }

    /// Refuses settings that cannot work, naming every one of them.
    fn validate(&self) -> Result<()> {
        let settings = &self.settings;
        let zeros = [
            ("the relay batch size", settings.batch_size == 0),
            ("the relay poll interval", settings.poll_interval.is_zero()),
            ("the confirm timeout", settings.confirm_timeout.is_zero()),
            ("the open timeout", settings.open_timeout.is_zero()),
            (
                "the relay retry back-off",
                settings.backoff.base().is_zero(),
            ),
            (
                "the relay hold back-off",
                settings.holds.not_taken.is_zero(),
            ),
        ];
        let mut problems: Vec<SettingError> = zeros
            .into_iter()
            .filter(|(_, zero)| *zero)
            .map(|(what, _)| SettingError::Zero(what))
            .collect();
        if settings.batch_size > MAX_RELAY_BATCH {
            problems.push(SettingError::RelayBatchTooLarge {
                size: settings.batch_size,
                max: MAX_RELAY_BATCH,
            });
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::Settings(problems))
        }
    }
}

impl Relay {
    /// Counts of the relay's publishes so far.
    pub fn stats(&self) -> RelayStats {
        self.counters.snapshot()
    }

    /// Stops the relay: it finishes the batch in hand (publishes the rest of it, unless one
    /// fails, and marks the confirmed ones sent), then closes its connections. A relay waiting
    /// for work or backing off stops at once. Returns its final counts.
    ///
    /// # Cancel safety
    ///
    /// The relay is told to stop before the first wait: dropping this future stops it all the
    /// same, in the background. Messages of a batch it abandons (the task aborted with the
    /// runtime) are released by the database and published by the next relay.
    pub async fn shutdown(mut self) -> RelayStats {
        self.stop.send_replace(true);
        for task in std::mem::take(&mut self.tasks) {
            if let Err(error) = task.await {
                tracing::error!(%error, "outbox relay task failed");
            }
        }
        self.counters.snapshot()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

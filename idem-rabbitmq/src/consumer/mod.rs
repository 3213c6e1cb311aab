//! The consumer: handlers bound to queues, every delivery settled as the inbox decides.

mod batch;
mod binding;
mod copy;
mod gather;
pub mod headers;
mod interrupt;
mod job;
mod session;
mod settings;
mod settle;
mod stats;
mod unsettled;
mod worker;

use std::any::TypeId;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use idem_runtime::{
    Handler, Inbox,
    retention::{Cleaner, CleanerHandle},
};
use serde::de::DeserializeOwned;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;

use crate::connect::Retirees;
use crate::error::{Error, Result, SettingError};
use crate::stop::StopSignal;
use crate::topology::QueueTopology;
use crate::url::AmqpUrl;

use binding::Dispatch;
pub use binding::{Binding, DEFAULT_BATCHES_IN_FLIGHT};
use idem_runtime::transport::{Backoff, RetryMemory};
use settings::ConsumerSettings;
use stats::ConsumerCounters;
pub use stats::DeliveryStats;

/// The properties idem gives a copy of a delivery it publishes again (a dead letter, a letter
/// moved back): the original's, persistent, with `headers`, without its user id (the broker
/// checks it against the publisher's login) or expiration.
pub fn copy_properties(
    original: &lapin::BasicProperties,
    headers: lapin::types::FieldTable,
) -> lapin::BasicProperties {
    copy::properties_of(original, headers, false)
}
pub use worker::ShutdownReport;
use worker::Worker;

/// Consumes queues with idempotent handlers and settles every delivery:
///
/// | what the inbox says | settle |
/// |---|---|
/// | processed, or a duplicate with the same content | ack |
/// | handler's transient error | reject + requeue after a back-off, up to [`max_deliveries`](ConsumerBuilder::max_deliveries); then dead-letter (`delivery-limit`) |
/// | database unreachable or contended, in progress elsewhere, a server that takes no writes | requeue after a back-off (nack; on a quorum queue, a fresh copy and an ack), not counted toward `max_deliveries` (an unreachable database is counted once other messages reach it meanwhile; a server that takes no writes never is) |
/// | undecodable payload, missing or invalid key, reused key with other content, needs intervention, handler's permanent error | dead-letter with a reason |
///
/// Dead-lettering publishes a copy to the queue's dead-letter exchange with the headers in
/// [`headers`] (`x-idem-reason`, `x-idem-detail`, `x-idem-consumer`, `x-idem-key`, ...) and the
/// routing key the broker would use (the queue's
/// [`dead_letter_routing_key`](QueueTopology::dead_letter_routing_key), else the message's own:
/// the one it was first published with, which a quorum queue's fresh copies carry in
/// `x-idem-routing-key`),
/// waits for the broker's confirm, then acknowledges the original; a copy the broker does not
/// take leaves the original requeued, paced by
/// [`dead_letter_retry`](ConsumerBuilder::dead_letter_retry) and counted as
/// `dead-letter-failed`. Nothing is acknowledged before its effect is committed.
///
/// Each binding has its own connection (lapin's automatic recovery on; a session that does not
/// recover within [`recovery_timeout`](ConsumerBuilder::recovery_timeout) is replaced by a new
/// connection, and the replaced one is refused any reconnection, see
/// [`retire_timeout`](ConsumerBuilder::retire_timeout)), a prefetch window and manual acknowledgments, and a second connection that
/// publishes its copies (dead-letter copies, requeued copies on quorum queues), so that a broker
/// resource alarm, which blocks connections that publish, does not hold up its acknowledgments; [`max_in_flight`](ConsumerBuilder::max_in_flight)
/// bounds the handlers running at once across bindings. Deliveries whose channel died before
/// they were settled are redelivered by the broker, and the inbox recognises them.
///
/// The consumer also runs the inbox's [cleaner](idem_runtime::retention::Cleaner), which deletes expired
/// records, from its start to its shutdown, unless told not to
/// ([`without_cleaner`](ConsumerBuilder::without_cleaner)); it warns at start when the inbox's
/// pool leaves handlers no connection while the cleaner runs.
///
/// ```no_run
/// # async fn demo(inbox: idem_runtime::Inbox, handler: impl idem_runtime::Handler<Message = serde_json::Value> + 'static) -> Result<(), idem_rabbitmq::Error> {
/// use idem_rabbitmq::{Consumer, QueueTopology};
///
/// let consumer = Consumer::builder("amqp://guest:guest@127.0.0.1:5672/%2f", inbox)
///     .bind(QueueTopology::quorum("billing.orders").delivery_limit(20), handler)
///     .prefetch(50)
///     .start()
///     .await?;
/// let report = consumer.run_until(async { let _ = tokio::signal::ctrl_c().await; }).await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Consumer {
    shutdown: Arc<watch::Sender<bool>>,
    workers: Vec<JoinHandle<ShutdownReport>>,
    counters: Arc<ConsumerCounters>,
    cleaner: Option<CleanerHandle>,
}

/// Asks a running [`Consumer`] to stop; cloneable, usable from anywhere.
#[derive(Debug, Clone)]
pub struct ShutdownHandle(Arc<watch::Sender<bool>>);

impl ShutdownHandle {
    /// Asks the consumer to stop taking deliveries and finish the ones in flight.
    pub fn shutdown(&self) {
        self.0.send_replace(true);
    }
}

impl Consumer {
    /// Starts configuring a consumer of the broker at `url` that processes through `inbox`.
    pub fn builder(url: impl Into<AmqpUrl>, inbox: Inbox) -> ConsumerBuilder {
        ConsumerBuilder {
            inbox,
            bindings: Vec::new(),
            settings: ConsumerSettings::new(url.into()),
        }
    }

    /// Counts of settled deliveries so far.
    pub fn stats(&self) -> DeliveryStats {
        self.counters.snapshot()
    }

    /// A handle that asks the consumer to stop, e.g. from a signal handler.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(Arc::clone(&self.shutdown))
    }

    /// Stops taking deliveries, lets in-flight handlers finish (until the
    /// [`shutdown_timeout`](ConsumerBuilder::shutdown_timeout)), settles them and closes the
    /// connections, for good: neither they nor connections replaced earlier come back, even if
    /// lapin was recovering them. Deliveries prefetched but not started go back to the queue.
    /// Then stops the inbox's cleaner after its current batch.
    pub async fn shutdown(self) -> ShutdownReport {
        self.shutdown.send_replace(true);
        self.join().await
    }

    /// Runs until `signal` completes (`tokio::signal::ctrl_c()`, a SIGTERM stream, a
    /// [`ShutdownHandle`]...), then shuts down gracefully.
    pub async fn run_until(self, signal: impl Future<Output = ()>) -> ShutdownReport {
        let stopped = StopSignal::new(self.shutdown.subscribe());
        stopped.unless_stopped(signal).await;
        self.shutdown().await
    }

    async fn join(self) -> ShutdownReport {
        let mut report = ShutdownReport::default();
        for worker in self.workers {
            match worker.await {
                Ok(part) => report.add(part),
                Err(error) => tracing::error!(%error, "consumer worker failed"),
            }
        }
        if let Some(cleaner) = self.cleaner {
            report.cleanup = Some(cleaner.stop().await);
        }
        report
    }
}

/// Configures a [`Consumer`].
#[derive(Debug)]
pub struct ConsumerBuilder {
    inbox: Inbox,
    bindings: Vec<Arc<dyn Dispatch>>,
    settings: ConsumerSettings,
}

impl std::fmt::Debug for dyn Dispatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Binding")
            .field("queue", &self.topology().queue())
            .field("consumer", &self.consumer())
            .finish()
    }
}

impl ConsumerBuilder {
    /// Binds `handler` to the queue of `topology`, decoding JSON payloads.
    pub fn bind<H>(self, topology: QueueTopology, handler: H) -> Self
    where
        H: Handler + 'static,
        H::Message: DeserializeOwned,
    {
        self.bind_with(Binding::new(topology, handler))
    }

    /// Adds a binding, e.g. one with another codec.
    pub fn bind_with<H, C>(mut self, binding: Binding<H, C>) -> Self
    where
        H: Handler + 'static,
        H::Message: DeserializeOwned,
        C: crate::codec::Codec,
    {
        self.bindings.push(Arc::new(binding));
        self
    }

    /// How many unacknowledged deliveries the broker sends each binding ahead (default 32).
    pub fn prefetch(mut self, prefetch: u16) -> Self {
        self.settings.prefetch = prefetch;
        self
    }

    /// How many handlers may run at once, across bindings (default 16).
    pub fn max_in_flight(mut self, max: usize) -> Self {
        self.settings.max_in_flight = max;
        self
    }

    /// How many deliveries a message gets before a transient failure dead-letters it with reason
    /// `delivery-limit` (default 10). Counted by the broker on quorum queues
    /// (`x-delivery-count`), by this process on classic ones, where an `x-delivery-count`
    /// header is a stale copy and is ignored. A delivery requeued because
    /// another worker holds the message's claim, or because the inbox database is unreachable,
    /// is not a failed attempt: it goes back with `basic.nack` on a classic queue, and as a fresh
    /// copy on a quorum queue, so that the broker's count does not rise either; failures go back
    /// with `basic.reject`.
    pub fn max_deliveries(mut self, max: u32) -> Self {
        self.settings.retry.max_deliveries = max;
        self
    }

    /// The wait before requeueing a message that failed transiently: `base` after the first
    /// delivery, doubling each time, at most `max` (defaults 200 ms and 10 s).
    pub fn retry_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.settings.retry.backoff = Backoff::new(base, max);
        self
    }

    /// How a message whose dead-letter copy the broker does not take (the dead-letter exchange
    /// routes its routing key to no queue, the dead-letter queue is full...) is retried. Each
    /// time it goes back to the queue, never lost, counted as `dead-letter-failed` and logged as
    /// an error; it gets `attempts` quick tries (the usual back-off between them), then one per
    /// `pause` (defaults 3 and 60 s). A pause of zero is refused: it would loop.
    pub fn dead_letter_retry(mut self, attempts: u32, pause: Duration) -> Self {
        self.settings.retry.dead_letter_attempts = attempts;
        self.settings.retry.dead_letter_pause = pause;
        self
    }

    /// How long in-flight handlers get to finish at shutdown (default 30 s).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.settings.shutdown_timeout = timeout;
        self
    }

    /// How long to wait for lapin's automatic recovery before replacing the connection
    /// (default 30 s). A connection that stops answering without closing (a silent network, a
    /// lapin thread blocked for good) counts as lost too: the consumer probes its consuming
    /// connection every quarter of this timeout (at most every 10 s), and replaces one that
    /// answered no probe for two periods and a second (5 s at least), then this timeout.
    pub fn recovery_timeout(mut self, timeout: Duration) -> Self {
        self.settings.recovery_timeout = timeout;
        self
    }

    /// How long opening a session (its connections, topology and channels) is waited for
    /// before the attempt is given up and the next one made (default 30 s): a broker that
    /// accepts connections but never answers (a host gone behind a load balancer, a half-open
    /// connection after a restart) would otherwise hold the binding for good.
    pub fn open_timeout(mut self, timeout: Duration) -> Self {
        self.settings.open_timeout = timeout;
        self
    }

    /// How long a connection that was replaced (not recovered within the
    /// [`recovery_timeout`](ConsumerBuilder::recovery_timeout)) is watched (default 60 s).
    ///
    /// From the moment it is replaced, lapin's automatic recovery of it is refused for good: it
    /// cannot come back and consume deliveries that nobody reads, however long the outage. A
    /// reconnection already under way then that still completes within this time is closed at
    /// once. lapin's own recovery is bounded by the recovery timeout plus this one.
    pub fn retire_timeout(mut self, timeout: Duration) -> Self {
        self.settings.retire_timeout = timeout;
        self
    }

    /// The first delay between reconnection attempts; it doubles up to 30 s (default 1 s).
    pub fn reconnect_delay(mut self, delay: Duration) -> Self {
        self.settings.reconnect_delay = delay;
        self
    }

    /// Does not run the inbox's cleaner, which the consumer otherwise runs from its start to its
    /// shutdown: for an application that runs [`Inbox::cleaner`] itself, or leaves cleanup to
    /// another process.
    ///
    /// The cleaner deletes expired records in bounded batches, every
    /// [`cleanup_interval`](idem_runtime::RetentionPolicy::cleanup_interval), one process at a
    /// time per table whatever runs it (a database lock), so consumers in several processes can
    /// all keep it on.
    pub fn without_cleaner(mut self) -> Self {
        self.settings.cleaner = false;
        self
    }

    /// The name the connections show in the broker's management tools, followed by the queue
    /// (default `idem`).
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.settings.connection_name = name.into();
        self
    }

    /// Checks the handlers against the inbox, connects, declares each binding's topology and
    /// starts consuming. Fails, with nothing left running, if any of it fails. A session the
    /// broker's state keeps from opening (a node going away under it, a silence past the
    /// [`open_timeout`](ConsumerBuilder::open_timeout), a cluster without the majority a
    /// quorum queue needs) is tried again, from the next node, with no new try begun after a
    /// minute; a refused topology fails at once, and a broker no node of which can be reached
    /// fails with [`Error::Connect`](crate::Error::Connect) and the reason once the open
    /// timeout has passed.
    pub async fn start(self) -> Result<Consumer> {
        self.validate()?;
        crate::metrics::describe();
        for binding in &self.bindings {
            binding.check(&self.inbox)?;
        }
        let (shutdown, stop) = watch::channel(false);
        let shutdown = Arc::new(shutdown);
        let settings = Arc::new(self.settings);
        let counters = Arc::new(ConsumerCounters::default());
        let retries = Arc::new(RetryMemory::default());
        let in_flight = Arc::new(Semaphore::new(settings.max_in_flight));
        let retirees = Arc::new(Retirees::new(settings.retire_timeout));
        let mut consumer = Consumer {
            shutdown,
            workers: Vec::new(),
            counters: Arc::clone(&counters),
            cleaner: None,
        };
        for binding in self.bindings {
            let batches = binding.batches_in_flight();
            let worker = Worker {
                binding,
                inbox: self.inbox.clone(),
                settings: Arc::clone(&settings),
                counters: Arc::clone(&counters),
                retries: Arc::clone(&retries),
                in_flight: Arc::clone(&in_flight),
                batches: Arc::new(Semaphore::new(batches)),
                retirees: Arc::clone(&retirees),
                stop: StopSignal::new(stop.clone()),
                queue_kind: OnceLock::new(),
                broker_major: OnceLock::new(),
            };
            match worker.start().await {
                Ok(handle) => consumer.workers.push(handle),
                Err(error) => {
                    consumer.shutdown().await;
                    return Err(error);
                }
            }
        }
        if settings.cleaner {
            let cleaner = self.inbox.cleaner();
            check_pool(&cleaner, settings.max_in_flight);
            consumer.cleaner = Some(cleaner.spawn());
        }
        Ok(consumer)
    }

    /// Refuses settings that cannot work, naming every one of them.
    fn validate(&self) -> Result<()> {
        let settings = &self.settings;
        let mut problems = Vec::new();
        if self.bindings.is_empty() {
            problems.push(SettingError::NoBinding);
        }
        let zeros = [
            ("prefetch", settings.prefetch == 0),
            ("max_in_flight", settings.max_in_flight == 0),
            ("max_deliveries", settings.retry.max_deliveries == 0),
            (
                "the dead-letter retry pause",
                settings.retry.dead_letter_pause.is_zero(),
            ),
            ("the open timeout", settings.open_timeout.is_zero()),
        ];
        problems.extend(
            zeros
                .into_iter()
                .filter(|(_, zero)| *zero)
                .map(|(what, _)| SettingError::Zero(what)),
        );
        problems.extend(self.shared_consumer_names());
        for binding in &self.bindings {
            problems.extend(binding.check_batching());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::Settings(problems))
        }
    }

    /// Two different handlers under one consumer name: they would share inbox records, and one
    /// would skip the other's messages as duplicates. One handler bound to several queues keeps
    /// its name, and processes a message that reaches it through both once.
    fn shared_consumer_names(&self) -> Vec<SettingError> {
        let mut seen: HashMap<&str, (TypeId, &str)> = HashMap::new();
        let mut shared = Vec::new();
        for binding in &self.bindings {
            let (id, name) = binding.handler_type();
            match seen.insert(binding.consumer(), (id, name)) {
                Some((other_id, other)) if other_id != id => {
                    shared.push(SettingError::SharedConsumerName {
                        consumer: binding.consumer().to_owned(),
                        first: other,
                        second: name,
                    });
                }
                _ => {}
            }
        }
        shared
    }
}

/// Warns when the inbox's pool leaves handlers no connection while the cleaner runs: it holds
/// some of them for a whole run (two on PostgreSQL and MySQL/MariaDB).
fn check_pool(cleaner: &Cleaner, max_in_flight: usize) {
    let needed = cleaner.connections_needed();
    let Some(pool) = cleaner.pool_max_connections() else {
        return;
    };
    if pool <= needed {
        let advised = needed.saturating_add(u32::try_from(max_in_flight).unwrap_or(u32::MAX));
        tracing::warn!(
            pool,
            cleaner_holds = needed,
            max_in_flight,
            "the inbox's connection pool is too small for its cleaner: while a cleanup runs, \
             handlers get no connection (or the cleaner waits for itself); give the pool \
             {advised} connections (the cleaner's {needed} + max_in_flight), or run the cleaner \
             elsewhere (ConsumerBuilder::without_cleaner)"
        );
    }
}

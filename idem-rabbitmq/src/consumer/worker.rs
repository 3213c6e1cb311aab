//! One binding's worker: a session (connection, channels, consumer) that is reopened when it
//! fails, deliveries handed to tasks within the in-flight bound, and a graceful drain.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use std::pin::Pin;

use std::panic::AssertUnwindSafe;

use futures_util::{FutureExt, Stream, StreamExt};
use idem_runtime::{CleanupReport, Inbox};
use lapin::message::Delivery;
use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, ConfirmSelectOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, Event};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;
use tracing::field::Empty;

use super::Settings;
use super::batch::BatchJob;
use super::binding::{Dispatch, Handled};
use super::settle::Settler;
use super::stats::{Settled, Stats};
use super::unsettled::Unsettled;
use crate::confirm::ConfirmChannel;
use crate::connect::{Link, Retirees};
use crate::error::{Error, Result};
use crate::metadata::metadata_of;
use crate::topology::QueueKind;
use idem_runtime::delivery::{Backoff, RetryMemory};

/// What a worker did at shutdown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Handlers that were running at shutdown and finished, their deliveries settled.
    pub completed: usize,
    /// Handlers still running at the deadline, stopped; their deliveries go back to the queue
    /// when the channel closes, and a transactional handler's work is rolled back.
    pub abandoned: usize,
    /// What the inbox's cleaner did while the consumer ran; `None` if it did not run it
    /// ([`without_cleaner`](crate::ConsumerBuilder::without_cleaner)).
    pub cleanup: Option<CleanupReport>,
}

impl ShutdownReport {
    pub(crate) fn add(&mut self, other: ShutdownReport) {
        self.completed += other.completed;
        self.abandoned += other.abandoned;
    }
}

/// An open connection with its consuming channel, and a second connection for the copies the
/// consumer publishes: a broker short of memory or disk blocks connections that publish, and the
/// consuming one must go on acknowledging.
struct Session {
    connection: Link,
    channel: Channel,
    publishing: Link,
    publisher: ConfirmChannel,
    consumer: lapin::Consumer,
    events: Pin<Box<dyn Stream<Item = Event> + Send + Sync>>,
    /// The queue's type, as declared or as the broker told.
    kind: QueueKind,
}

/// Watches a session that lapin may be recovering, so that a recovery that never completes is
/// not waited for forever.
struct Health {
    lost_since: Option<Instant>,
    timeout: Duration,
}

impl Health {
    fn new(timeout: Duration) -> Self {
        Self {
            lost_since: None,
            timeout,
        }
    }

    /// Notes a connection event; returns whether it is a completed recovery (the session's first
    /// `Connected` came before it listened).
    fn on_event(&mut self, event: &Event) -> bool {
        if matches!(event, Event::Connected) {
            self.lost_since = None;
            return true;
        }
        false
    }

    /// Looks at the session; returns whether it has been down longer than the recovery timeout.
    fn expired(&mut self, session: &Session, queue: &str) -> bool {
        let connected = session.connection.connection.status().connected()
            && session.channel.status().connected()
            && session.publishing.connection.status().connected()
            && session.publisher.channel().status().connected();
        if connected {
            self.lost_since = None;
            return false;
        }
        let since = *self.lost_since.get_or_insert_with(|| {
            tracing::warn!(queue, "connection lost; waiting for recovery");
            Instant::now()
        });
        since.elapsed() > self.timeout
    }

    /// How often to look at the session.
    fn check_period(&self) -> Duration {
        (self.timeout / 4).clamp(Duration::from_millis(1), Duration::from_secs(1))
    }
}

/// What a consuming session watches while it waits: shutdown, and the connection's health.
struct Watch {
    shutdown: watch::Receiver<bool>,
    health: Health,
    check: tokio::time::Interval,
}

/// Sleeps until `at`; forever when there is nothing to wait for.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// `step`, given up on after `limit`.
async fn within<T>(
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

/// Why consuming stopped.
enum End {
    Shutdown,
    Failed(String),
}

pub(crate) struct Worker {
    pub(crate) binding: Arc<dyn Dispatch>,
    pub(crate) inbox: Inbox,
    pub(crate) settings: Arc<Settings>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) retries: Arc<RetryMemory>,
    pub(crate) in_flight: Arc<Semaphore>,
    /// This binding's batches in flight.
    pub(crate) batches: Arc<Semaphore>,
    pub(crate) retirees: Arc<Retirees>,
    pub(crate) shutdown: watch::Receiver<bool>,
    /// The queue's type, learnt by the first session and kept for every later one: an existing
    /// queue's is asked of the broker at start only.
    pub(crate) queue_kind: OnceLock<QueueKind>,
}

impl Worker {
    fn queue(&self) -> &str {
        self.binding.topology().queue()
    }

    /// Connects, declares the topology, sets the prefetch and starts consuming. Connections
    /// opened before a failure are closed. Each step is given up on after the open timeout: a
    /// broker that accepts the connection but never answers (a host gone behind a load balancer,
    /// a half-open connection after a restart) fails the attempt, and the next one is made.
    async fn open_session(&self) -> Result<Session> {
        let name = format!("{} {}", self.settings.connection_name, self.queue());
        // lapin's recovery is not waited for longer than the recovery timeout, nor watched
        // longer than the retire timeout after that.
        let bound = self.settings.recovery_timeout + self.settings.retire_timeout;
        let url = &self.settings.url;
        let limit = self.settings.open_timeout;
        // An abandoned connection is retired as its opening is dropped.
        let connection = within(limit, "connection.open", Link::open(url, &name, bound)).await?;
        let copies = format!("{name} copies");
        let publishing =
            match within(limit, "connection.open", Link::open(url, &copies, bound)).await {
                Ok(publishing) => publishing,
                Err(error) => {
                    self.discard(connection).await;
                    return Err(error);
                }
            };
        let channels = self.open_channels(&connection.connection, &publishing.connection, &name);
        let opened = within(limit, "opening the channels", channels).await;
        let (channel, publisher, consumer, kind) = match opened {
            Ok(opened) => opened,
            Err(error) => {
                self.discard(connection).await;
                self.discard(publishing).await;
                return Err(error);
            }
        };
        let events = Box::pin(connection.connection.events_listener());
        tracing::info!(queue = self.queue(), "consuming");
        Ok(Session {
            connection,
            channel,
            publishing,
            publisher,
            consumer,
            events,
            kind,
        })
    }

    /// Closes a connection of a session that failed to open, for good.
    async fn discard(&self, link: Link) {
        link.close("start failed").await;
        self.retirees.retire(link);
    }

    /// Opens the consuming channel (topology, queue type, prefetch, consumer) and the publishing
    /// one (confirms).
    async fn open_channels(
        &self,
        connection: &Connection,
        publishing: &Connection,
        name: &str,
    ) -> Result<(Channel, ConfirmChannel, lapin::Consumer, QueueKind)> {
        let channel = connection
            .create_channel()
            .await
            .map_err(Error::amqp("channel.open"))?;
        let topology = self.binding.topology();
        topology.declare(&channel).await?;
        let kind = match self.queue_kind.get() {
            Some(kind) => *kind,
            None => {
                let kind = topology.resolve_kind(&self.settings.url, name).await?;
                if kind == QueueKind::Quorum {
                    topology
                        .warn_of_copies_routed_by_queue_name(connection)
                        .await;
                }
                *self.queue_kind.get_or_init(|| kind)
            }
        };
        channel
            .basic_qos(self.settings.prefetch, BasicQosOptions::default())
            .await
            .map_err(Error::amqp("basic.qos"))?;
        let publisher = publishing
            .create_channel()
            .await
            .map_err(Error::amqp("channel.open"))?;
        publisher
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(Error::amqp("confirm.select"))?;
        let consumer = channel
            .basic_consume(
                self.queue().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(Error::amqp(format!("basic.consume {}", self.queue())))?;
        Ok((channel, ConfirmChannel::new(publisher), consumer, kind))
    }

    /// Opens the first session, so that a wrong URL or topology fails `start`.
    pub(crate) async fn start(self) -> Result<tokio::task::JoinHandle<ShutdownReport>> {
        let session = self.open_session().await?;
        Ok(tokio::spawn(self.run(session)))
    }

    async fn run(mut self, first: Session) -> ShutdownReport {
        let mut tasks = JoinSet::new();
        let mut session = Some(first);
        loop {
            let current = match session.take() {
                Some(current) => current,
                None => match self.reconnect().await {
                    Some(current) => {
                        self.stats.reconnections.fetch_add(1, Ordering::Relaxed);
                        current
                    }
                    None => return self.drain(None, &mut tasks).await,
                },
            };
            let mut current = current;
            match self.consume(&mut current, &mut tasks).await {
                End::Shutdown => return self.drain(Some(current), &mut tasks).await,
                End::Failed(why) => {
                    tracing::warn!(queue = self.queue(), %why, "session lost; reconnecting");
                    self.retirees.retire(current.connection);
                    self.retirees.retire(current.publishing);
                }
            }
        }
    }

    /// Reopens a session with a growing delay, until it works or shutdown is asked for.
    async fn reconnect(&mut self) -> Option<Session> {
        let mut delays =
            Backoff::new(self.settings.reconnect_delay, Duration::from_secs(30)).delays();
        let mut shutdown = self.shutdown.clone();
        loop {
            let delay = delays.next().unwrap_or(Duration::from_secs(30));
            tokio::select! {
                _ = shutdown.wait_for(|stop| *stop) => return None,
                opened = self.open_session() => match opened {
                    Ok(session) => return Some(session),
                    Err(error) => {
                        self.stats.failed_reconnections.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(queue = self.queue(), %error, "reconnect failed");
                    }
                },
            }
            tokio::select! {
                _ = shutdown.wait_for(|stop| *stop) => return None,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// Takes deliveries until shutdown or until the session fails and is not recovered within
    /// the recovery timeout: lapin's automatic recovery is relied on, but a recovery that waits
    /// forever is not waited for. A batching binding gathers deliveries into batches.
    async fn consume(&mut self, session: &mut Session, tasks: &mut JoinSet<()>) -> End {
        let mut consumer = session.consumer.clone();
        let health = Health::new(self.settings.recovery_timeout);
        let mut watch = Watch {
            shutdown: self.shutdown.clone(),
            check: tokio::time::interval(health.check_period()),
            health,
        };
        let batching = self.binding.batching();
        let unsettled = Arc::new(Unsettled::default());
        let mut batch: Vec<Delivery> = Vec::new();
        let mut epoch = 0;
        let mut flush_at: Option<Instant> = None;
        loop {
            while tasks.try_join_next().is_some() {}
            let step = tokio::select! {
                biased;
                _ = watch.shutdown.wait_for(|stop| *stop) => return End::Shutdown,
                Some(event) = session.events.next() => {
                    self.note(&mut watch.health, &event);
                    continue;
                }
                _ = watch.check.tick() => {
                    if watch.health.expired(session, self.queue()) {
                        return End::Failed("the connection was not recovered in time".into());
                    }
                    continue;
                }
                () = sleep_until(flush_at), if flush_at.is_some() => None,
                next = consumer.next() => Some(next),
            };
            let delivery = match step {
                // The batch waited long enough for more deliveries.
                None => {
                    flush_at = None;
                    let deliveries = std::mem::take(&mut batch);
                    let gathered = (&unsettled, epoch, deliveries);
                    if let Err(end) = self.spawn_batch(session, &mut watch, tasks, gathered).await {
                        return end;
                    }
                    continue;
                }
                Some(Some(Ok(delivery))) => delivery,
                Some(Some(Err(error))) => {
                    let queue = self.queue();
                    tracing::warn!(queue, %error, "consumer error; waiting for recovery");
                    let recovery = tokio::time::timeout(
                        self.settings.recovery_timeout,
                        session.channel.wait_for_recovery(error),
                    )
                    .await;
                    match recovery {
                        Ok(Ok(())) => {
                            self.note(&mut watch.health, &Event::Connected);
                            continue;
                        }
                        Ok(Err(error)) => return End::Failed(error.to_string()),
                        Err(_) => return End::Failed("recovery did not complete in time".into()),
                    }
                }
                Some(None) => return End::Failed("the broker cancelled the consumer".into()),
            };
            let Some(batching) = batching else {
                // Room among the handlers in flight is taken once a delivery is in hand, so that
                // an idle binding holds none of it; the prefetch bounds what waits.
                match self.permit(session, &mut watch, &self.in_flight).await {
                    Ok(permit) => tasks.spawn(self.job(session, delivery, permit).run()),
                    Err(end) => return end,
                };
                continue;
            };
            let received = unsettled.received(delivery.delivery_tag);
            if received != epoch {
                // The channel was recovered: the deliveries gathered before went back to the
                // queue with it, and can no longer be settled.
                epoch = received;
                batch.clear();
            }
            batch.push(delivery);
            if batch.len() < batching.size {
                flush_at.get_or_insert_with(|| Instant::now() + batching.max_wait);
                continue;
            }
            flush_at = None;
            let deliveries = std::mem::take(&mut batch);
            let gathered = (&unsettled, epoch, deliveries);
            if let Err(end) = self.spawn_batch(session, &mut watch, tasks, gathered).await {
                return end;
            }
        }
    }

    /// Waits for room among the handlers in flight, then processes a gathered batch (its
    /// channel's unsettled tags, its epoch, its deliveries) in a task of its own.
    async fn spawn_batch(
        &self,
        session: &mut Session,
        watch: &mut Watch,
        tasks: &mut JoinSet<()>,
        (unsettled, epoch, deliveries): (&Arc<Unsettled>, u64, Vec<Delivery>),
    ) -> std::result::Result<(), End> {
        let batch = self.permit(session, watch, &self.batches).await?;
        let handler = self.permit(session, watch, &self.in_flight).await?;
        let job = self.batch_job(session, unsettled, epoch, deliveries, [handler, batch]);
        tasks.spawn(job.run());
        Ok(())
    }

    /// Waits for room among `slots` (the handlers or the batches in flight), watching the
    /// session meanwhile.
    async fn permit(
        &self,
        session: &mut Session,
        watch: &mut Watch,
        slots: &Arc<Semaphore>,
    ) -> std::result::Result<OwnedSemaphorePermit, End> {
        loop {
            tokio::select! {
                biased;
                _ = watch.shutdown.wait_for(|stop| *stop) => return Err(End::Shutdown),
                Some(event) = session.events.next() => {
                    self.note(&mut watch.health, &event);
                }
                _ = watch.check.tick() => {
                    if watch.health.expired(session, self.queue()) {
                        return Err(End::Failed("the connection was not recovered in time".into()));
                    }
                }
                permit = Arc::clone(slots).acquire_owned() => match permit {
                    Ok(permit) => return Ok(permit),
                    Err(_) => return Err(End::Shutdown),
                },
            }
        }
    }

    /// Notes a connection event, counting a completed recovery.
    fn note(&self, health: &mut Health, event: &Event) {
        if health.on_event(event) {
            tracing::info!(queue = self.queue(), "connection recovered");
            self.stats.recoveries.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// What this session's jobs need to settle their deliveries.
    fn settling(&self, session: &Session) -> Settling {
        Settling {
            binding: Arc::clone(&self.binding),
            inbox: self.inbox.clone(),
            settings: Arc::clone(&self.settings),
            stats: Arc::clone(&self.stats),
            retries: Arc::clone(&self.retries),
            publisher: session.publisher.clone(),
            quorum: session.kind == QueueKind::Quorum,
            shutdown: self.shutdown.clone(),
        }
    }

    fn batch_job(
        &self,
        session: &Session,
        unsettled: &Arc<Unsettled>,
        epoch: u64,
        deliveries: Vec<Delivery>,
        permit: [OwnedSemaphorePermit; 2],
    ) -> BatchJob {
        BatchJob {
            settling: self.settling(session),
            unsettled: Arc::clone(unsettled),
            epoch,
            deliveries,
            permit,
        }
    }

    fn job(&self, session: &Session, delivery: Delivery, permit: OwnedSemaphorePermit) -> Job {
        Job {
            settling: self.settling(session),
            delivery,
            permit,
        }
    }

    /// Stops taking deliveries, lets in-flight handlers finish within the deadline, then closes
    /// the channels: deliveries prefetched but not started go back to the queue.
    async fn drain(&self, session: Option<Session>, tasks: &mut JoinSet<()>) -> ShutdownReport {
        if let Some(session) = &session {
            let tag = session.consumer.tag();
            let cancel = session
                .channel
                .basic_cancel(tag, BasicCancelOptions::default());
            match tokio::time::timeout(Duration::from_secs(5), cancel).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::warn!(queue = self.queue(), %error, "basic.cancel failed")
                }
                Err(_) => tracing::warn!(queue = self.queue(), "basic.cancel timed out"),
            }
        }
        // Handlers that finished before the shutdown are not part of the report.
        while tasks.try_join_next().is_some() {}
        let mut report = ShutdownReport::default();
        let deadline = tokio::time::sleep(self.settings.shutdown_timeout);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => break,
                next = tasks.join_next() => match next {
                    Some(_) => report.completed += 1,
                    None => break,
                },
            }
        }
        report.abandoned = tasks.len();
        if report.abandoned > 0 {
            tracing::warn!(
                queue = self.queue(),
                abandoned = report.abandoned,
                "handlers still running at the shutdown deadline are stopped; their messages will be redelivered"
            );
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
        }
        if let Some(session) = session {
            close(&session).await;
            self.retirees.retire(session.connection);
            self.retirees.retire(session.publishing);
        }
        // No connection of this worker may come back once the consumer has stopped.
        let grace = self.settings.retire_timeout.min(Duration::from_secs(10));
        self.retirees.settle(grace).await;
        tracing::info!(
            queue = self.queue(),
            completed = report.completed,
            "consumer stopped"
        );
        report
    }
}

/// Closes a session, best effort and bounded: a broken connection is not waited for.
async fn close(session: &Session) {
    let channels = async {
        let _ = session.channel.close(200, "shutdown".into()).await;
        let _ = session
            .publisher
            .channel()
            .close(200, "shutdown".into())
            .await;
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), channels).await;
    session.connection.close("shutdown").await;
    session.publishing.close("shutdown").await;
}

/// What settling the deliveries of one session needs, shared by its jobs.
pub(crate) struct Settling {
    pub(crate) binding: Arc<dyn Dispatch>,
    pub(crate) inbox: Inbox,
    pub(crate) settings: Arc<Settings>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) retries: Arc<RetryMemory>,
    pub(crate) publisher: ConfirmChannel,
    pub(crate) quorum: bool,
    pub(crate) shutdown: watch::Receiver<bool>,
}

impl Settling {
    /// The settler of this session's deliveries.
    pub(crate) fn settler(&self) -> Settler<'_> {
        let topology = self.binding.topology();
        let mut retry = self.settings.retry;
        // A quorum queue's broker dead-letters a message returned more often than its limit,
        // without a reason (and a fresh copy by the queue's name): the consumer does it first.
        if let (true, Some(limit)) = (self.quorum, topology.broker_delivery_limit()) {
            retry.max_deliveries = retry.max_deliveries.min(limit.saturating_add(1));
        }
        Settler {
            queue: topology.queue(),
            consumer: self.binding.consumer(),
            dead_letter_exchange: topology.dead_letter_exchange(),
            dead_letter_routing_key: topology.dead_letter_key(),
            publisher: &self.publisher,
            retry,
            retries: &self.retries,
            quorum: self.quorum,
            shutdown: &self.shutdown,
        }
    }

    /// Counts a settled delivery in the consumer's stats and metrics.
    pub(crate) fn count(&self, settled: Settled) {
        self.stats.count(settled);
        metrics::counter!(
            crate::DELIVERIES_TOTAL,
            "queue" => self.binding.topology().queue().to_owned(),
            "settle" => settled.label()
        )
        .increment(1);
    }
}

/// One delivery's processing and settlement, run in its own task.
struct Job {
    settling: Settling,
    delivery: Delivery,
    permit: OwnedSemaphorePermit,
}

impl Job {
    async fn run(self) {
        let Job {
            settling,
            delivery,
            permit,
        } = self;
        let binding = &settling.binding;
        let topology = binding.topology();
        let metadata = metadata_of(&delivery.properties, delivery.redelivered);
        let span = tracing::info_span!(
            "idem.delivery",
            queue = topology.queue(),
            delivery_tag = delivery.delivery_tag,
            redelivered = delivery.redelivered,
            message_id = metadata.message_id.as_deref(),
            correlation_id = metadata.correlation_id.as_deref(),
            key = Empty,
            settle = Empty,
        );
        async {
            // A panic outside the handler (a key expression, a codec, an output's `Serialize`)
            // must still settle the delivery, or it would hold its place until the channel
            // closes.
            let handled = AssertUnwindSafe(binding.handle(&settling.inbox, &delivery, metadata))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| Handled::panicked(panic.as_ref()));
            if let Some(key) = &handled.key {
                tracing::Span::current().record("key", key.as_str());
            }
            let settled = settling
                .settler()
                .settle(
                    &delivery,
                    handled.verdict,
                    handled.key.as_deref(),
                    Some(permit),
                )
                .await;
            tracing::Span::current().record("settle", settled.label());
            settling.count(settled);
        }
        .instrument(span)
        .await;
    }
}

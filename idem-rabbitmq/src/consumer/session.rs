//! A binding's session: a connection with its consuming channel, and a second connection for
//! the copies the consumer publishes; opened within a time limit, closed or retired for good.

use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures_util::Stream;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, Event};
use tokio::task::AbortHandle;

use super::settings::ConsumerSettings;
use crate::confirm::{ConfirmChannel, confirm_channel};
use crate::connect::{Link, Retirees};
use crate::error::{Error, Result};
use crate::opening::within;
use crate::queue_kind::QueueKind;
use crate::topology::QueueTopology;

/// An open connection with its consuming channel, and a second connection for the copies the
/// consumer publishes: a broker short of memory or disk blocks connections that publish, and the
/// consuming one must go on acknowledging.
pub(super) struct ConsumerSession {
    connection: Link,
    channel: Channel,
    publishing: Link,
    /// The channel, in confirm mode, that publishes the copies.
    pub(super) publisher: ConfirmChannel,
    /// The queue's consumer on the consuming channel: its deliveries.
    pub(super) consumer: lapin::Consumer,
    /// The consuming connection's events, from the moment it opened.
    pub(super) events: Pin<Box<dyn Stream<Item = Event> + Send + Sync>>,
    /// The queue's type, as declared or as the broker told.
    pub(super) kind: QueueKind,
    /// The probe of the consuming connection's progress.
    probe: Probe,
}

/// What a look at a session finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SessionState {
    /// Its connections and channels are up, and the consuming connection answers.
    Up,
    /// A connection or a channel is down (lapin may be recovering it), or its runtime did not
    /// tell in time.
    Down,
    /// Up as lapin tells it, but the consuming connection answered no probe lately.
    Silent,
}

/// A second, the longest a look at a connection's status takes: a probe waits for an answer
/// that long beyond its two periods.
const LOOK_LIMIT: Duration = Duration::from_secs(1);

impl ConsumerSession {
    /// Whether both connections and both channels are up, and the consuming connection answered
    /// a probe lately. Each connection is looked at on its own runtime: a lapin lock held for
    /// good there (lapin 4.12's recovery deadlock) makes the session look down, and never blocks
    /// the caller's thread.
    pub(super) async fn state(&self) -> SessionState {
        let consuming = self.connection.up(&self.channel);
        let copies = self.publishing.up(self.publisher.channel());
        match tokio::join!(consuming, copies) {
            (true, true) if self.probe.answered_lately() => SessionState::Up,
            (true, true) => SessionState::Silent,
            _ => SessionState::Down,
        }
    }

    /// Waits for lapin to recover the consuming channel after `error`.
    pub(super) async fn wait_for_recovery(&self, error: lapin::Error) -> lapin::Result<()> {
        self.channel.wait_for_recovery(error).await
    }

    /// Tells the broker to send `queue`'s consumer no more deliveries, waiting 5 s at most.
    pub(super) async fn cancel_consuming(&self, queue: &str) {
        let tag = self.consumer.tag();
        let cancel = self
            .channel
            .basic_cancel(tag, BasicCancelOptions::default());
        match tokio::time::timeout(Duration::from_secs(5), cancel).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(queue, %error, "basic.cancel failed"),
            Err(_) => tracing::warn!(queue, "basic.cancel timed out"),
        }
    }

    /// Gives the session up without closing it: its connections are refused any reconnection,
    /// and closed if they come back.
    pub(super) fn retire(self, retirees: &Retirees) {
        retirees.retire(self.connection);
        retirees.retire(self.publishing);
    }

    /// Closes the session for good, best effort and bounded (a broken connection is not waited
    /// for): its channels, then its connections, which are retired.
    pub(super) async fn close(self, retirees: &Retirees) {
        let channels = async {
            let _ = self.channel.close(200, "shutdown".into()).await;
            let _ = self.publisher.channel().close(200, "shutdown".into()).await;
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), channels).await;
        self.connection.close("shutdown").await;
        self.publishing.close("shutdown").await;
        self.retire(retirees);
    }
}

/// Opens the sessions of one binding.
pub(super) struct SessionOpener<'a> {
    pub(super) settings: &'a ConsumerSettings,
    pub(super) topology: &'a QueueTopology,
    /// The queue's type, learnt by the first session and kept for every later one: an existing
    /// queue's is asked of the broker at start only.
    pub(super) queue_kind: &'a OnceLock<QueueKind>,
    /// The broker's major version, learnt by the first session that declares a topology.
    pub(super) broker_major: &'a OnceLock<Option<u32>>,
    /// Where the connections of a session that failed to open are retired.
    pub(super) retirees: &'a Retirees,
}

impl SessionOpener<'_> {
    /// Connects, declares the topology, sets the prefetch and starts consuming. Connections
    /// opened before a failure are closed. Each step is given up on after the open timeout: a
    /// broker that accepts the connection but never answers (a host gone behind a load balancer,
    /// a half-open connection after a restart) fails the attempt, and the next one is made.
    pub(super) async fn open(&self) -> Result<ConsumerSession> {
        let queue = self.topology.queue();
        let name = format!("{} {queue}", self.settings.connection_name);
        // lapin's recovery is not waited for longer than the recovery timeout, nor watched
        // longer than the retire timeout after that.
        let bound = self.settings.recovery_timeout + self.settings.retire_timeout;
        let url = &self.settings.url;
        let limit = self.settings.open_timeout;
        // An abandoned connection is retired as its opening is dropped.
        let connection = Link::open(url, &name, bound, limit).await?;
        let copies = format!("{name} copies");
        let publishing = match Link::open(url, &copies, bound, limit).await {
            Ok(publishing) => publishing,
            Err(error) => {
                self.discard(connection).await;
                return Err(error);
            }
        };
        let broker_major = self.broker_major().await;
        let channels = self.open_channels(
            &connection.connection,
            &publishing.connection,
            &name,
            broker_major,
        );
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
        let probe = Probe::start(&connection, &channel, self.settings);
        tracing::info!(queue, "consuming");
        Ok(ConsumerSession {
            connection,
            channel,
            publishing,
            publisher,
            consumer,
            events,
            kind,
            probe,
        })
    }

    /// The broker's major version, asked once (by the first session that opens), and only of a
    /// broker where the topology declares a quorum dead-letter queue, whose arguments differ
    /// between RabbitMQ 3 and 4: `None` when no node told it within the open timeout.
    async fn broker_major(&self) -> Option<u32> {
        if let Some(major) = self.broker_major.get() {
            return *major;
        }
        let major = if self.topology.declares_quorum_dead_letters() {
            let limit = self.settings.open_timeout;
            crate::broker::major_version(&self.settings.url, limit).await
        } else {
            None
        };
        *self.broker_major.get_or_init(|| major)
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
        broker_major: Option<u32>,
    ) -> Result<(Channel, ConfirmChannel, lapin::Consumer, QueueKind)> {
        let channel = connection
            .create_channel()
            .await
            .map_err(Error::amqp("channel.open"))?;
        let topology = self.topology;
        topology
            .declare_for(connection, &channel, broker_major)
            .await?;
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
        let publisher = confirm_channel(publishing).await?;
        let queue = topology.queue();
        let consumer = channel
            .basic_consume(
                queue.into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(Error::amqp(format!("basic.consume {queue}")))?;
        Ok((channel, ConfirmChannel::new(publisher), consumer, kind))
    }
}

/// A round trip on the consuming channel every so often (`basic.qos` with the prefetch it
/// already has), on the connection's runtime: a connection whose frames stopped (a link that
/// went silent without closing, a lapin thread blocked for good) answers none, and the session
/// is then down, replaced after the recovery timeout as any session that stays down.
struct Probe {
    task: AbortHandle,
    answered: Arc<Mutex<Instant>>,
    /// How long without an answer the connection still counts as up.
    patience: Duration,
}

impl Probe {
    fn start(link: &Link, channel: &Channel, settings: &ConsumerSettings) -> Self {
        let every =
            (settings.recovery_timeout / 4).clamp(Duration::from_millis(100), MAX_PROBE_EVERY);
        let answered = Arc::new(Mutex::new(Instant::now()));
        let (channel, prefetch, noted) =
            (channel.clone(), settings.prefetch, Arc::clone(&answered));
        let task = link.runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let qos = channel.basic_qos(prefetch, BasicQosOptions::default());
                if qos.await.is_ok() {
                    *noted.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
                }
            }
        });
        Self {
            task,
            answered,
            patience: (every * 2 + LOOK_LIMIT).max(MIN_PATIENCE),
        }
    }

    /// Whether the connection answered a probe within the probe's patience.
    fn answered_lately(&self) -> bool {
        let answered = *self.answered.lock().unwrap_or_else(|e| e.into_inner());
        answered.elapsed() <= self.patience
    }
}

/// The longest a consuming connection goes between probes.
const MAX_PROBE_EVERY: Duration = Duration::from_secs(10);

/// The least time without an answer before a connection counts as silent: a short recovery
/// timeout must not make a busy machine's late probe replace a working session.
const MIN_PATIENCE: Duration = Duration::from_secs(5);

impl Drop for Probe {
    fn drop(&mut self) {
        self.task.abort();
    }
}

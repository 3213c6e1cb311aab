//! One binding's worker: consumes from a session, reopened when it fails; hands deliveries to
//! jobs within the in-flight bounds; drains gracefully at shutdown.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::StreamExt;
use idem_runtime::transport::{Backoff, RetryMemory};
use idem_runtime::{Inbox, retention::CleanupReport};
use lapin::Event;
use lapin::message::Delivery;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use super::batch::BatchJob;
use super::binding::Dispatch;
use super::gather::{Gathered, Gathering};
use super::interrupt::{Interruption, SessionWatch};
use super::job::{DeliveryJob, JobContext};
use super::session::{ConsumerSession, SessionOpener};
use super::settings::ConsumerSettings;
use super::stats::{ConsumerCounters, gauge_connected};
use crate::connect::Retirees;
use crate::error::Result;
use crate::opening::patiently;
use crate::queue_kind::QueueKind;
use crate::stop::StopSignal;

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
    /// Adds what another worker did.
    pub(crate) fn add(&mut self, other: ShutdownReport) {
        self.completed += other.completed;
        self.abandoned += other.abandoned;
    }
}

/// What the consumer's stream gave next, or that a batch waited long enough.
#[allow(clippy::large_enum_variant)] // one at a time, moved out at once: a box would allocate per delivery
enum Next {
    /// The batch being gathered waited long enough for more deliveries.
    Flush,
    /// A delivery.
    Delivery(Delivery),
    /// The stream failed; lapin may be recovering the channel.
    Failed(lapin::Error),
    /// The broker cancelled the consumer.
    Cancelled,
}

/// The next delivery of `consumer`, or the moment the batch being gathered goes as it is
/// (`flush_at`), whichever comes first.
async fn next_delivery(consumer: &mut lapin::Consumer, flush_at: Option<Instant>) -> Next {
    tokio::select! {
        biased;
        () = sleep_until(flush_at), if flush_at.is_some() => Next::Flush,
        next = consumer.next() => match next {
            Some(Ok(delivery)) => Next::Delivery(delivery),
            Some(Err(error)) => Next::Failed(error),
            None => Next::Cancelled,
        },
    }
}

/// Sleeps until `at`; forever when there is nothing to wait for.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Consumes one binding's queue, from start to shutdown.
pub(crate) struct Worker {
    pub(crate) binding: Arc<dyn Dispatch>,
    pub(crate) inbox: Inbox,
    pub(crate) settings: Arc<ConsumerSettings>,
    pub(crate) counters: Arc<ConsumerCounters>,
    pub(crate) retries: Arc<RetryMemory>,
    /// The consumer's handlers in flight, across bindings.
    pub(crate) in_flight: Arc<Semaphore>,
    /// This binding's batches in flight.
    pub(crate) batches: Arc<Semaphore>,
    pub(crate) retirees: Arc<Retirees>,
    pub(crate) stop: StopSignal,
    /// The queue's type, learnt by the first session and kept for every later one.
    pub(crate) queue_kind: OnceLock<QueueKind>,
    /// The broker's major version, learnt by the first session that declares the topology.
    pub(crate) broker_major: OnceLock<Option<u32>>,
}

impl Worker {
    /// The queue this worker consumes.
    fn queue(&self) -> &str {
        self.binding.topology().queue()
    }

    /// What opens this binding's sessions.
    fn opener(&self) -> SessionOpener<'_> {
        SessionOpener {
            settings: &self.settings,
            topology: self.binding.topology(),
            queue_kind: &self.queue_kind,
            broker_major: &self.broker_major,
            retirees: &self.retirees,
        }
    }

    /// Opens the first session, so that a wrong URL or topology fails `start`; what the
    /// broker's state refuses is tried again for a while ([`patiently`]).
    pub(crate) async fn start(self) -> Result<JoinHandle<ShutdownReport>> {
        let what = format!("consumer of {}", self.queue());
        let first_delay = self.settings.reconnect_delay;
        let open = || async { self.opener().open().await };
        let session = patiently(&what, first_delay, open).await?;
        gauge_connected(self.queue(), true);
        Ok(tokio::spawn(self.run(session)))
    }

    /// Consumes from `first`, then from each session that replaces a lost one, until shutdown.
    async fn run(self, first: ConsumerSession) -> ShutdownReport {
        let mut tasks = JoinSet::new();
        let mut session = first;
        loop {
            let interruption = self.consume(&mut session, &mut tasks).await;
            gauge_connected(self.queue(), false);
            match interruption {
                Interruption::Shutdown => return self.drain(Some(session), &mut tasks).await,
                Interruption::SessionLost(why) => {
                    tracing::warn!(queue = self.queue(), %why, "session lost; reconnecting");
                    session.retire(&self.retirees);
                }
            }
            session = match self.reconnect().await {
                Some(reopened) => {
                    self.counters.reconnections.fetch_add(1, Ordering::Relaxed);
                    gauge_connected(self.queue(), true);
                    reopened
                }
                None => return self.drain(None, &mut tasks).await,
            };
        }
    }

    /// Reopens a session with a growing delay, until it works or shutdown is asked for.
    async fn reconnect(&self) -> Option<ConsumerSession> {
        let mut delays =
            Backoff::new(self.settings.reconnect_delay, Duration::from_secs(30)).delays();
        loop {
            let delay = delays.next().unwrap_or(Duration::from_secs(30));
            match self.stop.unless_stopped(self.opener().open()).await? {
                Ok(session) => return Some(session),
                Err(error) => {
                    (self.counters.failed_reconnections).fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        queue = self.queue(),
                        %error,
                        retry_in = ?delay,
                        "reconnect failed; trying again"
                    );
                }
            }
            if !self.stop.sleep(delay).await {
                return None;
            }
        }
    }

    /// Takes deliveries until shutdown or until the session fails and is not recovered within
    /// the recovery timeout: lapin's automatic recovery is relied on, but a recovery that waits
    /// forever is not waited for. A batching binding gathers deliveries into batches.
    async fn consume(
        &self,
        session: &mut ConsumerSession,
        tasks: &mut JoinSet<()>,
    ) -> Interruption {
        let mut consumer = session.consumer.clone();
        let recovery_timeout = self.settings.recovery_timeout;
        let mut watch =
            SessionWatch::new(&self.stop, recovery_timeout, self.queue(), &self.counters);
        let mut gathering = self.binding.batching().map(Gathering::new);
        loop {
            while tasks.try_join_next().is_some() {}
            let flush_at = gathering.as_ref().and_then(Gathering::flush_at);
            let next = next_delivery(&mut consumer, flush_at);
            let handled = match watch.unless_interrupted(session, next).await {
                Err(interruption) => Err(interruption),
                Ok(Next::Flush) => match gathering.as_mut() {
                    Some(gathering) => {
                        let batch = gathering.take();
                        self.spawn_batch(session, &mut watch, tasks, batch).await
                    }
                    None => Ok(()),
                },
                Ok(Next::Delivery(delivery)) => {
                    let gathering = gathering.as_mut();
                    self.hand_over(session, &mut watch, tasks, gathering, delivery)
                        .await
                }
                Ok(Next::Failed(error)) => self.recover(session, &mut watch, error).await,
                Ok(Next::Cancelled) => Err(Interruption::SessionLost(
                    "the broker cancelled the consumer".into(),
                )),
            };
            if let Err(interruption) = handled {
                return interruption;
            }
        }
    }

    /// Hands `delivery` to a job of its own, or to the batch being `gathering`, which goes to a
    /// job once it is full.
    async fn hand_over(
        &self,
        session: &mut ConsumerSession,
        watch: &mut SessionWatch<'_>,
        tasks: &mut JoinSet<()>,
        gathering: Option<&mut Gathering>,
        delivery: Delivery,
    ) -> Result<(), Interruption> {
        let Some(gathering) = gathering else {
            // Room among the handlers in flight is taken once a delivery is in hand, so that
            // an idle binding holds none of it; the prefetch bounds what waits.
            let permit = self.permit(session, watch, &self.in_flight).await?;
            let context = self.job_context(session);
            let job = DeliveryJob {
                context,
                delivery,
                permit,
            };
            tasks.spawn(job.run());
            return Ok(());
        };
        match gathering.add(delivery) {
            Some(batch) => self.spawn_batch(session, watch, tasks, batch).await,
            None => Ok(()),
        }
    }

    /// Waits, at most the recovery timeout, for lapin to recover the consuming channel after
    /// the consumer's stream failed with `error`.
    async fn recover(
        &self,
        session: &ConsumerSession,
        watch: &mut SessionWatch<'_>,
        error: lapin::Error,
    ) -> Result<(), Interruption> {
        let queue = self.queue();
        tracing::warn!(queue, %error, "consumer error; waiting for recovery");
        gauge_connected(queue, false);
        let recovery = tokio::time::timeout(
            self.settings.recovery_timeout,
            session.wait_for_recovery(error),
        )
        .await;
        match recovery {
            Ok(Ok(())) => {
                watch.note(&Event::Connected);
                Ok(())
            }
            Ok(Err(error)) => Err(Interruption::SessionLost(error.to_string())),
            Err(_) => Err(Interruption::SessionLost(
                "recovery did not complete in time".into(),
            )),
        }
    }

    /// Waits for room among the batches and the handlers in flight, then processes a gathered
    /// batch in a task of its own.
    async fn spawn_batch(
        &self,
        session: &mut ConsumerSession,
        watch: &mut SessionWatch<'_>,
        tasks: &mut JoinSet<()>,
        batch: Gathered,
    ) -> Result<(), Interruption> {
        let batch_slot = self.permit(session, watch, &self.batches).await?;
        let handler_slot = self.permit(session, watch, &self.in_flight).await?;
        let job = BatchJob {
            context: self.job_context(session),
            batch,
            permit: [handler_slot, batch_slot],
        };
        tasks.spawn(job.run());
        Ok(())
    }

    /// Waits for room among `slots` (the handlers or the batches in flight), unless consuming
    /// is interrupted first.
    async fn permit(
        &self,
        session: &mut ConsumerSession,
        watch: &mut SessionWatch<'_>,
        slots: &Arc<Semaphore>,
    ) -> Result<OwnedSemaphorePermit, Interruption> {
        let acquire = Arc::clone(slots).acquire_owned();
        let acquired = watch.unless_interrupted(session, acquire).await?;
        // Only a consumer going away closes its slots.
        acquired.map_err(|_closed| Interruption::Shutdown)
    }

    /// What this session's jobs need to process and settle their deliveries.
    fn job_context(&self, session: &ConsumerSession) -> JobContext {
        JobContext {
            binding: Arc::clone(&self.binding),
            inbox: self.inbox.clone(),
            settings: Arc::clone(&self.settings),
            counters: Arc::clone(&self.counters),
            retries: Arc::clone(&self.retries),
            publisher: session.publisher.clone(),
            quorum: session.kind == QueueKind::Quorum,
            stop: self.stop.clone(),
        }
    }

    /// Stops taking deliveries, lets in-flight handlers finish within the deadline, then closes
    /// the channels: deliveries prefetched but not started go back to the queue.
    async fn drain(
        &self,
        session: Option<ConsumerSession>,
        tasks: &mut JoinSet<()>,
    ) -> ShutdownReport {
        if let Some(session) = &session {
            session.cancel_consuming(self.queue()).await;
        }
        // Handlers that finished before the shutdown are not part of the report.
        while tasks.try_join_next().is_some() {}
        let mut report = ShutdownReport::default();
        let finishing = async {
            while tasks.join_next().await.is_some() {
                report.completed += 1;
            }
        };
        let _ = tokio::time::timeout(self.settings.shutdown_timeout, finishing).await;
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
            session.close(&self.retirees).await;
        }
        // No connection of this worker may come back once the consumer has stopped.
        let grace = self.settings.retire_timeout.min(Duration::from_secs(10));
        self.retirees.wait_until_gone(grace).await;
        tracing::info!(
            queue = self.queue(),
            completed = report.completed,
            "consumer stopped"
        );
        report
    }
}

//! What interrupts consuming: a shutdown, or a session down longer than the recovery timeout;
//! and the one wait that watches for both while a worker waits for anything else.

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::Event;
use tokio::time::{Instant, Interval};

use super::session::{ConsumerSession, SessionState};
use super::stats::{ConsumerCounters, gauge_connected};
use crate::stop::StopSignal;

/// Why consuming stopped.
pub(super) enum Interruption {
    /// The consumer is shutting down.
    Shutdown,
    /// The session failed, for the reason given, and is to be replaced.
    SessionLost(String),
}

/// Watches a session that lapin may be recovering, so that a recovery that never completes is
/// not waited for forever.
struct Health {
    lost_since: Option<Instant>,
    timeout: Duration,
}

impl Health {
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
    async fn expired(&mut self, session: &ConsumerSession, queue: &str) -> bool {
        let state = session.state().await;
        if state == SessionState::Up {
            self.lost_since = None;
            return false;
        }
        let since = *self.lost_since.get_or_insert_with(|| {
            match state {
                SessionState::Silent => tracing::warn!(
                    queue,
                    "the connection stopped answering; waiting for it to answer again"
                ),
                _ => tracing::warn!(queue, "connection lost; waiting for recovery"),
            }
            gauge_connected(queue, false);
            Instant::now()
        });
        since.elapsed() > self.timeout
    }

    /// How often to look at the session.
    fn check_period(&self) -> Duration {
        (self.timeout / 4).clamp(Duration::from_millis(1), Duration::from_secs(1))
    }
}

/// What a worker watches while it waits, for as long as it consumes from one session: the
/// consumer's stop signal, and the session's health.
pub(super) struct SessionWatch<'a> {
    stop: &'a StopSignal,
    health: Health,
    check: Interval,
    queue: &'a str,
    counters: &'a ConsumerCounters,
}

impl<'a> SessionWatch<'a> {
    /// Starts watching a session of `queue`, which may be down at most `recovery_timeout`;
    /// completed recoveries are counted in `counters`.
    pub(super) fn new(
        stop: &'a StopSignal,
        recovery_timeout: Duration,
        queue: &'a str,
        counters: &'a ConsumerCounters,
    ) -> Self {
        let health = Health {
            lost_since: None,
            timeout: recovery_timeout,
        };
        Self {
            stop,
            check: tokio::time::interval(health.check_period()),
            health,
            queue,
            counters,
        }
    }

    /// Runs `work` to its end, unless consuming is interrupted first: the consumer is shutting
    /// down, or `session` has been down longer than the recovery timeout; `work` is dropped
    /// then. Meanwhile notes the connection's events. A shutdown is looked at first, `work`
    /// last.
    pub(super) async fn unless_interrupted<F: Future>(
        &mut self,
        session: &mut ConsumerSession,
        work: F,
    ) -> Result<F::Output, Interruption> {
        tokio::pin!(work);
        loop {
            tokio::select! {
                biased;
                () = self.stop.wait() => return Err(Interruption::Shutdown),
                Some(event) = session.events.next() => self.note(&event),
                _ = self.check.tick() => {
                    if self.health.expired(session, self.queue).await {
                        let why = "the connection was not recovered, or did not answer, in time";
                        return Err(Interruption::SessionLost(why.into()));
                    }
                }
                output = &mut work => return Ok(output),
            }
        }
    }

    /// Notes a connection event, counting a completed recovery.
    pub(super) fn note(&mut self, event: &Event) {
        if self.health.on_event(event) {
            tracing::info!(queue = self.queue, "connection recovered");
            gauge_connected(self.queue, true);
            (self.counters.recoveries).fetch_add(1, Ordering::Relaxed);
        }
    }
}

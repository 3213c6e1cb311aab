//! The relay's loop: wait for work, take a batch, publish it with confirms (pipelined, each run
//! in order), mark what was confirmed sent; back off after a failure.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::sea_orm::DbErr;
use idem_runtime::{LocalRelay, Outbox, PendingBatch};
use tokio::sync::{Notify, watch};

use super::Settings;
use super::held::{Held, Hold, Refused};
use super::pipeline;
use super::session::Session;
use super::stats::Stats;
use crate::confirm::NotTaken;
use crate::connect::Retirees;
use crate::{OUTBOX_PENDING_AGE_SECONDS, OUTBOX_PUBLISH_FAILURES_TOTAL, OUTBOX_PUBLISHED_TOTAL};

/// What a round did.
enum Round {
    /// It published messages: there may be more.
    Worked,
    /// It found nothing to publish.
    Idle,
    /// The relay was asked to stop before it took a batch.
    Stopped,
    /// The broker closed the channel over one of its publishes: the next rounds look for the
    /// message that did it.
    Closed,
}

/// Why a round failed.
enum Problem {
    /// No connection to the broker.
    Connect(crate::Error),
    /// The database failed taking the batch or marking it sent.
    Database(DbErr),
    /// A publish failed the channel; the rest of its batch waits.
    Publish { message_id: String, why: NotTaken },
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::Connect(error) => write!(f, "{error}"),
            Problem::Database(error) => write!(f, "the outbox database failed: {error}"),
            Problem::Publish { message_id, why } => {
                write!(f, "message {message_id} was not published: {why}")
            }
        }
    }
}

pub(super) struct Runner {
    outbox: Outbox,
    settings: Arc<Settings>,
    stats: Arc<Stats>,
    retirees: Retirees,
    session: Option<Session>,
    /// Woken by the PostgreSQL listener.
    wake: Arc<Notify>,
    stop: watch::Receiver<bool>,
    table: String,
    /// The holds it made: the broker did not take their messages.
    held: Held,
    /// When it last released the holds that ran out.
    released: tokio::time::Instant,
    /// Tells handlers in this process that this relay runs, until it stops.
    _local: LocalRelay,
}

impl Runner {
    pub(super) fn new(
        outbox: Outbox,
        settings: Arc<Settings>,
        stats: Arc<Stats>,
        retirees: Retirees,
        session: Session,
        wake: Arc<Notify>,
        stop: watch::Receiver<bool>,
    ) -> Self {
        let table = outbox.table().as_str().to_owned();
        let local = outbox.local_relay();
        Self {
            outbox,
            settings,
            stats,
            retirees,
            session: Some(session),
            wake,
            stop,
            table,
            held: Held::default(),
            released: tokio::time::Instant::now(),
            _local: local,
        }
    }

    pub(super) async fn run(mut self) {
        tracing::info!(table = self.table, "outbox relay started");
        let mut failures = 0u32;
        loop {
            if *self.stop.borrow() {
                break;
            }
            match self.round().await {
                Ok(Round::Worked) => failures = 0,
                Ok(Round::Idle) => {
                    failures = 0;
                    if !self.wait_for_work().await {
                        break;
                    }
                }
                Ok(Round::Stopped) => break,
                // The failures so far stand: an outage before this round is not over.
                Ok(Round::Closed) => {
                    if !self.pause(self.settings.backoff.base()).await {
                        break;
                    }
                }
                Err(problem) => {
                    failures = failures.saturating_add(1);
                    let delay = self.settings.backoff.after(failures);
                    tracing::warn!(
                        table = self.table,
                        %problem,
                        retry_in = ?delay,
                        "outbox relay failed; retrying"
                    );
                    if !self.pause(delay).await {
                        break;
                    }
                }
            }
        }
        if let Some(session) = self.session.take() {
            session.close(&self.retirees).await;
        }
        self.retirees.settle(Duration::from_secs(10)).await;
        tracing::info!(table = self.table, "outbox relay stopped");
    }

    /// Takes a batch, publishes it ([`pipeline::publish`]), holding back each message the
    /// broker does not take with its run, and marks the confirmed ones sent.
    async fn round(&mut self) -> Result<Round, Problem> {
        self.release_holds().await?;
        let limit = self.settings.batch_size;
        let mut after = None;
        let batch = loop {
            let Some(batch) = self.take(limit, after).await? else {
                return Ok(Round::Stopped);
            };
            let full = batch.rows_taken() >= usize::try_from(limit).unwrap_or(usize::MAX);
            if !full || !batch.messages().is_empty() {
                break batch;
            }
            // A whole batch of runs waiting for an earlier message another relay has in hand:
            // the next one.
            after = batch.last_seq_taken();
            batch
                .mark_sent(&[])
                .await
                .map_err(|e| self.database_error(e))?;
        };
        let messages = batch.messages();
        let oldest = messages.iter().map(|m| m.age).max().unwrap_or_default();
        let oldest = self
            .held
            .oldest_age()
            .map_or(oldest, |held| held.max(oldest));
        metrics::gauge!(OUTBOX_PENDING_AGE_SECONDS, "table" => self.table.clone())
            .set(oldest.as_secs_f64());
        let (publishable, on_sight) = self.held.sort(messages);
        if publishable.is_empty() {
            self.write_holds(&batch, &on_sight).await?;
            let round = if on_sight.is_empty() {
                Round::Idle
            } else {
                Round::Worked
            };
            drop(on_sight);
            batch
                .mark_sent(&[])
                .await
                .map_err(|e| self.database_error(e))?;
            return Ok(round);
        }
        let session = self.session.as_ref().expect("connected above");
        let wait = self.settings.confirm_timeout;
        let settled = pipeline::publish(session, &publishable, wait).await;
        let mut holds = on_sight;
        // Closed by the broker over a publish (an error of the channel, not of the connection).
        let closure = (settled.not_taken.iter()).find_map(|(_, why)| match why {
            NotTaken::Channel(error) if error.is_amqp_soft_error() => Some(error),
            _ => None,
        });
        let closed = closure.is_some();
        if let Some(error) = closure {
            let culprit = (self.held).channel_closed(
                &publishable,
                self.settings.batch_size,
                refused_exchange(error),
            );
            holds.extend(culprit);
        } else {
            self.held.channel_kept(publishable.len());
        }
        let pipeline::Settled {
            sent,
            not_taken,
            distrusted,
        } = settled;
        let published = sent.len() as u64;
        Stats::add(&self.stats.published, published);
        metrics::counter!(OUTBOX_PUBLISHED_TOTAL, "table" => self.table.clone())
            .increment(published);
        let mut replace = false;
        // A message whose confirm never came while others of the round were confirmed is held
        // back like one the broker did not take (a queue without its quorum, say), rather than
        // fail every round with the wait for it.
        let unconfirmed_alone = |why: &NotTaken| {
            matches!(why, NotTaken::NoConfirm(_)) && (published > 0 || distrusted > 0)
        };
        for (message, why) in &not_taken {
            Stats::add(&self.stats.failed, 1);
            metrics::counter!(
                OUTBOX_PUBLISH_FAILURES_TOTAL,
                "table" => self.table.clone(),
                "reason" => why.label()
            )
            .increment(1);
            // A confirm that never came may still come, on a channel now used for other
            // publishes: a new channel keeps confirms and returns apart.
            replace |= why.is_channel_failure();
            if !why.is_channel_failure() || unconfirmed_alone(why) {
                holds.push(self.held.not_taken(message, why));
            }
        }
        // A message the broker did not take is held back; only a failed channel fails the
        // round.
        let failed = (not_taken.into_iter())
            .find(|(_, why)| why.is_channel_failure() && !unconfirmed_alone(why))
            .map(|(message, why)| Problem::Publish {
                message_id: message.message_id.clone(),
                why,
            });
        let written = self.write_holds(&batch, &holds).await;
        let marked = match written {
            Ok(()) => batch
                .mark_sent(&sent)
                .await
                .map_err(|e| self.database_error(e)),
            Err(problem) => Err(problem),
        };
        if replace {
            self.replace_session();
        }
        if let Err(problem) = marked {
            tracing::warn!(
                table = self.table,
                %problem,
                "confirmed messages not marked sent; they will be published again with the same ids"
            );
            return Err(failed.unwrap_or(problem));
        }
        match failed {
            // A channel closed over a publish is no outage to back off from: the next rounds
            // find the message and hold it back, after a short pause.
            Some(_) if closed => Ok(Round::Closed),
            Some(problem) => Err(problem),
            None => Ok(Round::Worked),
        }
    }

    /// Writes `holds` with `batch`: each message with the rest of its run, and every message to
    /// an exchange the broker refused.
    async fn write_holds(&self, batch: &PendingBatch, holds: &[Hold<'_>]) -> Result<(), Problem> {
        for hold in holds {
            let written = match hold.exchange {
                true => batch
                    .hold_exchange(&hold.message.exchange, hold.pause)
                    .await
                    .map(drop),
                false => batch.hold(hold.message, hold.pause).await,
            };
            written.map_err(|error| self.database_error(error))?;
        }
        Ok(())
    }

    /// Releases the holds that ran out, when one of this relay's did or a poll interval
    /// passed since the last release (a relay that stopped leaves its holds to the others).
    async fn release_holds(&mut self) -> Result<(), Problem> {
        let now = tokio::time::Instant::now();
        let due = self.held.ran_out(self.released, now)
            || self.released + self.settings.poll_interval <= now;
        if !due {
            return Ok(());
        }
        self.released = now;
        let released = self
            .outbox
            .release_holds()
            .await
            .map_err(|error| self.database_error(error))?;
        if released > 0 {
            tracing::debug!(table = self.table, released, "outbox holds ran out");
        }
        Ok(())
    }

    /// Connects if needed and takes up to `limit` pending messages after `after`; `None` when
    /// asked to stop first. Nothing is in hand until then: a shutdown need not wait for a
    /// broker or a database that does not answer.
    async fn take(
        &mut self,
        limit: u32,
        after: Option<i64>,
    ) -> Result<Option<PendingBatch>, Problem> {
        let mut stop = self.stop.clone();
        let taking = async {
            self.connect().await?;
            self.outbox
                .take_pending_after(limit, after)
                .await
                .map_err(|error| self.database_error(error))
        };
        tokio::select! {
            biased;
            _ = stop.wait_for(|stop| *stop) => Ok(None),
            batch = taking => batch.map(Some),
        }
    }

    /// Makes sure there is a usable session, replacing a lost one.
    async fn connect(&mut self) -> Result<(), Problem> {
        if self.session.as_ref().is_some_and(|s| !s.usable()) {
            tracing::warn!(table = self.table, "broker connection lost; reconnecting");
            self.replace_session();
        }
        if self.session.is_none() {
            let session = Session::open(&self.settings, &self.retirees)
                .await
                .map_err(Problem::Connect)?;
            Stats::add(&self.stats.reconnections, 1);
            self.session = Some(session);
        }
        Ok(())
    }

    /// Gives the session up; the next round opens a new one.
    fn replace_session(&mut self) {
        if let Some(session) = self.session.take() {
            session.retire(&self.retirees);
        }
    }

    fn database_error(&self, error: DbErr) -> Problem {
        Stats::add(&self.stats.database_errors, 1);
        Problem::Database(error)
    }

    /// Waits for a commit's wake-up, the poll interval or the end of a hold; returns `false`
    /// when asked to stop.
    async fn wait_for_work(&mut self) -> bool {
        let poll = tokio::time::Instant::now() + self.settings.poll_interval;
        let until = self
            .held
            .next_release()
            .map_or(poll, |release| release.min(poll));
        tokio::select! {
            biased;
            _ = self.stop.wait_for(|stop| *stop) => false,
            () = self.outbox.staged() => true,
            () = self.wake.notified() => true,
            () = tokio::time::sleep_until(until) => true,
        }
    }

    /// Waits `delay`; returns `false` when asked to stop.
    async fn pause(&mut self, delay: Duration) -> bool {
        tokio::select! {
            biased;
            _ = self.stop.wait_for(|stop| *stop) => false,
            () = tokio::time::sleep(delay) => true,
        }
    }
}

/// Whether the broker closed a channel for the exchange published to, whatever the message: it
/// does not exist, or the relay may not write to it; and which exchange, when its reply names
/// it (RabbitMQ's do: "no exchange 'x' in vhost '/'", "access to exchange 'x' in vhost '/'
/// refused ..."). (Topic authorisation refuses a routing key with the same code: not the whole
/// exchange.)
fn refused_exchange(error: &lapin::Error) -> Option<Refused<'_>> {
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    let lapin::ErrorKind::ProtocolError(amqp) = error.kind() else {
        return None;
    };
    let reply = amqp.get_message().as_str();
    let refused = match amqp.kind() {
        AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) => true,
        AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED) => !reply.contains("access to topic"),
        _ => false,
    };
    if !refused {
        return None;
    }
    let named = reply
        .split_once("exchange '")
        .and_then(|(_, rest)| rest.split_once('\''))
        .map(|(exchange, _)| exchange);
    Some(named.map_or(Refused::Unnamed, Refused::Exchange))
}

//! The relay's loop: wait for work, take a batch, publish it with confirms (pipelined, each run
//! in order), mark what was confirmed sent; back off after a failure.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::outbox::{LocalRelay, Outbox, PendingBatch, PendingMessage, Relaying};
use idem_runtime::sea_orm::DbErr;
use tokio::sync::Notify;

use super::held::{Hold, HoldMemory, Refused};
use super::pipeline;
use super::session::RelaySession;
use super::settings::RelaySettings;
use super::stats::RelayCounters;
use crate::confirm::NotTaken;
use crate::connect::Retirees;
use crate::metrics::{
    OUTBOX_PENDING, OUTBOX_PENDING_AGE_SECONDS, OUTBOX_PENDING_EVERY,
    OUTBOX_PUBLISH_FAILURES_TOTAL, OUTBOX_PUBLISHED_TOTAL, OUTBOX_RELAY_CONNECTED,
};
use crate::stop::StopSignal;

/// The longest a relay waits for its count of the pending messages.
const PENDING_COUNT_LIMIT: Duration = Duration::from_secs(2);

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

/// What the publishes the broker did not take mean for a round.
struct Failures {
    /// Whether the channel is to be replaced: a confirm it never gave may still come.
    replace_channel: bool,
    /// The publish whose failed channel fails the round, if one did.
    failed: Option<Problem>,
}

/// Why a round failed.
enum Problem {
    /// No connection to the broker.
    Connect(crate::error::Error),
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

/// The relay's task: its rounds, its waits, and its session.
pub(super) struct Runner {
    outbox: Outbox,
    settings: Arc<RelaySettings>,
    counters: Arc<RelayCounters>,
    retirees: Retirees,
    session: Option<RelaySession>,
    /// Woken by the PostgreSQL listener.
    wake: Arc<Notify>,
    stop: StopSignal,
    table: String,
    /// The holds it made: the broker did not take their messages.
    held: HoldMemory,
    /// When it last released the holds that ran out.
    released: tokio::time::Instant,
    /// When it last counted the pending messages, if it has.
    pending_counted: Option<tokio::time::Instant>,
    /// Where its pass through the pending rows goes on: after this seq. A pass takes batch
    /// after batch from the first pending row to the last, then starts again from the first,
    /// where it finds rows committed behind it (a lower seq in a transaction that committed
    /// later) and the rows of failed rounds. Scanning from the first row at every batch would
    /// step over the index entries of every row marked sent that the database has not purged
    /// yet: on InnoDB, whose purge lags behind a large drain, each batch slower than the last.
    pass_after: Option<i64>,
    /// Tells handlers in this process that this relay runs, until it stops.
    _local: LocalRelay,
}

impl Runner {
    /// A relay of `outbox` that starts with `session`, counts in `counters`, is woken by
    /// `wake` and stops at `stop`.
    pub(super) fn new(
        outbox: Outbox,
        settings: Arc<RelaySettings>,
        counters: Arc<RelayCounters>,
        retirees: Retirees,
        session: RelaySession,
        wake: Arc<Notify>,
        stop: StopSignal,
    ) -> Self {
        let table = outbox.table().as_str().to_owned();
        let local = outbox.local_relay();
        let held = HoldMemory::new(settings.holds);
        Self {
            outbox,
            settings,
            counters,
            retirees,
            session: Some(session),
            wake,
            stop,
            table,
            held,
            released: tokio::time::Instant::now(),
            pending_counted: None,
            pass_after: None,
            _local: local,
        }
    }

    /// Runs rounds until asked to stop, waiting for work when there is none and backing off
    /// after a failure; then closes the connection.
    pub(super) async fn run(mut self) {
        tracing::info!(table = self.table, "outbox relay started");
        self.gauge_connected(true);
        let mut failures = 0u32;
        loop {
            if self.stop.is_set() {
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
        self.gauge_connected(false);
        self.retirees.wait_until_gone(Duration::from_secs(10)).await;
        tracing::info!(table = self.table, "outbox relay stopped");
    }

    /// A round: releases the holds that ran out, takes a batch, publishes what is not held
    /// ([`pipeline::publish`]), holds back each message the broker does not take with its run,
    /// and marks the confirmed ones sent.
    async fn round(&mut self) -> Result<Round, Problem> {
        self.release_holds().await?;
        self.gauge_pending().await;
        let Some(batch) = self.take_batch().await? else {
            return Ok(Round::Stopped);
        };
        let full = is_full(&batch, self.settings.batch_size);
        let pass_goes_on = if full { batch.last_seq_taken() } else { None };
        let round = self.publish_batch(batch).await;
        self.pass_after = match round {
            Ok(Round::Worked | Round::Idle) => pass_goes_on,
            _ => None,
        };
        round
    }

    /// Publishes what `batch` holds that is not held back, holds back each message the broker
    /// does not take with its run, and marks the confirmed ones sent.
    async fn publish_batch(&mut self, batch: PendingBatch) -> Result<Round, Problem> {
        self.gauge_pending_age(batch.messages());
        let (publishable, on_sight) = self.held.sort(batch.messages());
        if publishable.is_empty() {
            let round = if on_sight.is_empty() {
                Round::Idle
            } else {
                Round::Worked
            };
            self.write_holds(&batch, &on_sight).await?;
            drop(on_sight);
            self.mark_sent(batch, &[]).await?;
            return Ok(round);
        }
        let session = self.session.as_ref().expect("connected above");
        let wait = self.settings.confirm_timeout;
        let report = pipeline::publish(session, &publishable, wait).await;
        let mut holds = on_sight;
        let closed = self.note_channel(&publishable, &report.not_taken, &mut holds);
        let pipeline::PublishReport {
            sent,
            not_taken,
            distrusted,
        } = report;
        let published = sent.len() as u64;
        self.count_published(published);
        let answered = published > 0 || distrusted > 0;
        let failures = self.sort_not_taken(not_taken, answered, &mut holds);
        let marked = match self.write_holds(&batch, &holds).await {
            Ok(()) => self.mark_sent(batch, &sent).await,
            Err(problem) => Err(problem),
        };
        if failures.replace_channel {
            self.replace_session();
        }
        self.conclude(marked, failures.failed, closed)
    }

    /// Takes the next batch to publish; `None` when asked to stop first. A full batch with no
    /// message to publish (its runs all wait for an earlier message another relay has in hand)
    /// is given back, and the batch after it taken.
    async fn take_batch(&mut self) -> Result<Option<PendingBatch>, Problem> {
        let limit = self.settings.batch_size;
        let mut after = self.pass_after;
        loop {
            let Some(batch) = self.take(limit, after).await? else {
                return Ok(None);
            };
            let full = is_full(&batch, limit);
            if !full || !batch.messages().is_empty() {
                return Ok(Some(batch));
            }
            after = batch.last_seq_taken();
            self.mark_sent(batch, &[]).await?;
        }
    }

    /// Sets the gauge of the pending age: the age of the oldest message of `messages` (a
    /// batch) or of those this relay holds back.
    fn gauge_pending_age(&self, messages: &[PendingMessage]) {
        let oldest = messages.iter().map(|m| m.age).max().unwrap_or_default();
        let oldest = self
            .held
            .oldest_age()
            .map_or(oldest, |held| held.max(oldest));
        metrics::gauge!(OUTBOX_PENDING_AGE_SECONDS, "table" => self.table.clone())
            .set(oldest.as_secs_f64());
    }

    /// Notes whether the broker closed the channel over one of the round's publishes (an error
    /// of the channel, not of the connection), adding the hold of the message that closed it,
    /// when it is known, to `holds`; returns whether it did.
    fn note_channel<'a>(
        &mut self,
        publishable: &[&'a PendingMessage],
        not_taken: &[(&'a PendingMessage, NotTaken)],
        holds: &mut Vec<Hold<'a>>,
    ) -> bool {
        let closure = not_taken.iter().find_map(|(_, why)| match why {
            NotTaken::Channel(error) if error.is_amqp_soft_error() => Some(error),
            _ => None,
        });
        let Some(error) = closure else {
            self.held.channel_kept(publishable.len());
            return false;
        };
        let careful_for = self.settings.batch_size;
        let refused = refused_exchange(error);
        holds.extend(self.held.channel_closed(publishable, careful_for, refused));
        true
    }

    /// Sets the gauges of the pending messages (how many, and the oldest one's age) from the
    /// table, read when the last read is older than [`OUTBOX_PENDING_EVERY`]: every round, a
    /// round that cannot reach the broker included, so that a growing backlog shows during an
    /// outage. A failed read leaves them as they were: the round's own statements report the
    /// database.
    async fn gauge_pending(&mut self) {
        if self
            .pending_counted
            .is_some_and(|counted| counted.elapsed() < OUTBOX_PENDING_EVERY)
        {
            return;
        }
        self.pending_counted = Some(tokio::time::Instant::now());
        // A count of a large backlog (or a database that hangs) holds neither the round up
        // for long nor a stop.
        let count = tokio::time::timeout(PENDING_COUNT_LIMIT, self.outbox.pending());
        match self.stop.clone().unless_stopped(count).await {
            Some(Ok(Ok(pending))) => {
                let table = self.table.clone();
                metrics::gauge!(OUTBOX_PENDING, "table" => table.clone()).set(pending.count as f64);
                let oldest = pending.oldest_age.unwrap_or_default();
                metrics::gauge!(OUTBOX_PENDING_AGE_SECONDS, "table" => table)
                    .set(oldest.as_secs_f64());
            }
            Some(Ok(Err(error))) => {
                tracing::debug!(table = self.table, %error, "cannot count the pending messages")
            }
            Some(Err(_)) => {
                tracing::debug!(
                    table = self.table,
                    "counting the pending messages took too long"
                )
            }
            None => {}
        }
    }

    /// Sets the gauge of the relay's broker connection.
    fn gauge_connected(&self, connected: bool) {
        metrics::gauge!(OUTBOX_RELAY_CONNECTED, "table" => self.table.clone())
            .set(f64::from(u8::from(connected)));
    }

    /// Counts `published` messages the broker confirmed.
    fn count_published(&self, published: u64) {
        RelayCounters::add(&self.counters.published, published);
        metrics::counter!(OUTBOX_PUBLISHED_TOTAL, "table" => self.table.clone())
            .increment(published);
    }

    /// Counts each publish the broker did not take and adds to `holds` those to hold back with
    /// their run; says what the others mean for the round. `answered`: the broker confirmed
    /// other publishes of the round, or acked some along with a confirm given up on.
    fn sort_not_taken<'a>(
        &mut self,
        not_taken: Vec<(&'a PendingMessage, NotTaken)>,
        answered: bool,
        holds: &mut Vec<Hold<'a>>,
    ) -> Failures {
        // A message whose confirm never came while others of the round were confirmed is held
        // back like one the broker did not take (a queue without its quorum, say), rather than
        // fail every round with the wait for it.
        let unconfirmed_alone = |why: &NotTaken| matches!(why, NotTaken::NoConfirm(_)) && answered;
        let mut replace_channel = false;
        for (message, why) in &not_taken {
            self.count_failure(why);
            // A confirm that never came may still come, on a channel now used for other
            // publishes: a new channel keeps confirms and returns apart. A round the broker
            // refused whole may be refused for the channel's own view of a queue (a quorum
            // queue's leader it still looks for after a node died, seen to last minutes on
            // RabbitMQ 3.10): its held messages are tried again on a new one.
            replace_channel |=
                why.is_channel_failure() || (matches!(why, NotTaken::Refused) && !answered);
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
        Failures {
            replace_channel,
            failed,
        }
    }

    /// Counts a publish the broker did not take, for the reason `why`.
    fn count_failure(&self, why: &NotTaken) {
        RelayCounters::add(&self.counters.failed, 1);
        metrics::counter!(
            OUTBOX_PUBLISH_FAILURES_TOTAL,
            "table" => self.table.clone(),
            "reason" => why.label()
        )
        .increment(1);
    }

    /// How the round ends, once its holds are written and its confirmed messages `marked`
    /// sent (or not), given the publish that `failed` its channel, if one did, and whether the
    /// broker `closed` the channel over a publish.
    fn conclude(
        &self,
        marked: Result<(), Problem>,
        failed: Option<Problem>,
        closed: bool,
    ) -> Result<Round, Problem> {
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

    /// Marks the messages `sent` (their seqs) sent and gives the rest of `batch` back, in the
    /// batch's transaction.
    async fn mark_sent(&self, batch: PendingBatch, sent: &[i64]) -> Result<(), Problem> {
        batch
            .mark_sent(sent)
            .await
            .map_err(|error| self.database_error(error))
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
        let stop = self.stop.clone();
        let taking = async {
            self.connect().await?;
            self.outbox
                .take_pending_after(limit, after)
                .await
                .map_err(|error| self.database_error(error))
        };
        stop.unless_stopped(taking).await.transpose()
    }

    /// Makes sure there is a usable session, replacing a lost one.
    async fn connect(&mut self) -> Result<(), Problem> {
        let usable = match &self.session {
            Some(session) => session.usable().await,
            None => true,
        };
        if !usable {
            tracing::warn!(table = self.table, "broker connection lost; reconnecting");
            self.gauge_connected(false);
            self.replace_session();
        }
        if self.session.is_none() {
            let session = RelaySession::open(&self.settings, &self.retirees)
                .await
                .map_err(Problem::Connect)?;
            RelayCounters::add(&self.counters.reconnections, 1);
            self.gauge_connected(true);
            self.session = Some(session);
        }
        Ok(())
    }

    /// Gives the session up; the next round opens a new one.
    fn replace_session(&mut self) {
        self.gauge_connected(false);
        if let Some(session) = self.session.take() {
            session.retire(&self.retirees);
        }
    }

    /// Counts a database failure, the round's problem.
    fn database_error(&self, error: DbErr) -> Problem {
        RelayCounters::add(&self.counters.database_errors, 1);
        Problem::Database(error)
    }

    /// Waits for a commit's wake-up, the poll interval or the end of a hold; returns `false`
    /// when asked to stop.
    async fn wait_for_work(&self) -> bool {
        let poll = tokio::time::Instant::now() + self.settings.poll_interval;
        let until = self
            .held
            .next_release()
            .map_or(poll, |release| release.min(poll));
        let work = async {
            tokio::select! {
                biased;
                () = self.outbox.staged() => {}
                () = self.wake.notified() => {}
                () = tokio::time::sleep_until(until) => {}
            }
        };
        self.stop.unless_stopped(work).await.is_some()
    }

    /// Waits `delay`; returns `false` when asked to stop.
    async fn pause(&self, delay: Duration) -> bool {
        self.stop.sleep(delay).await
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

/// Whether `batch` took as many rows as its statement was allowed (`limit`): there may be more.
fn is_full(batch: &PendingBatch, limit: u32) -> bool {
    batch.rows_taken() >= usize::try_from(limit).unwrap_or(usize::MAX)
}

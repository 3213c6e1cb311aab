//! Messages a relay holds back for a while, each with the rest of its run: one the broker did
//! not take (unroutable, refused), tried again after a few seconds; one a publish of which
//! closed the channel (an exchange that does not exist, or that the relay may not write to),
//! after longer; and how the relay finds such a message among a batch's publishes.

use std::collections::HashMap;
use std::time::Duration;

use idem_runtime::{HeldBack, PendingMessage};
use tokio::time::Instant;

/// How long a message whose publish closed the channel is held back before it is tried again
/// the first time; the hold doubles at each try, up to [`MAX_HOLD`].
const HOLD: Duration = Duration::from_secs(30);

/// How long a message the broker did not take is held back before it is tried again the first
/// time; the hold doubles at each try, up to [`MAX_HOLD`].
pub(super) const RETRY_NOT_TAKEN: Duration = Duration::from_secs(5);

/// The longest hold of a message the broker keeps refusing.
const MAX_HOLD: Duration = Duration::from_secs(300);

/// How long the tries of a message whose hold ran out are remembered: one taken meanwhile is
/// forgotten then.
const REMEMBER: Duration = Duration::from_secs(600);

/// The most held-back runs a batch's statement leaves out; the oldest come first.
const MAX_LEFT_OUT: usize = 100;

/// The messages held back, and whether the relay is looking for one.
#[derive(Debug, Default)]
pub(super) struct Held {
    /// Held messages by id.
    messages: HashMap<String, HeldMessage>,
    /// Exchanges held back until then, every message to them with its run: a publish to them
    /// closed the channel (no such exchange, or no access to it).
    exchanges: HashMap<String, Instant>,
    /// Publishes left to send one at a time, after a channel closed under several in flight:
    /// the next one to close it alone is the culprit.
    careful: u32,
}

#[derive(Debug)]
struct HeldMessage {
    until: Instant,
    /// Holds so far, this one included.
    tries: u32,
    /// When it was staged, by this process's clock.
    staged: Instant,
    held_back: HeldBack,
}

impl Held {
    /// Forgets the holds that ran out; the runs still held back, oldest first, for the next
    /// batch to leave out.
    pub(super) fn left_out(&mut self) -> Vec<HeldBack> {
        let now = Instant::now();
        self.messages.retain(|_, held| held.until + REMEMBER > now);
        // A run is left out from its earliest held message: later ones add nothing.
        let mut earliest: HashMap<Option<&str>, &HeldBack> = HashMap::new();
        for held in self.messages.values().filter(|held| held.until > now) {
            let back = &held.held_back;
            let entry = earliest.entry(back.run.as_deref()).or_insert(back);
            if back.seq < entry.seq {
                *entry = back;
            }
        }
        let mut left_out: Vec<HeldBack> = earliest.into_values().cloned().collect();
        left_out.sort_by_key(|held| held.seq);
        left_out.truncate(MAX_LEFT_OUT);
        left_out
    }

    /// How long ago the oldest held message was staged: the batches leave it out, not the
    /// pending age.
    pub(super) fn oldest_age(&self) -> Option<Duration> {
        let oldest = self.holding().map(|held| held.staged).min()?;
        Some(oldest.elapsed())
    }

    /// When the next hold runs out, if any.
    pub(super) fn next_release(&self) -> Option<Instant> {
        self.holding().map(|held| held.until).min()
    }

    /// The messages held back now.
    fn holding(&self) -> impl Iterator<Item = &HeldMessage> {
        let now = Instant::now();
        self.messages.values().filter(move |held| held.until > now)
    }

    /// The messages of `messages` (a batch, in the order staged) to publish now: none of a held
    /// message's run from it on, and only the first of them while the relay is careful.
    pub(super) fn publishable<'a>(
        &mut self,
        messages: &'a [PendingMessage],
    ) -> Vec<&'a PendingMessage> {
        self.hold_for_their_exchanges(messages);
        // Where each held run stops, its held message possibly in an earlier batch.
        let mut stopped_from: HashMap<Option<&str>, i64> = HashMap::new();
        for held in self.holding() {
            let from = stopped_from
                .entry(held.held_back.run.as_deref())
                .or_insert(i64::MAX);
            *from = (*from).min(held.held_back.seq);
        }
        let mut publishable = Vec::new();
        for message in messages {
            let run = message.run.as_deref();
            if stopped_from
                .get(&run)
                .is_some_and(|from| *from <= message.seq)
            {
                continue;
            }
            publishable.push(message);
        }
        if self.careful > 0 {
            publishable.truncate(1);
        }
        publishable
    }

    /// Holds back the messages of `messages` to a held exchange, for as long as it is held.
    fn hold_for_their_exchanges(&mut self, messages: &[PendingMessage]) {
        let now = Instant::now();
        self.exchanges.retain(|_, until| *until > now);
        for message in messages {
            let Some(until) = self.exchanges.get(&message.exchange).copied() else {
                continue;
            };
            let held = self.messages.get(&message.message_id);
            if held.is_none_or(|held| held.until <= now) {
                let tries = self.tries(&message.message_id);
                self.hold(message, until - now, tries);
            }
        }
    }

    /// Holds back `message`, which the broker did not take (`why`), with the rest of its run.
    pub(super) fn not_taken(&mut self, message: &PendingMessage, why: &impl std::fmt::Display) {
        let tries = self.tries(&message.message_id) + 1;
        let pause = grown(RETRY_NOT_TAKEN, tries);
        // Said at the first tries and then less and less often, not at every one.
        if tries.is_power_of_two() {
            tracing::warn!(
                message_id = message.message_id,
                exchange = message.exchange,
                routing_key = message.routing_key,
                %why,
                tries,
                retry_in = ?pause,
                "the broker did not take this outbox message; it is held back with the rest of \
                 its run"
            );
        }
        self.hold(message, pause, tries);
    }

    /// The holds of the message of `id` remembered so far.
    fn tries(&self, id: &str) -> u32 {
        self.messages.get(id).map_or(0, |held| held.tries)
    }

    fn hold(&mut self, message: &PendingMessage, pause: Duration, tries: u32) {
        let held_back = HeldBack::new(message.run.clone(), message.seq);
        let now = Instant::now();
        let held = HeldMessage {
            until: now + pause,
            tries,
            staged: now.checked_sub(message.age).unwrap_or(now),
            held_back,
        };
        self.messages.insert(message.message_id.clone(), held);
    }

    /// Notes that the channel closed under `published`, the messages of a round sent before
    /// it closed: the one message, if it was alone, is held back, and with it every message to
    /// its exchange if the broker refused the exchange itself (`exchange_refused`: not found, no
    /// access); otherwise the next publishes go one at a time, `careful_for` of them, to find
    /// it.
    pub(super) fn channel_closed(
        &mut self,
        published: &[&PendingMessage],
        careful_for: u32,
        exchange_refused: bool,
    ) {
        match published {
            [culprit] => {
                let tries = self.tries(&culprit.message_id) + 1;
                let pause = grown(HOLD, tries);
                tracing::error!(
                    message_id = culprit.message_id,
                    exchange = culprit.exchange,
                    retry_in = ?pause,
                    "publishing this outbox message closed the channel (no such exchange, or no \
                     access to it); it is held back with the rest of its run{}",
                    if exchange_refused {
                        ", and so is every message to its exchange"
                    } else {
                        ""
                    }
                );
                self.hold(culprit, pause, tries);
                if exchange_refused {
                    let until = Instant::now() + pause;
                    self.exchanges.insert(culprit.exchange.clone(), until);
                }
                self.careful = 0;
            }
            _ => self.careful = careful_for,
        }
    }

    /// Notes a round whose publishes left the channel open.
    pub(super) fn channel_kept(&mut self, published: usize) {
        self.careful = self
            .careful
            .saturating_sub(u32::try_from(published).unwrap_or(u32::MAX));
    }
}

/// `base` doubled at each try after the first, up to [`MAX_HOLD`].
fn grown(base: Duration, tries: u32) -> Duration {
    base.saturating_mul(1 << tries.saturating_sub(1).min(16))
        .min(MAX_HOLD)
}

//! What a relay remembers of the holds it makes. The holds themselves are in the outbox table
//! ([`PendingBatch::hold`](idem_runtime::outbox::PendingBatch::hold)), where no relay takes a held
//! message, nor the rest of its run, until the hold runs out; here are how many times each
//! run, message of no run or exchange was held (its holds grow), the exchanges held (messages
//! to them that turn up later are held on sight), when the next hold runs out, and how the relay
//! finds the message whose publish closed the channel.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use idem_runtime::outbox::PendingMessage;
use tokio::time::Instant;

use super::settings::HoldTimes;

/// How long the tries of a hold that ran out are remembered: one taken meanwhile is forgotten
/// then.
const REMEMBER: Duration = Duration::from_secs(600);

/// What was held: the holds of each grow apart.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Subject {
    /// A run, with its messages from the held one on.
    Run(String),
    /// A message of no run, by id.
    Message(String),
    /// Every message to an exchange, with their runs.
    Exchange(String),
}

impl Subject {
    fn of(message: &PendingMessage) -> Self {
        match &message.run {
            Some(run) => Subject::Run(run.clone()),
            None => Subject::Message(message.message_id.clone()),
        }
    }
}

/// The holds of one subject.
#[derive(Debug)]
struct SubjectHolds {
    /// Holds so far, the last one included.
    tries: u32,
    /// When the last one runs out.
    until: Instant,
    /// When the oldest message it held was staged, by this process's clock.
    staged: Instant,
}

/// A hold to write: the message (with the rest of its run) or the exchange, and for how long.
#[derive(Debug)]
pub(super) struct Hold<'a> {
    pub(super) message: &'a PendingMessage,
    pub(super) pause: Duration,
    /// Every message to the message's exchange too: the broker refused the exchange itself.
    pub(super) exchange: bool,
}

/// The broker closed a channel refusing the exchange published to (it does not exist, or the
/// relay may not write to it), naming it or not.
#[derive(Debug, Clone, Copy)]
pub(super) enum Refused<'a> {
    /// The exchange the broker named.
    Exchange(&'a str),
    /// An exchange the broker did not name.
    Unnamed,
}

/// The holds this relay made, and whether it is looking for a message that closed the channel.
#[derive(Debug, Default)]
pub(super) struct HoldMemory {
    /// How long the holds are.
    times: HoldTimes,
    holds: HashMap<Subject, SubjectHolds>,
    /// Publishes left to send one at a time, after a channel closed under several in flight:
    /// the next one to close it alone is the culprit.
    careful: u32,
}

impl HoldMemory {
    /// No holds yet; they will last `times`.
    pub(super) fn new(times: HoldTimes) -> Self {
        Self {
            times,
            ..Self::default()
        }
    }

    /// Forgets the holds long run out; the messages of `messages` (a batch, in the order
    /// staged) to publish now, and those to hold on sight (their exchange is held); only the
    /// first to publish while the relay is careful.
    pub(super) fn sort<'a>(
        &mut self,
        messages: &'a [PendingMessage],
    ) -> (Vec<&'a PendingMessage>, Vec<Hold<'a>>) {
        let now = Instant::now();
        self.holds.retain(|_, holds| holds.until + REMEMBER > now);
        let mut publishable = Vec::with_capacity(messages.len());
        let mut holds = Vec::new();
        // Runs one of whose messages is held on sight: their later ones wait behind it (the
        // hold written for it holds them in the table too).
        let mut held_runs: HashSet<&str> = HashSet::new();
        for message in messages {
            if message
                .run
                .as_deref()
                .is_some_and(|run| held_runs.contains(run))
            {
                continue;
            }
            let exchange = Subject::Exchange(message.exchange.clone());
            match self.holds.get(&exchange) {
                Some(held) if held.until > now => {
                    if let Some(run) = message.run.as_deref() {
                        held_runs.insert(run);
                    }
                    holds.push(Hold {
                        message,
                        pause: held.until - now,
                        exchange: false,
                    });
                }
                _ => publishable.push(message),
            }
        }
        if self.careful > 0 {
            publishable.truncate(1);
        }
        (publishable, holds)
    }

    /// The oldest message held, by when it was staged: the batches leave the held ones out, not
    /// the pending age.
    pub(super) fn oldest_age(&self) -> Option<Duration> {
        let now = Instant::now();
        let oldest = (self.holds.values())
            .filter(|holds| holds.until > now)
            .map(|holds| holds.staged)
            .min()?;
        Some(oldest.elapsed())
    }

    /// When the next hold this relay made runs out, if one runs: the relay releases it then.
    pub(super) fn next_release(&self) -> Option<Instant> {
        let now = Instant::now();
        (self.holds.values())
            .map(|holds| holds.until)
            .filter(|until| *until > now)
            .min()
    }

    /// Whether a hold this relay made ran out after `since` (and by `now`): it is to be
    /// released.
    pub(super) fn ran_out(&self, since: Instant, now: Instant) -> bool {
        (self.holds.values()).any(|holds| holds.until > since && holds.until <= now)
    }

    /// The hold of `message`, which the broker did not take (`why`), with the rest of its run.
    pub(super) fn not_taken<'a>(
        &mut self,
        message: &'a PendingMessage,
        why: &impl std::fmt::Display,
    ) -> Hold<'a> {
        let pause = self.note_hold(Subject::of(message), message, self.times.not_taken);
        let tries = self.tries(&Subject::of(message));
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
        Hold {
            message,
            pause,
            exchange: false,
        }
    }

    /// Notes that the channel closed under `published`, the messages of a round sent before
    /// it closed. The message that closed it is to be held back (and with it every message to
    /// its exchange if the broker refused the exchange itself, `refused`: not found, no
    /// access): the one message if it was alone, or the first to the exchange the broker named;
    /// otherwise the next publishes go one at a time, `careful_for` of them, to find it.
    pub(super) fn channel_closed<'a>(
        &mut self,
        published: &[&'a PendingMessage],
        careful_for: u32,
        refused: Option<Refused<'_>>,
    ) -> Option<Hold<'a>> {
        let named = |exchange: &str| published.iter().find(|m| m.exchange == exchange);
        let culprit = match (published, refused) {
            ([culprit], _) => culprit,
            (_, Some(Refused::Exchange(exchange))) if named(exchange).is_some() => {
                named(exchange).expect("found above")
            }
            _ => {
                self.careful = careful_for;
                return None;
            }
        };
        let exchange_refused = refused.is_some();
        self.careful = 0;
        let first = self.times.channel_closed;
        let mut pause = self.note_hold(Subject::of(culprit), culprit, first);
        if exchange_refused {
            // The exchange's holds grow apart from the run's; both last the longer of the two.
            let exchange = Subject::Exchange(culprit.exchange.clone());
            pause = pause.max(self.note_hold(exchange.clone(), culprit, first));
            for subject in [Subject::of(culprit), exchange] {
                if let Some(holds) = self.holds.get_mut(&subject) {
                    holds.until = Instant::now() + pause;
                }
            }
        }
        tracing::error!(
            message_id = culprit.message_id,
            exchange = culprit.exchange,
            retry_in = ?pause,
            "publishing this outbox message closed the channel (no such exchange, or no access \
             to it); it is held back with the rest of its run{}",
            if exchange_refused {
                ", and so is every message to its exchange"
            } else {
                ""
            }
        );
        Some(Hold {
            message: culprit,
            pause,
            exchange: exchange_refused,
        })
    }

    /// Notes a round whose publishes left the channel open.
    pub(super) fn channel_kept(&mut self, published: usize) {
        self.careful = self
            .careful
            .saturating_sub(u32::try_from(published).unwrap_or(u32::MAX));
    }

    /// The holds of `subject` so far.
    fn tries(&self, subject: &Subject) -> u32 {
        self.holds.get(subject).map_or(0, |holds| holds.tries)
    }

    /// Notes one more hold of `subject`, for `message`: `base` at first, doubling at each try
    /// after, up to the longest hold; returns its length.
    fn note_hold(
        &mut self,
        subject: Subject,
        message: &PendingMessage,
        base: Duration,
    ) -> Duration {
        let now = Instant::now();
        let staged = now.checked_sub(message.age).unwrap_or(now);
        let holds = self.holds.entry(subject).or_insert(SubjectHolds {
            tries: 0,
            until: now,
            staged,
        });
        holds.tries += 1;
        let pause = base
            .saturating_mul(1 << holds.tries.saturating_sub(1).min(16))
            .min(self.times.max);
        holds.until = now + pause;
        holds.staged = holds.staged.min(staged);
        pause
    }
}

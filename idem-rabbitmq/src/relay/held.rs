//! Messages a relay holds back for a while: each one a publish of which closed the channel (an
//! exchange that does not exist, or that the relay may not write to), and after it the rest of
//! its run; and how the relay finds such a message among a batch's publishes.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use idem_runtime::PendingMessage;
use tokio::time::Instant;

/// How long a message whose publish closed the channel is held back before it is tried again.
pub(super) const HOLD: Duration = Duration::from_secs(30);

/// The messages held back, and whether the relay is looking for one.
#[derive(Debug, Default)]
pub(super) struct Held {
    /// Held message ids, until when.
    until: HashMap<String, Instant>,
    /// Publishes left to send one at a time, after a channel closed under several in flight:
    /// the next one to close it alone is the culprit.
    careful: u32,
}

impl Held {
    /// The messages of `messages` (a batch, in the order staged) to publish now: none of a held
    /// message's run from it on, and only the first of them while the relay is careful.
    pub(super) fn publishable<'a>(
        &mut self,
        messages: &'a [PendingMessage],
    ) -> Vec<&'a PendingMessage> {
        let now = Instant::now();
        self.until.retain(|_, until| *until > now);
        let mut stopped: HashSet<Option<&str>> = HashSet::new();
        let mut publishable = Vec::new();
        for message in messages {
            let run = message.run.as_deref();
            if stopped.contains(&run) || self.until.contains_key(&message.message_id) {
                stopped.insert(run);
                continue;
            }
            publishable.push(message);
        }
        if self.careful > 0 {
            publishable.truncate(1);
        }
        publishable
    }

    /// Notes that the channel closed under `published`, the messages of a round sent before
    /// it closed: the one message, if it was alone, is held back; otherwise the next publishes
    /// go one at a time, `careful_for` of them, to find it.
    pub(super) fn channel_closed(&mut self, published: &[&PendingMessage], careful_for: u32) {
        match published {
            [culprit] => {
                tracing::error!(
                    message_id = culprit.message_id,
                    exchange = culprit.exchange,
                    retry_in = ?HOLD,
                    "publishing this outbox message closed the channel (no such exchange, or no \
                     access to it); it is held back with the rest of its run"
                );
                self.until
                    .insert(culprit.message_id.clone(), Instant::now() + HOLD);
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

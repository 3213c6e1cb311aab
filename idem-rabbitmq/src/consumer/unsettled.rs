//! The deliveries of a channel not settled yet, so that a batch knows when one `basic.ack`
//! with `multiple` may acknowledge its deliveries: it covers every unsettled delivery of the
//! channel up to its tag, so only when those are all the batch's own.
//!
//! A recovered channel numbers its deliveries from 1 again: tags are kept by epoch, a new epoch
//! starting when a tag comes that is not above the last one, so that the tags of deliveries
//! taken before a recovery never stand for those taken after it.

use std::collections::BTreeSet;
use std::sync::Mutex;

/// The unsettled delivery tags of one channel, in its current epoch.
#[derive(Debug, Default)]
pub(crate) struct Unsettled {
    state: Mutex<State>,
    /// Held from taking tags for a multiple ack until that ack is sent, so that multiple acks
    /// reach the broker in the order their tags were taken: a later one sent first would cover
    /// the earlier one's tags, and the broker refuses an ack of a tag already acknowledged.
    multiple_acks: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
struct State {
    epoch: u64,
    last: Option<u64>,
    tags: BTreeSet<u64>,
}

impl Unsettled {
    /// Notes a delivery received; returns the epoch its tag belongs to.
    pub(crate) fn received(&self, tag: u64) -> u64 {
        let mut state = self.lock();
        if state.last.is_some_and(|last| tag <= last) {
            // The channel was recovered: what was unsettled before went back to the queue.
            state.epoch += 1;
            state.tags.clear();
        }
        state.last = Some(tag);
        state.tags.insert(tag);
        state.epoch
    }

    /// Notes a delivery of `epoch` settled on its own (acknowledged, requeued, dead-lettered),
    /// once the broker was told.
    pub(crate) fn settled(&self, epoch: u64, tag: u64) {
        let mut state = self.lock();
        if state.epoch == epoch {
            state.tags.remove(&tag);
        }
    }

    /// If `tags` are of the current epoch and every unsettled tag up to the highest of them is
    /// one of them, takes them all and returns that highest tag, for one acknowledgment with
    /// `multiple`; otherwise leaves everything as it is.
    pub(crate) fn take_through(&self, epoch: u64, tags: &[u64]) -> Option<u64> {
        let last = *tags.iter().max()?;
        let mut state = self.lock();
        if state.epoch != epoch {
            return None;
        }
        let ours: BTreeSet<u64> = tags.iter().copied().collect();
        if !state.tags.range(..=last).all(|tag| ours.contains(tag)) {
            return None;
        }
        let later = state.tags.split_off(&(last + 1));
        state.tags = later;
        Some(last)
    }

    /// Waits for the turn to take tags and send one multiple ack; hold it until the ack is sent.
    pub(crate) async fn multiple_ack_turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.multiple_acks.lock().await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_multiple_ack_only_when_every_earlier_tag_is_the_batchs() {
        let unsettled = Unsettled::default();
        for tag in 1..=6 {
            assert_eq!(unsettled.received(tag), 0);
        }
        // Tag 2 failed and waits to be requeued: the batch 1, 3 is acknowledged one by one.
        assert_eq!(unsettled.take_through(0, &[1, 3]), None);
        unsettled.settled(0, 1);
        unsettled.settled(0, 3);
        unsettled.settled(0, 2);
        assert_eq!(unsettled.take_through(0, &[5, 4]), Some(5));
        assert_eq!(unsettled.take_through(0, &[6]), Some(6));
        assert_eq!(unsettled.take_through(0, &[]), None);
    }

    #[test]
    fn tags_from_before_a_recovery_never_cover_later_ones() {
        let unsettled = Unsettled::default();
        for tag in 1..=100 {
            unsettled.received(tag);
        }
        // The channel is recovered and numbers its deliveries from 1 again.
        assert_eq!(unsettled.received(1), 1);
        unsettled.received(2);
        let old: Vec<u64> = (1..=100).collect();
        assert_eq!(unsettled.take_through(0, &old), None);
        unsettled.settled(0, 2);
        assert_eq!(
            unsettled.take_through(1, &[3]),
            None,
            "1 and 2 are unsettled"
        );
        assert_eq!(unsettled.take_through(1, &[1, 2]), Some(2));
    }
}

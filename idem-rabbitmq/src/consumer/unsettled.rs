//! The deliveries of a channel not settled yet, so that a batch knows when one `basic.ack`
//! with `multiple` may acknowledge its deliveries: it covers every unsettled delivery of the
//! channel up to its tag, so only when those are all the batch's own.

use std::collections::BTreeSet;
use std::sync::Mutex;

/// The unsettled delivery tags of one channel.
#[derive(Debug, Default)]
pub(crate) struct Unsettled {
    tags: Mutex<BTreeSet<u64>>,
}

impl Unsettled {
    /// Notes a delivery received.
    pub(crate) fn received(&self, tag: u64) {
        self.lock().insert(tag);
    }

    /// Notes a delivery settled on its own (acknowledged, requeued, dead-lettered), once the
    /// broker was told.
    pub(crate) fn settled(&self, tag: u64) {
        self.lock().remove(&tag);
    }

    /// If every unsettled tag up to the highest of `tags` is one of `tags`, takes them all and
    /// returns that highest tag, for one acknowledgment with `multiple`; otherwise leaves
    /// everything as it is.
    pub(crate) fn take_through(&self, tags: &[u64]) -> Option<u64> {
        let last = *tags.iter().max()?;
        let mut unsettled = self.lock();
        let ours: BTreeSet<u64> = tags.iter().copied().collect();
        if !unsettled.range(..=last).all(|tag| ours.contains(tag)) {
            return None;
        }
        let later = unsettled.split_off(&(last + 1));
        *unsettled = later;
        Some(last)
    }

    /// Forgets every tag: the channel was recovered, and its tags start again.
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<u64>> {
        self.tags
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
            unsettled.received(tag);
        }
        // Tag 2 failed and waits to be requeued: the batch 1, 3 is acknowledged one by one.
        assert_eq!(unsettled.take_through(&[1, 3]), None);
        unsettled.settled(1);
        unsettled.settled(3);
        unsettled.settled(2);
        assert_eq!(unsettled.take_through(&[5, 4]), Some(5));
        assert_eq!(unsettled.take_through(&[6]), Some(6));
        assert_eq!(unsettled.take_through(&[]), None);
    }
}

//! A batching binding's deliveries gathered into batches: up to its batch size, or those that
//! came within its wait after the first.

use std::sync::Arc;

use lapin::message::Delivery;
use tokio::time::Instant;

use super::binding::Batching;
use super::unsettled::Unsettled;

/// A gathered batch, ready to be processed.
pub(crate) struct Gathered {
    /// The deliveries of their channel that are not settled yet.
    pub(crate) unsettled: Arc<Unsettled>,
    /// The channel's epoch the deliveries were received in.
    pub(crate) epoch: u64,
    /// The deliveries, in the order they came.
    pub(crate) deliveries: Vec<Delivery>,
}

/// The batch a binding is gathering from one session's channel.
pub(crate) struct Gathering {
    batching: Batching,
    unsettled: Arc<Unsettled>,
    epoch: u64,
    deliveries: Vec<Delivery>,
    /// When the batch has waited long enough for more deliveries; `None` while it is empty.
    flush_at: Option<Instant>,
}

impl Gathering {
    /// Starts gathering on a new channel, as `batching` says.
    pub(crate) fn new(batching: Batching) -> Self {
        Self {
            batching,
            unsettled: Arc::new(Unsettled::default()),
            epoch: 0,
            deliveries: Vec::new(),
            flush_at: None,
        }
    }

    /// When the batch has waited long enough for more deliveries and goes as it is.
    pub(crate) fn flush_at(&self) -> Option<Instant> {
        self.flush_at
    }

    /// Adds `delivery`; returns the batch once it is full.
    pub(crate) fn add(&mut self, delivery: Delivery) -> Option<Gathered> {
        let received = self.unsettled.received(delivery.delivery_tag);
        if received != self.epoch {
            // The channel was recovered: the deliveries gathered before went back to the
            // queue with it, and can no longer be settled.
            self.epoch = received;
            self.deliveries.clear();
        }
        self.deliveries.push(delivery);
        if self.deliveries.len() < self.batching.size {
            let max_wait = self.batching.max_wait;
            self.flush_at
                .get_or_insert_with(|| Instant::now() + max_wait);
            return None;
        }
        Some(self.take())
    }

    /// Takes the batch gathered so far.
    pub(crate) fn take(&mut self) -> Gathered {
        self.flush_at = None;
        Gathered {
            unsettled: Arc::clone(&self.unsettled),
            epoch: self.epoch,
            deliveries: std::mem::take(&mut self.deliveries),
        }
    }
}

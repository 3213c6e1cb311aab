//! The broker's side: a queue delivering each message at least once, the settle decisions a
//! worker carries out on it, and the dead-letter queue.

use crate::config::MAX_KEYS;
use crate::db::bit;

/// Why a message was dead-lettered (its `x-idem-reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Its key's claims were taken over too often (`needs-intervention`).
    NeedsIntervention,
    /// Its counted failed deliveries reached the limit (`delivery-limit`).
    DeliveryLimit,
}

/// How a worker settles a delivery: `idem_runtime::Error::settle` and the delivery policy
/// (`idem-runtime/src/delivery.rs`, `DeliveryPolicy::decide`), carried out by
/// `idem-rabbitmq/src/consumer/settle.rs` (`Settler::settle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Its effect is committed: acknowledge.
    Ack {
        /// Answered from the record as a duplicate.
        duplicate: bool,
    },
    /// Back to the queue; `counted` against its delivery limit.
    Requeue {
        /// Whether the failure counts as an attempt (`Error::counts_as_attempt`).
        counted: bool,
    },
    /// To the dead-letter queue with a reason, then acknowledged.
    DeadLetter(Reason),
}

/// The queue and what it knows of each message.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Broker {
    /// Copies ready to deliver, by key, in key order (a multiset).
    pub ready: Vec<u8>,
    /// Counted failed deliveries per key (the quorum queue's `x-delivery-count`).
    pub failures: [u8; MAX_KEYS],
    /// Keys with a copy in the dead-letter queue.
    pub dead_lettered: u8,
}

impl Broker {
    /// A copy of `key` back on (or onto) the queue.
    pub fn enqueue(&mut self, key: u8) {
        let at = self.ready.partition_point(|k| *k <= key);
        self.ready.insert(at, key);
    }

    /// Takes a ready copy of `key` for a consumer.
    pub fn take(&mut self, key: u8) -> bool {
        match self.ready.iter().position(|k| *k == key) {
            Some(at) => {
                self.ready.remove(at);
                true
            }
            None => false,
        }
    }

    /// The distinct keys with a ready copy.
    pub fn ready_keys(&self) -> impl Iterator<Item = u8> + '_ {
        let mut last = None;
        self.ready.iter().copied().filter(move |key| {
            let new = last != Some(*key);
            last = Some(*key);
            new
        })
    }

    /// Requeues a copy of `key` after a failure; `counted`, it may reach the delivery limit
    /// (`max_deliveries`), and is then to be dead-lettered instead. Returns whether it was
    /// requeued.
    pub fn requeue(&mut self, key: u8, counted: bool, max_deliveries: u8) -> bool {
        if counted {
            self.failures[key as usize] += 1;
            if self.failures[key as usize] >= max_deliveries {
                return false;
            }
        }
        self.enqueue(key);
        true
    }

    /// Puts a copy of `key` in the dead-letter queue with its reason.
    pub fn dead_letter(&mut self, key: u8) {
        self.dead_lettered |= bit(key as usize);
    }
}

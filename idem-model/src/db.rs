//! The database as the model sees it: the inbox table, the business writes and entity markers,
//! the outbox table, and the transactions open on them.
//!
//! A transaction's writes are invisible to others until it commits; a key it claimed (a row it
//! inserted or updated) or a marker it created is locked until it ends, so that another claim
//! of the key waits, as `INSERT … ON CONFLICT DO NOTHING` waits for an uncommitted insert of
//! the same key, and the cleaner skips it (`FOR UPDATE SKIP LOCKED`).

use crate::config::{MAX_KEYS, MAX_WORKERS};

/// A key's bit in a set of keys.
pub fn bit(key: usize) -> u8 {
    1 << key
}

/// An inbox record's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Claimed; `lease_live` while its two-phase lease runs (a transactional claim has none and
    /// is never committed in progress).
    InProgress {
        /// Whether the lease still runs, by the database's clock.
        lease_live: bool,
    },
    /// Completed with its output.
    Completed,
}

/// An inbox record (`idem-runtime/src/store`'s row): status, claim token, attempts, and whether
/// it is past its retention (`expires_at <= now`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Record {
    /// Its status.
    pub status: Status,
    /// The token of the claim that wrote it.
    pub token: u8,
    /// Claims so far (takeovers of lapsed leases add one).
    pub attempts: u8,
    /// Past its retention: it behaves as absent.
    pub expired: bool,
}

impl Record {
    /// A fresh claim's record.
    pub fn claim(token: u8, attempts: u8, lease: bool) -> Self {
        Self {
            status: Status::InProgress { lease_live: lease },
            token,
            attempts,
            expired: false,
        }
    }
}

/// The exchange a staged message goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Exchange {
    /// One that may not exist at first.
    Missing,
    /// One that exists.
    Present,
}

/// A staged message's id: derived from (consumer, key, position) in idem
/// (`idem-runtime/src/outbox/message.rs`, `derived_id`); `run` is 0 then, and the claim's token
/// with the planted bug of fresh ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId {
    /// The key of the message whose handler staged it (its run).
    pub key: u8,
    /// Its position among the run's stagings.
    pub position: u8,
    /// What distinguishes runs' ids, when they are not derived.
    pub run: u8,
}

/// A row of the outbox table; its index in [`Db::outbox`] is its `seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Row {
    /// The message id.
    pub id: MessageId,
    /// Where it goes.
    pub exchange: Exchange,
    /// Marked sent (`sent_at`).
    pub sent: bool,
    /// Held back (`held_until` set), by the relay that wrote the hold last.
    pub held: Option<u8>,
    /// The relay whose batch locks it (`FOR UPDATE SKIP LOCKED`).
    pub locked_by: Option<u8>,
}

/// An open transaction's writes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Tx {
    /// Rolled back by the database under its owner, who has not noticed yet: its writes are
    /// gone and its locks released.
    pub aborted: bool,
    /// The records it inserted or took over, by key, as it will commit them.
    pub claims: Vec<(u8, Record)>,
    /// The entity markers it created.
    pub markers: u8,
    /// The business writes of its handlers, by key (a key twice is two effects).
    pub effects: Vec<u8>,
    /// The messages its handlers staged.
    pub staged: Vec<Row>,
}

impl Tx {
    /// Whether it holds `key`'s lock (its record or its marker).
    pub fn locks(&self, key: usize) -> bool {
        !self.aborted
            && (self.claims.iter().any(|(k, _)| *k as usize == key) || self.markers & bit(key) != 0)
    }

    /// Rolls back what the handler of `key` wrote (a savepoint), keeping the key's claim.
    pub fn roll_back_handler(&mut self, key: u8) {
        self.effects.retain(|k| *k != key);
        self.staged.retain(|row| row.id.key != key);
    }
}

/// The database.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Db {
    /// The inbox table's committed records.
    pub records: [Option<Record>; MAX_KEYS],
    /// Committed entity markers (entity mode), a bit per key.
    pub markers: u8,
    /// Committed business writes per key.
    pub effects: [u8; MAX_KEYS],
    /// Committed outbox rows, in commit order.
    pub outbox: Vec<Row>,
    /// The last claim token given per key (tokens are unique per key).
    pub tokens: [u8; MAX_KEYS],
    /// Each worker's open transaction.
    pub txs: [Option<Tx>; MAX_WORKERS],
}

impl Db {
    /// Whether a transaction other than `worker`'s holds `key`'s lock.
    pub fn locked_by_other(&self, key: usize, worker: usize) -> bool {
        self.txs
            .iter()
            .enumerate()
            .any(|(owner, tx)| owner != worker && tx.as_ref().is_some_and(|tx| tx.locks(key)))
    }

    /// Whether any open transaction holds `key`'s lock.
    pub fn locked(&self, key: usize) -> bool {
        self.txs.iter().flatten().any(|tx| tx.locks(key))
    }

    /// A fresh claim token for `key`.
    pub fn new_token(&mut self, key: usize) -> u8 {
        self.tokens[key] += 1;
        self.tokens[key]
    }

    /// `worker`'s open transaction.
    ///
    /// # Panics
    ///
    /// It has none.
    pub fn tx(&mut self, worker: usize) -> &mut Tx {
        self.txs[worker].as_mut().expect("an open transaction")
    }

    /// Whether `worker`'s transaction was rolled back under it.
    pub fn aborted(&self, worker: usize) -> bool {
        self.txs[worker].as_ref().is_some_and(|tx| tx.aborted)
    }

    /// The database rolls `worker`'s transaction back on its own.
    pub fn abort(&mut self, worker: usize) {
        *self.tx(worker) = Tx {
            aborted: true,
            ..Tx::default()
        };
    }

    /// Applies `worker`'s transaction, which ends; returns it.
    pub fn commit(&mut self, worker: usize) -> Tx {
        let tx = self.txs[worker].take().expect("an open transaction");
        assert!(!tx.aborted, "an aborted transaction is not committed");
        for (key, record) in &tx.claims {
            self.records[*key as usize] = Some(*record);
        }
        self.markers |= tx.markers;
        for key in &tx.effects {
            self.effects[*key as usize] += 1;
        }
        // `ON CONFLICT (message_id) DO NOTHING`: a repeat of a run stages nothing new.
        for row in &tx.staged {
            if !self.outbox.iter().any(|staged| staged.id == row.id) {
                self.outbox.push(*row);
            }
        }
        tx
    }
}

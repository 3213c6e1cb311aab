//! The whole system's state: the database, the broker, each worker, relay and the cleaner, the
//! faults the environment has left, and the ghost variables the properties read (what happened,
//! which no part of the system keeps).

use std::fmt;

use crate::broker::{Broker, Verdict};
use crate::config::{Config, MAX_KEYS, MAX_RELAYS, MAX_STAGED, MAX_WORKERS};
use crate::db::{Db, Exchange, MessageId, Status, bit};

/// A worker's current piece of work.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Job {
    /// Nothing in hand.
    Idle,
    /// One delivery of `key` on the per-message path.
    Message {
        /// The delivery's key.
        key: u8,
        /// Where its processing is.
        step: Step,
    },
    /// A batch of deliveries in one transaction.
    Batch(Batch),
}

/// Where a delivery's processing is, on the per-message path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Not claimed yet (entity mode: the marker not created yet).
    Claim,
    /// Transactional or entity mode: the transaction is open and holds the claim (or marker).
    InTransaction {
        /// The handler ran in it.
        handled: bool,
        /// Acknowledged already (the planted bug of acking before the commit).
        acked: bool,
    },
    /// Two-phase mode: the claim `token` is held, committed, with its lease.
    Holding {
        /// The claim's token.
        token: u8,
        /// The claim's attempt number.
        attempt: u8,
        /// The handler returned its output: the side effect is done.
        returned: bool,
    },
}

/// A batch in one transaction (`idem-runtime/src/inbox/batch/`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Batch {
    /// The first copy of each key, in key order.
    pub leads: Vec<Lead>,
    /// Keys of later copies of a key already led.
    pub repeats: Vec<u8>,
    /// Handlers run under a savepoint each (after an unguarded try failed).
    pub guarded: bool,
    /// The try's claims are taken: its transaction is open.
    pub claimed: bool,
}

/// The first copy of a key in a batch (`batch::fates::Lead`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lead {
    /// Its key.
    pub key: u8,
    /// What became of it.
    pub fate: Fate,
    /// Failed in an unguarded try: its error stands, later tries leave it out.
    pub failed_alone: bool,
}

/// What became of a batch's lead (`batch::fates::Fate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fate {
    /// Not claimed by this try yet.
    Unclaimed,
    /// Claimed fresh; its handler has not run.
    Fresh,
    /// Its handler ran in the transaction.
    Processed,
    /// A completed, live record answers it.
    Duplicate,
    /// Left for the per-message path after the commit.
    Deferred,
    /// Failed, settled so.
    Failed(Verdict),
}

/// A relay's round in hand (`idem-rabbitmq/src/relay/run.rs`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Relay {
    /// Its batch: the seqs it locked (taken), in order.
    pub taken: Vec<u8>,
    /// The seqs it is to publish, in order (the batch less the runs that wait and the
    /// messages held on sight).
    pub publishable: Vec<u8>,
    /// Seqs confirmed by the broker this round.
    pub sent: Vec<u8>,
    /// Holds to write with the batch: a message with the rest of its run from it on, and with
    /// `exchange` every message to its exchange and their runs.
    pub holds: Vec<(u8, bool)>,
    /// Runs (keys) with a message the broker did not take this round.
    pub stopped: u8,
    /// The channel closed this round: nothing more is published.
    pub closed: bool,
    /// Whether a round is in hand.
    pub busy: bool,
    /// Its memory of the missing exchange, held back on sight (`relay::held::HoldMemory`).
    pub holds_exchange: bool,
}

/// The cleaner's run and the digests of deleted keys (`idem-runtime/src/retention/cleaner.rs`,
/// `idem-runtime/src/telemetry/digest.rs`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Retention {
    /// Completed keys the cleaner's run deleted, not yet in the digest table (`DigestRun`).
    pub deleting: u8,
    /// The digest table: completed keys deleted.
    pub digest: u8,
    /// Each worker process's copy of the digests, read back after the cleaner runs.
    pub copies: [u8; MAX_WORKERS],
}

/// Faults the environment may still inject.
pub type Budget = crate::config::Faults;

/// What happened, for the properties: kept by the model, not by the system.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// Effects committed per key (two-phase: completions) since its record last expired.
    pub live_effects: [u8; MAX_KEYS],
    /// Keys whose effect was committed at some point.
    pub committed: u8,
    /// Keys completed since their last claim: the next claim processes the message again.
    pub completed: u8,
    /// A delivery was acknowledged while its key had no committed effect, and not
    /// dead-lettered.
    pub acked_too_early: bool,
    /// A copy of a processed message was processed again without being counted as late.
    pub late_uncounted: bool,
    /// ... though its record was found expired, or its deletion had reached the claiming
    /// process's digest.
    pub late_missed: bool,
    /// Times each staged message (or two-phase call) was processed downstream, by logical
    /// message (key, position).
    pub downstream: [[u8; MAX_STAGED]; MAX_KEYS],
    /// Ids the downstream consumer recorded.
    pub downstream_ids: Vec<MessageId>,
    /// Positions of each run published at least once.
    pub published: [u8; MAX_KEYS],
    /// A message was published before an earlier one of its run.
    pub out_of_order: bool,
    /// Things seen happen, for the properties that say the model is not vacuous.
    pub seen: Seen,
}

/// Things seen happen at least once (each only in the checks that look for it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Seen {
    /// A duplicate was acknowledged.
    pub duplicate_acked: bool,
    /// A late duplicate was counted.
    pub late_counted: bool,
    /// A lapsed lease was taken over.
    pub takeover: bool,
    /// A worker whose claim was taken over could not complete.
    pub fenced: bool,
    /// A batch ran again under savepoints.
    pub rerun: bool,
    /// A message was dead-lettered.
    pub dead_lettered: bool,
    /// A run was held back.
    pub held: bool,
}

/// A worker: its job, what it holds for later, and what it has decided to settle.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Worker {
    /// What it is doing.
    pub job: Job,
    /// Deliveries a batch left for the per-message path.
    pub later: Vec<u8>,
    /// Deliveries decided, to settle in order.
    pub settle: Vec<(u8, Verdict)>,
}

impl Worker {
    fn idle() -> Self {
        Self {
            job: Job::Idle,
            later: Vec::new(),
            settle: Vec::new(),
        }
    }

    /// Whether it holds no delivery.
    pub fn is_free(&self) -> bool {
        self.job == Job::Idle && self.later.is_empty() && self.settle.is_empty()
    }

    /// Every delivery it holds (to give back when it crashes).
    pub fn held(&self) -> Vec<u8> {
        let mut held: Vec<u8> = match &self.job {
            Job::Idle => Vec::new(),
            // Acknowledged already by the planted bug: the broker has it.
            Job::Message {
                step: Step::InTransaction { acked: true, .. },
                ..
            } => Vec::new(),
            Job::Message { key, .. } => vec![*key],
            Job::Batch(batch) => batch
                .leads
                .iter()
                .map(|lead| lead.key)
                .chain(batch.repeats.iter().copied())
                .collect(),
        };
        held.extend(&self.later);
        held.extend(self.settle.iter().map(|(key, _)| *key));
        held
    }
}

/// The state of the whole system.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The database.
    pub db: Db,
    /// The broker.
    pub broker: Broker,
    /// The consumer workers.
    pub workers: [Worker; MAX_WORKERS],
    /// The outbox relays.
    pub relays: [Relay; MAX_RELAYS],
    /// The cleaner and digests.
    pub retention: Retention,
    /// Whether the missing exchange is still missing.
    pub exchange_missing: bool,
    /// Faults left.
    pub budget: Budget,
    /// What happened.
    pub ghost: Ghost,
}

impl State {
    /// The initial state: each message published once, nothing else done.
    pub fn initial(config: &Config) -> Self {
        let mut broker = Broker::default();
        for key in config.keys() {
            broker.enqueue(key as u8);
        }
        Self {
            db: Db::default(),
            broker,
            workers: [Worker::idle(), Worker::idle()],
            relays: Default::default(),
            retention: Retention::default(),
            exchange_missing: config.missing_exchange,
            budget: config.faults,
            ghost: Ghost::default(),
        }
    }

    /// Commits `worker`'s transaction and notes the effects it committed.
    pub fn commit(&mut self, worker: usize) {
        let tx = self.db.commit(worker);
        for key in tx.effects {
            self.effect_committed(key as usize);
        }
    }

    /// Notes an effect of `key` committed (a transactional run's writes, an entity's, or a
    /// two-phase completion).
    pub fn effect_committed(&mut self, key: usize) {
        self.ghost.live_effects[key] += 1;
        self.ghost.committed |= bit(key);
        self.ghost.completed |= bit(key);
    }

    /// Notes that `id` (the logical message `key`, `position`) reached the downstream
    /// consumer, whose inbox records each id once.
    pub fn downstream(&mut self, id: MessageId) {
        if let Err(at) = self.ghost.downstream_ids.binary_search(&id) {
            self.ghost.downstream_ids.insert(at, id);
            self.ghost.downstream[id.key as usize][id.position as usize] += 1;
        }
    }

    /// Gives every delivery `worker` holds back to the broker, which redelivers them.
    pub fn give_back(&mut self, worker: usize) {
        for key in self.workers[worker].held() {
            self.broker.enqueue(key);
        }
        self.workers[worker] = Worker::idle();
    }
}

/// A key's name in printouts: `a`, `b`.
pub fn name(key: u8) -> char {
    (b'a' + key) as char
}

/// The keys of a set, by name.
fn keys(set: u8) -> String {
    (0..8).filter(|k| set & (1 << k) != 0).map(name).collect()
}

/// One line per part, for counterexamples.
impl fmt::Debug for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_inbox(f)?;
        self.fmt_outbox(f)?;
        let ready: String = self.broker.ready.iter().map(|k| name(*k)).collect();
        let dead = keys(self.broker.dead_lettered);
        write!(f, "\n       queue [{ready}], dead letters [{dead}]")?;
        self.fmt_workers(f)?;
        for (number, relay) in self.relays.iter().enumerate() {
            if *relay != Relay::default() {
                write!(f, "\n       relay {number}: {relay:?}")?;
            }
        }
        let retention = &self.retention;
        if *retention != Retention::default() {
            let [first, second] = retention.copies.map(keys);
            let (deleting, digest) = (keys(retention.deleting), keys(retention.digest));
            write!(
                f,
                "\n       digests: deleting [{deleting}], table [{digest}], "
            )?;
            write!(f, "copies [{first}] [{second}]")?;
        }
        write!(f, "\n       ghost: {:?}", self.ghost)
    }
}

impl State {
    fn fmt_inbox(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\n       inbox:")?;
        for (key, record) in self.db.records.iter().enumerate() {
            let Some(record) = record else { continue };
            let status = match record.status {
                Status::Completed => "completed",
                Status::InProgress { lease_live: true } => "in progress, lease live",
                Status::InProgress { lease_live: false } => "in progress, lease lapsed",
            };
            let expired = if record.expired { ", expired" } else { "" };
            let (token, attempt) = (record.token, record.attempts);
            let key = name(key as u8);
            write!(
                f,
                " {key}: {status}{expired} (token {token}, attempt {attempt});"
            )?;
        }
        let markers = keys(self.db.markers);
        write!(f, " markers [{markers}]; effects {:?}", self.db.effects)
    }

    fn fmt_outbox(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.db.outbox.is_empty() {
            return Ok(());
        }
        write!(f, "\n       outbox:")?;
        for (seq, row) in self.db.outbox.iter().enumerate() {
            let to = match row.exchange {
                Exchange::Missing => " to the missing exchange",
                Exchange::Present => "",
            };
            let sent = if row.sent { ", sent" } else { "" };
            let held = if row.held.is_some() { ", held" } else { "" };
            let locked =
                (row.locked_by.map(|r| format!(", locked by relay {r}"))).unwrap_or_default();
            let (key, position) = (name(row.id.key), row.id.position);
            write!(f, " #{seq} {key}{position}{to}{sent}{held}{locked};")?;
        }
        Ok(())
    }

    fn fmt_workers(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (number, worker) in self.workers.iter().enumerate() {
            if worker.is_free() && self.db.txs[number].is_none() {
                continue;
            }
            write!(f, "\n       worker {number}: {:?}", worker.job)?;
            if let Some(tx) = &self.db.txs[number] {
                write!(f, ", transaction {tx:?}")?;
            }
            if !worker.later.is_empty() || !worker.settle.is_empty() {
                write!(
                    f,
                    ", later {:?}, to settle {:?}",
                    worker.later, worker.settle
                )?;
            }
        }
        Ok(())
    }
}

//! What one check covers: the processing mode, how many of each part, how many faults of each
//! kind the environment may inject, and which bugs are planted.

/// The most message keys a model has.
pub const MAX_KEYS: usize = 2;
/// The most consumer workers (each its own process).
pub const MAX_WORKERS: usize = 2;
/// The most outbox relays (each its own process).
pub const MAX_RELAYS: usize = 2;
/// The most messages a handler run stages.
pub const MAX_STAGED: usize = 2;

/// How the consumer's handler keeps its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Claim, handler and completion in one transaction (`Mode::Transactional`).
    Transactional,
    /// Claim with a lease, handler outside any transaction, completion fenced by the claim
    /// token (`Mode::TwoPhase`).
    TwoPhase,
    /// The business entity's unique key marks the message (`Mode::Entity`).
    Entity,
}

/// How a worker takes its deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Intake {
    /// One delivery at a time, through `Inbox::process`.
    PerMessage,
    /// Up to two deliveries in one transaction, through `Inbox::process_batch` (transactional
    /// handlers; the default, `BatchChecks::BeforeCommit`, and PostgreSQL's
    /// `BatchChecks::EachMessage`: unguarded first, then under savepoints).
    Batch,
}

/// How a relay treats a message whose exchange it holds back "on sight" (it refused the
/// exchange lately).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OnSight {
    /// As `idem-rabbitmq` did before (a planted bug now): the message is held back, with its
    /// run in the table, but the later messages of its run in the same batch that go to other
    /// exchanges are published in this round.
    PublishesRestOfRun,
    /// As `idem-rabbitmq` does (`relay::held::HoldMemory::sort`): the later messages of a run
    /// with a message held on sight wait with it.
    HoldsRestOfRun,
}

/// Bugs that can be planted in the model, to show that the checker finds what they break.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Bugs {
    /// A two-phase completion that does not compare the claim token (fencing): any claim in
    /// progress is completed.
    pub no_fencing: bool,
    /// The delivery acknowledged once the handler returned, before the transaction commits.
    pub ack_before_commit: bool,
    /// A batch whose unguarded try failed runs again under savepoints without rolling back
    /// what the first try wrote.
    pub rerun_without_rollback: bool,
    /// Staged message ids drawn afresh by every run instead of derived from (consumer, key,
    /// position).
    pub fresh_staged_ids: bool,
}

/// How many faults of each kind the environment may inject in one run of the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Faults {
    /// Crashes of a process (a worker, the cleaner's, a relay).
    pub crashes: u8,
    /// Extra copies of a message the producer publishes (its retries).
    pub duplicates: u8,
    /// Acknowledgments lost with their channel: the broker redelivers.
    pub lost_acks: u8,
    /// Handler failures (transient errors).
    pub handler_failures: u8,
    /// Transactions the database rolls back on its own (a deadlock's victim, an abort).
    pub rollbacks: u8,
    /// Leases that run out while their holder still runs (paused, or cut off from the database);
    /// the lease of a crashed holder runs out anyway.
    pub paused_holders: u8,
    /// Records that reach the end of their retention.
    pub expiries: u8,
}

/// One configuration of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Config {
    /// The consumer's mode.
    pub mode: Mode,
    /// How many message keys (one logical message each).
    pub keys: u8,
    /// How each worker takes its deliveries; its length is the number of workers.
    pub workers: [Option<Intake>; MAX_WORKERS],
    /// How many messages each handler run stages in the outbox (transactional and entity modes).
    pub staged: u8,
    /// How many relays publish the outbox.
    pub relays: u8,
    /// Whether the first staged message of a run goes to an exchange that does not exist at
    /// first (it is declared at some point).
    pub missing_exchange: bool,
    /// How relays treat a message to an exchange they hold back.
    pub on_sight: OnSight,
    /// Whether the cleaner runs (in worker 0's process).
    pub cleaner: bool,
    /// Takeovers after which a key needs intervention (two-phase `max_attempts`).
    pub max_attempts: u8,
    /// Counted failed deliveries after which a message is dead-lettered (`delivery-limit`).
    pub max_deliveries: u8,
    /// The faults the environment may inject.
    pub faults: Faults,
    /// The bugs planted.
    pub bugs: Bugs,
}

impl Config {
    /// A configuration with nothing but `keys` messages and one per-message worker in `mode`,
    /// no fault, no outbox, no cleaner: the base the checks add to.
    pub fn new(mode: Mode, keys: u8) -> Self {
        assert!((1..=MAX_KEYS as u8).contains(&keys), "1 to {MAX_KEYS} keys");
        Self {
            mode,
            keys,
            workers: [Some(Intake::PerMessage), None],
            staged: 0,
            relays: 0,
            missing_exchange: false,
            on_sight: OnSight::HoldsRestOfRun,
            cleaner: false,
            max_attempts: 2,
            max_deliveries: 3,
            faults: Faults::default(),
            bugs: Bugs::default(),
        }
    }

    /// The same with these workers.
    pub fn workers(mut self, workers: &[Intake]) -> Self {
        assert!(
            (1..=MAX_WORKERS).contains(&workers.len()),
            "1 to {MAX_WORKERS} workers"
        );
        self.workers = [None; MAX_WORKERS];
        for (slot, intake) in self.workers.iter_mut().zip(workers) {
            *slot = Some(*intake);
        }
        self
    }

    /// The same, each handler run staging `staged` messages, published by `relays` relays.
    pub fn outbox(mut self, staged: u8, relays: u8) -> Self {
        assert!(staged as usize <= MAX_STAGED && relays as usize <= MAX_RELAYS);
        self.staged = staged;
        self.relays = relays;
        self
    }

    /// The same with the cleaner running.
    pub fn cleaner(mut self) -> Self {
        self.cleaner = true;
        self
    }

    /// The same with these faults.
    pub fn faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// The same with these bugs planted.
    pub fn bugs(mut self, bugs: Bugs) -> Self {
        self.bugs = bugs;
        self
    }

    /// The number of workers.
    pub fn worker_count(&self) -> usize {
        self.workers.iter().flatten().count()
    }

    /// The key indices.
    pub fn keys(&self) -> impl Iterator<Item = usize> + use<> {
        0..self.keys as usize
    }
}

/// idem's protocol under one [`Config`].
#[derive(Debug, Clone)]
pub struct IdemModel {
    /// What the model covers.
    pub config: Config,
    /// Also check the strict form of the late-duplicates property, which idem does not meet
    /// (see [`crate::properties::LATE_ALWAYS_COUNTED`]).
    pub strict: bool,
}

impl IdemModel {
    /// The model of `config`, checked for idem's properties.
    pub fn new(config: Config) -> Self {
        Self {
            config,
            strict: false,
        }
    }

    /// The same, also checked for the strict form of the late-duplicates property.
    pub fn strict(config: Config) -> Self {
        Self {
            config,
            strict: true,
        }
    }
}

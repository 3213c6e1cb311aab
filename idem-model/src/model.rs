//! The model: which actions each part of the system and its environment can take in a state,
//! and what each does.

use std::fmt;

use crate::batch::batch_blocked;
use crate::broker::Verdict;
use crate::checker::{Model, Property};
use crate::config::{IdemModel, Intake, Mode};
use crate::db::Status;
use crate::inbox::blocked;
use crate::outbox::takeable;
use crate::properties;
use crate::state::{Fate, Job, State, Step};
use crate::two_phase::HandlerRun;

/// A process that can crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Process {
    /// A consumer worker's (worker 0's also runs the cleaner).
    Worker(u8),
    /// A relay's.
    Relay(u8),
}

/// One step of the system or its environment. Each names, in its doc, the code of idem it
/// stands for.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// The producer publishes another copy of a message (its retry): at-least-once delivery.
    Duplicate(u8),
    /// The broker delivers a copy of `key` to a per-message worker:
    /// `idem_rabbitmq::consumer::worker` hands it to `idem_rabbitmq::consumer::job`.
    Deliver(u8, u8),
    /// The broker delivers copies to a batch worker, gathered into one batch:
    /// `idem_rabbitmq::consumer::gather`, then `idem_runtime::inbox::batch::fates::sort_out`.
    DeliverBatch(u8, Vec<u8>),
    /// The worker claims its key: in the transaction it begins
    /// (`idem_runtime::inbox::Inbox::transactional`, `idem_runtime::inbox::claim::claim`), or
    /// with a lease, committed at once (`idem_runtime::inbox::two_phase::Inbox::two_phase`).
    Claim(u8),
    /// The worker's claim waited for another transaction's lock past the claim wait:
    /// `idem_runtime::inbox::claim::lock_wait_ran_out` (a batch's:
    /// `idem_runtime::inbox::batch::claims::Inbox::claim_batch`; an entity's marker:
    /// `idem_runtime::entity::Context::create`).
    ClaimWaitRunsOut(u8),
    /// Entity mode: the handler runs and creates its marker entity
    /// (`idem_runtime::inbox::unrecorded::Inbox::entity`, `idem_runtime::entity::Context::create`);
    /// `false`: it fails.
    Create(u8, bool),
    /// The handler runs in the transaction (`idem_runtime::inbox::run`), staging through
    /// `idem_runtime::outbox::Outbound::stage`; `false`: it fails.
    Handle(u8, bool),
    /// A two-phase handler runs (`idem_runtime::inbox::run`), calling downstream with
    /// `idem_runtime::outbox::Outbound::downstream_key`; a failure gives the claim up
    /// (`idem_runtime::inbox::two_phase::Inbox::give_up`).
    HandleWithLease(u8, HandlerRun),
    /// The run's last statement and its commit: `idem_runtime::store::Store::complete` and
    /// `idem_runtime::inbox::Inbox::commit` (entity mode: the marker read back in
    /// `idem_runtime::inbox::unrecorded::Inbox::entity`).
    Commit(u8),
    /// The planted bug: acknowledge before the commit.
    AckEarly(u8),
    /// The two-phase claim's lease is renewed: `idem_runtime::inbox::renewal::renew_until_lost`,
    /// `idem_runtime::store::Store::renew`.
    Renew(u8),
    /// The two-phase completion: `idem_runtime::inbox::completion::complete_while_held`,
    /// `idem_runtime::store::Store::complete`.
    Complete(u8),
    /// A batch's try claims its keys: `idem_runtime::inbox::batch::claims::Inbox::claim_batch`.
    BatchClaim(u8),
    /// A batch's next fresh handler runs: `idem_runtime::inbox::batch::guard::Unguarded::run`
    /// (then `idem_runtime::inbox::batch::attempt::Inbox::transact` runs again under
    /// `idem_runtime::inbox::batch::guard::Savepoints::run`); `false`: it fails.
    BatchHandle(u8, bool),
    /// A batch's try ends, releases, completions and commit
    /// (`idem_runtime::inbox::batch::finish::Inbox::finish`), and each message gets its result
    /// (`idem_runtime::inbox::batch::Inbox::conclude`).
    BatchFinish(u8),
    /// The worker settles its first decided delivery
    /// (`idem_rabbitmq::consumer::settle::Settler::settle`, the verdict from
    /// `idem_runtime::Error::settle` and `idem_runtime::transport::DeliveryPolicy::decide`);
    /// `true`: the ack is lost with its channel.
    Settle(u8, bool),
    /// A process crashes (and starts again, empty-handed).
    Crash(Process),
    /// The database rolls the worker's transaction back (a deadlock's victim, an abort).
    RollBack(u8),
    /// A two-phase lease runs out by the database's clock (`lease_until <= now` in
    /// `idem_runtime::store::Store::take_over`).
    LeaseRunsOut(u8),
    /// A record reaches the end of its retention (`expires_at <= now`).
    RecordExpires(u8),
    /// The cleaner deletes an expired record:
    /// `idem_runtime::retention::cleaner::Cleaner::delete_batches`,
    /// `idem_runtime::store::Store::delete_expired`.
    CleanerDeletes(u8),
    /// The cleaner's run writes its digest of deleted keys:
    /// `idem_runtime::telemetry::Telemetry::record_deleted`.
    CleanerWritesDigest,
    /// A worker's process reads the digests back: `idem_runtime::telemetry::Telemetry::sync`.
    ReadsDigest(u8),
    /// A relay takes a batch: `idem_runtime::outbox::Outbox::take_pending_after` (with
    /// `PendingBatch::keep_runs_in_order`), then `idem_rabbitmq::relay::held::HoldMemory::sort`.
    RelayTakes(u8),
    /// A relay publishes its next message, of this seq: `idem_rabbitmq::relay::pipeline::publish`
    /// (a refused exchange: `idem_rabbitmq::relay::held::HoldMemory::channel_closed`).
    RelayPublishes(u8, u8),
    /// A relay writes its holds and marks what was confirmed sent:
    /// `idem_rabbitmq::relay::run::Runner::publish_batch`,
    /// `idem_runtime::outbox::PendingBatch::mark_sent`.
    RelayMarksSent(u8),
    /// The holds in the outbox table run out: `idem_runtime::outbox::Outbox::release_holds`.
    HoldsRunOut,
    /// A relay's memory of the held exchange runs out (its `until` in
    /// `idem_rabbitmq::relay::held::HoldMemory`).
    RelayForgetsHold(u8),
    /// The missing exchange is declared.
    ExchangeDeclared,
}

impl fmt::Debug for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = |k: &u8| (b'a' + k) as char;
        match self {
            Action::Duplicate(k) => write!(f, "producer publishes another copy of {}", key(k)),
            Action::Deliver(w, k) => write!(f, "worker {w} receives {}", key(k)),
            Action::DeliverBatch(w, keys) => {
                let keys: String = keys.iter().map(key).collect();
                write!(f, "batch worker {w} receives [{keys}]")
            }
            Action::Claim(w) => write!(f, "worker {w} claims"),
            Action::ClaimWaitRunsOut(w) => write!(f, "worker {w}'s claim wait runs out"),
            Action::Create(w, ok) => write!(f, "worker {w} runs its entity handler (ok: {ok})"),
            Action::Handle(w, ok) => write!(f, "worker {w} runs its handler (ok: {ok})"),
            Action::HandleWithLease(w, run) => write!(f, "worker {w} runs its handler: {run:?}"),
            Action::Commit(w) => write!(f, "worker {w} completes and commits"),
            Action::AckEarly(w) => write!(f, "worker {w} acknowledges before committing"),
            Action::Renew(w) => write!(f, "worker {w} renews its lease"),
            Action::Complete(w) => write!(f, "worker {w} completes its claim"),
            Action::BatchClaim(w) => write!(f, "batch worker {w} claims its keys"),
            Action::BatchHandle(w, ok) => write!(f, "batch worker {w} runs a handler (ok: {ok})"),
            Action::BatchFinish(w) => write!(f, "batch worker {w} completes and commits"),
            Action::Settle(w, lost) => {
                write!(
                    f,
                    "worker {w} settles a delivery{}",
                    if *lost { " (ack lost)" } else { "" }
                )
            }
            Action::Crash(Process::Worker(w)) => write!(f, "worker {w}'s process crashes"),
            Action::Crash(Process::Relay(r)) => write!(f, "relay {r} crashes"),
            Action::RollBack(w) => write!(f, "the database rolls back worker {w}'s transaction"),
            Action::LeaseRunsOut(k) => write!(f, "the lease on {} runs out", key(k)),
            Action::RecordExpires(k) => write!(f, "the record of {} expires", key(k)),
            Action::CleanerDeletes(k) => write!(f, "the cleaner deletes the record of {}", key(k)),
            Action::CleanerWritesDigest => write!(f, "the cleaner writes its digest"),
            Action::ReadsDigest(w) => write!(f, "worker {w}'s process reads the digests"),
            Action::RelayTakes(r) => write!(f, "relay {r} takes a batch"),
            Action::RelayPublishes(r, seq) => write!(f, "relay {r} publishes #{seq}"),
            Action::RelayMarksSent(r) => write!(f, "relay {r} marks sent"),
            Action::HoldsRunOut => write!(f, "the outbox holds run out"),
            Action::RelayForgetsHold(r) => write!(f, "relay {r}'s hold of the exchange runs out"),
            Action::ExchangeDeclared => write!(f, "the missing exchange is declared"),
        }
    }
}

impl IdemModel {
    fn worker_actions(&self, state: &State, worker: usize, actions: &mut Vec<Action>) {
        let Some(intake) = self.config.workers[worker] else {
            return;
        };
        if state.workers[worker].is_free() {
            deliveries(state, worker as u8, intake, actions);
        }
        self.job_actions(state, worker, actions);
        fault_actions(state, worker, actions);
    }

    /// The next step of `worker`'s job, and the settling of what it decided.
    fn job_actions(&self, state: &State, worker: usize, actions: &mut Vec<Action>) {
        let config = &self.config;
        let w = worker as u8;
        let held = &state.workers[worker];
        let failures = state.budget.handler_failures > 0;
        match &held.job {
            Job::Idle => {}
            Job::Message { key, step } => match (config.mode, step) {
                (_, Step::Claim) if blocked(state, config, worker, *key) => {
                    actions.push(Action::ClaimWaitRunsOut(w));
                }
                (Mode::Entity, Step::Claim) => {
                    actions.push(Action::Create(w, true));
                    if failures {
                        actions.push(Action::Create(w, false));
                    }
                }
                (_, Step::Claim) => actions.push(Action::Claim(w)),
                (_, Step::InTransaction { handled: false, .. }) => {
                    actions.push(Action::Handle(w, true));
                    if failures {
                        actions.push(Action::Handle(w, false));
                    }
                }
                (_, Step::InTransaction { acked, .. }) => {
                    if config.bugs.ack_before_commit && !acked {
                        actions.push(Action::AckEarly(w));
                    } else {
                        actions.push(Action::Commit(w));
                    }
                }
                (
                    _,
                    Step::Holding {
                        token, returned, ..
                    },
                ) => {
                    holding_actions(state, w, *key, *token, *returned, actions);
                }
            },
            Job::Batch(batch) => {
                if !batch.claimed && batch_blocked(state, worker, batch) {
                    actions.push(Action::ClaimWaitRunsOut(w));
                } else if !batch.claimed {
                    actions.push(Action::BatchClaim(w));
                } else if batch.leads.iter().any(|lead| lead.fate == Fate::Fresh) {
                    actions.push(Action::BatchHandle(w, true));
                    if failures {
                        actions.push(Action::BatchHandle(w, false));
                    }
                } else {
                    actions.push(Action::BatchFinish(w));
                }
            }
        }
        if held.job == Job::Idle
            && held.later.is_empty()
            && let Some((_, verdict)) = held.settle.first()
        {
            actions.push(Action::Settle(w, false));
            let acks = !matches!(verdict, Verdict::Requeue { .. });
            if acks && state.budget.lost_acks > 0 {
                actions.push(Action::Settle(w, true));
            }
        }
    }

    fn relay_actions(&self, state: &State, relay: usize, actions: &mut Vec<Action>) {
        let r = relay as u8;
        let round = &state.relays[relay];
        if !round.busy {
            if !takeable(state).is_empty() {
                actions.push(Action::RelayTakes(r));
            }
        } else if !round.closed && !round.publishable.is_empty() {
            actions.push(Action::RelayPublishes(r, round.publishable[0]));
        } else {
            actions.push(Action::RelayMarksSent(r));
        }
        if round.holds_exchange && !round.busy {
            actions.push(Action::RelayForgetsHold(r));
        }
        if state.budget.crashes > 0 && (round.busy || round.holds_exchange) {
            actions.push(Action::Crash(Process::Relay(r)));
        }
    }

    fn environment_actions(&self, state: &State, actions: &mut Vec<Action>) {
        let config = &self.config;
        for key in config.keys() {
            let k = key as u8;
            if state.budget.duplicates > 0 {
                actions.push(Action::Duplicate(k));
            }
            if let Some(record) = state.db.records[key] {
                let live = record.status == (Status::InProgress { lease_live: true });
                if live && (!state.holder_runs(k) || state.budget.paused_holders > 0) {
                    actions.push(Action::LeaseRunsOut(k));
                }
            }
            if state.budget.expiries > 0 && state.can_expire(k) {
                actions.push(Action::RecordExpires(k));
            }
            if config.cleaner && state.can_clean(k) {
                actions.push(Action::CleanerDeletes(k));
            }
        }
        if state.retention.deleting != 0 {
            actions.push(Action::CleanerWritesDigest);
        }
        if state.db.outbox.iter().any(|row| row.held.is_some()) {
            actions.push(Action::HoldsRunOut);
        }
        if state.exchange_missing {
            actions.push(Action::ExchangeDeclared);
        }
    }
}

/// The deliveries the broker can make to a free `worker`.
fn deliveries(state: &State, w: u8, intake: Intake, actions: &mut Vec<Action>) {
    let keys: Vec<u8> = state.broker.ready_keys().collect();
    match intake {
        Intake::PerMessage => actions.extend(keys.iter().map(|key| Action::Deliver(w, *key))),
        Intake::Batch => {
            for (at, first) in keys.iter().enumerate() {
                actions.push(Action::DeliverBatch(w, vec![*first]));
                let copies = state.broker.ready.iter().filter(|k| *k == first).count();
                if copies > 1 {
                    actions.push(Action::DeliverBatch(w, vec![*first, *first]));
                }
                for second in &keys[at + 1..] {
                    actions.push(Action::DeliverBatch(w, vec![*first, *second]));
                }
            }
        }
    }
}

/// What a two-phase worker holding the claim `token` on `key` can do.
fn holding_actions(
    state: &State,
    w: u8,
    key: u8,
    token: u8,
    returned: bool,
    actions: &mut Vec<Action>,
) {
    if returned {
        actions.push(Action::Complete(w));
    } else {
        actions.push(Action::HandleWithLease(w, HandlerRun::Returns));
        if state.budget.handler_failures > 0 {
            actions.push(Action::HandleWithLease(w, HandlerRun::Fails));
            actions.push(Action::HandleWithLease(w, HandlerRun::CallsThenFails));
        }
    }
    let lapsed = state.db.records[key as usize].is_some_and(|record| {
        record.token == token && record.status == (Status::InProgress { lease_live: false })
    });
    if lapsed {
        actions.push(Action::Renew(w));
    }
}

/// The faults that can strike `worker`, and its process's reading of the digests.
fn fault_actions(state: &State, worker: usize, actions: &mut Vec<Action>) {
    let w = worker as u8;
    let open = state.db.txs[worker].as_ref();
    if state.budget.rollbacks > 0 && open.is_some_and(|tx| !tx.aborted) {
        actions.push(Action::RollBack(w));
    }
    let retention = &state.retention;
    let loses = !state.workers[worker].is_free()
        || open.is_some()
        || retention.copies[worker] != 0
        || (worker == 0 && retention.deleting != 0);
    if state.budget.crashes > 0 && loses {
        actions.push(Action::Crash(Process::Worker(w)));
    }
    if retention.copies[worker] | retention.digest != retention.copies[worker] {
        actions.push(Action::ReadsDigest(w));
    }
}

impl Model for IdemModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State::initial(&self.config)]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for worker in 0..self.config.worker_count() {
            self.worker_actions(state, worker, actions);
        }
        for relay in 0..self.config.relays as usize {
            self.relay_actions(state, relay, actions);
        }
        self.environment_actions(state, actions);
    }

    fn next_state(&self, state: &State, action: &Action) -> Option<State> {
        let config = &self.config;
        let mut next = state.clone();
        let key_of = |worker: u8| match &state.workers[worker as usize].job {
            Job::Message { key, .. } => *key,
            _ => unreachable!("a per-message job"),
        };
        match action {
            Action::Duplicate(key) => {
                next.budget.duplicates -= 1;
                next.broker.enqueue(*key);
            }
            Action::Deliver(worker, key) => {
                next.broker.take(*key);
                next.workers[*worker as usize].job = Job::Message {
                    key: *key,
                    step: Step::Claim,
                };
            }
            Action::DeliverBatch(worker, keys) => next.take_batch(*worker as usize, keys),
            Action::Claim(worker) => {
                let (worker, key) = (*worker as usize, key_of(*worker));
                match config.mode {
                    Mode::TwoPhase => next.claim_with_lease(config, worker, key),
                    _ => next.claim_in_transaction(config, worker, key),
                }
            }
            Action::ClaimWaitRunsOut(worker) => match &state.workers[*worker as usize].job {
                Job::Batch(_) => next.batch_wait_runs_out(*worker as usize),
                _ => next.claim_wait_runs_out(*worker as usize, key_of(*worker)),
            },
            Action::Create(worker, ok) => {
                next.create_marker(config, *worker as usize, key_of(*worker), *ok);
            }
            Action::Handle(worker, ok) => {
                next.handle_in_transaction(config, *worker as usize, key_of(*worker), *ok);
            }
            Action::HandleWithLease(worker, run) => {
                next.handle_with_lease(config, *worker as usize, key_of(*worker), *run);
            }
            Action::Commit(worker) => next.commit_run(*worker as usize, key_of(*worker)),
            Action::AckEarly(worker) => next.ack_early(*worker as usize, key_of(*worker)),
            Action::Renew(worker) => next.renew(*worker as usize, key_of(*worker)),
            Action::Complete(worker) => next.complete(config, *worker as usize, key_of(*worker)),
            Action::BatchClaim(worker) => next.claim_batch(*worker as usize),
            Action::BatchHandle(worker, ok) => next.handle_in_batch(config, *worker as usize, *ok),
            Action::BatchFinish(worker) => next.finish_batch(*worker as usize),
            Action::Settle(worker, lost) => next.settle(config, *worker as usize, *lost),
            Action::Crash(process) => {
                next.budget.crashes -= 1;
                match *process {
                    Process::Worker(worker) => next.worker_crashes(worker as usize),
                    Process::Relay(relay) => next.relay_crashes(relay as usize),
                }
            }
            Action::RollBack(worker) => {
                next.budget.rollbacks -= 1;
                next.db.abort(*worker as usize);
            }
            Action::LeaseRunsOut(key) => next.lease_runs_out(*key),
            Action::RecordExpires(key) => next.record_expires(*key),
            Action::CleanerDeletes(key) => next.cleaner_deletes(*key),
            Action::CleanerWritesDigest => next.cleaner_writes_digest(),
            Action::ReadsDigest(worker) => next.reads_digest(*worker as usize),
            Action::RelayTakes(relay) => next.relay_takes(config, *relay as usize),
            Action::RelayPublishes(relay, _) => next.relay_publishes(*relay as usize),
            Action::RelayMarksSent(relay) => next.relay_marks_sent(*relay as usize),
            Action::HoldsRunOut => next.holds_run_out(),
            Action::RelayForgetsHold(relay) => next.relays[*relay as usize].holds_exchange = false,
            Action::ExchangeDeclared => next.exchange_missing = false,
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::of(self)
    }
}

impl State {
    /// A worker's process crashes: its transaction rolls back, the broker redelivers every
    /// delivery it held, its two-phase claims stay until their leases run out; worker 0's
    /// cleaner run ends before writing its digest, and the process's copy of the digests is
    /// gone until it reads them again.
    pub fn worker_crashes(&mut self, worker: usize) {
        self.db.txs[worker] = None;
        self.give_back(worker);
        self.retention.copies[worker] = 0;
        if worker == 0 {
            self.retention.deleting = 0;
        }
    }
}

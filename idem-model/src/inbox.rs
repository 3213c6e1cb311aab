//! The per-message path of transactional and entity modes, the claim every inbox mode shares,
//! and settling a delivery.

use crate::broker::{Reason, Verdict};
use crate::config::{Config, Mode};
use crate::db::{Record, Status, Tx, bit};
use crate::outbox;
use crate::state::{Job, State, Step};

/// What a claim of a key finds (`idem-runtime/src/inbox/claim.rs`, `claim` and
/// `take_over_or_report`). The claim's statements (an insert, a read, a conditional takeover,
/// retried when the record changes under them) behave as one atomic step: the takeover is a
/// compare-and-swap on the record's token, and a claim that keeps losing races is reported as
/// in progress elsewhere, which the model covers by `Elsewhere`'s other causes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimed {
    /// Another transaction holds the key: the claim waits (at most the claim wait).
    Blocked,
    /// A completed, live record: the message is a duplicate.
    Duplicate,
    /// A two-phase claim with a live lease holds the key (`InProgressElsewhere`).
    Elsewhere,
    /// Lapsed leases were taken over `max_attempts` times (`NeedsIntervention`).
    NeedsIntervention,
    /// The key is this worker's, as the `attempt`-th claim.
    Acquired {
        /// What was there before.
        before: Before,
        /// The claim's attempt number.
        attempt: u8,
    },
}

/// What a claim replaced (`idem-runtime/src/telemetry/mod.rs`, `Before`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Before {
    /// No record: a new key, or one whose record was deleted.
    Nothing,
    /// A record past its retention, `completed` or an abandoned claim.
    Expired {
        /// Whether it was completed.
        completed: bool,
    },
    /// A claim whose lease ran out.
    Attempt,
}

/// What `worker`'s claim of `key` finds now.
pub fn claim(state: &State, config: &Config, worker: usize, key: usize) -> Claimed {
    if state.db.locked_by_other(key, worker) {
        return Claimed::Blocked;
    }
    let Some(record) = state.db.records[key] else {
        return Claimed::Acquired {
            before: Before::Nothing,
            attempt: 1,
        };
    };
    if record.expired {
        let completed = record.status == Status::Completed;
        return Claimed::Acquired {
            before: Before::Expired { completed },
            attempt: 1,
        };
    }
    match record.status {
        Status::Completed => Claimed::Duplicate,
        Status::InProgress { lease_live: true } => Claimed::Elsewhere,
        Status::InProgress { lease_live: false } if record.attempts >= config.max_attempts => {
            Claimed::NeedsIntervention
        }
        Status::InProgress { lease_live: false } => Claimed::Acquired {
            before: Before::Attempt,
            attempt: record.attempts + 1,
        },
    }
}

/// The verdict of a claim that did not acquire the key.
pub fn refused(claimed: Claimed) -> Verdict {
    match claimed {
        Claimed::Duplicate => Verdict::Ack { duplicate: true },
        Claimed::NeedsIntervention => Verdict::DeadLetter(Reason::NeedsIntervention),
        // Not the message's fault: not counted.
        Claimed::Blocked | Claimed::Elsewhere => Verdict::Requeue { counted: false },
        Claimed::Acquired { .. } => unreachable!("acquired"),
    }
}

impl State {
    /// `worker` decided `verdict` for its delivery of `key`; it goes on with a delivery a
    /// batch left for later, if any.
    pub fn decided(&mut self, worker: usize, key: u8, verdict: Option<Verdict>) {
        let held = &mut self.workers[worker];
        if let Some(verdict) = verdict {
            held.settle.push((key, verdict));
        }
        held.job = Job::Idle;
        if !held.later.is_empty() {
            let key = held.later.remove(0);
            held.job = Job::Message {
                key,
                step: Step::Claim,
            };
        }
    }

    /// Transactional mode: `Inbox::transactional` begins the transaction and claims the key
    /// in it (`inbox::claim::claim`).
    pub fn claim_in_transaction(&mut self, config: &Config, worker: usize, key: u8) {
        let claimed = claim(self, config, worker, key as usize);
        let Claimed::Acquired { before, attempt } = claimed else {
            self.decided(worker, key, Some(refused(claimed)));
            return;
        };
        self.note_claim(worker, key as usize, before);
        let token = self.db.new_token(key as usize);
        self.db.txs[worker] = Some(Tx {
            claims: vec![(key, Record::claim(token, attempt, false))],
            ..Tx::default()
        });
        self.set_step(
            worker,
            Step::InTransaction {
                handled: false,
                acked: false,
            },
        );
    }

    /// Transactional mode: the handler runs in the claim's transaction
    /// (`inbox::run`), writing its effect and staging its messages (`Outbound::stage`); or it
    /// fails, and the transaction is dropped (rolled back).
    pub fn handle_in_transaction(&mut self, config: &Config, worker: usize, key: u8, ok: bool) {
        // A transaction the database rolled back fails the handler's first statement.
        if self.db.aborted(worker) || !ok {
            if !ok {
                self.budget.handler_failures -= 1;
            }
            self.db.txs[worker] = None;
            self.decided(worker, key, Some(Verdict::Requeue { counted: true }));
            return;
        }
        let token = self.db.tx(worker).claims[0].1.token;
        let tx = self.db.tx(worker);
        tx.effects.push(key);
        outbox::stage(config, tx, key, token);
        self.set_step(
            worker,
            Step::InTransaction {
                handled: true,
                acked: false,
            },
        );
    }

    /// Transactional and entity modes: the run's last statement (`Store::complete` on the
    /// claim, or the marker read back) and the commit (`Inbox::commit`); a transaction the
    /// database rolled back is found there (`TransactionAborted`).
    pub fn commit_run(&mut self, worker: usize, key: u8) {
        let Job::Message {
            step: Step::InTransaction { acked, .. },
            ..
        } = self.workers[worker].job
        else {
            unreachable!("a run in a transaction")
        };
        if self.db.aborted(worker) {
            self.db.txs[worker] = None;
            let verdict = (!acked).then_some(Verdict::Requeue { counted: true });
            self.decided(worker, key, verdict);
            return;
        }
        for (_, record) in &mut self.db.tx(worker).claims {
            record.status = Status::Completed;
        }
        self.commit(worker);
        let verdict = (!acked).then_some(Verdict::Ack { duplicate: false });
        self.decided(worker, key, verdict);
    }

    /// The planted bug: the delivery acknowledged once the handler returned, before the commit.
    pub fn ack_early(&mut self, worker: usize, key: u8) {
        self.acknowledged(key, false);
        self.set_step(
            worker,
            Step::InTransaction {
                handled: true,
                acked: true,
            },
        );
    }

    /// Entity mode: `Inbox::entity` begins the transaction and the handler runs, creating its
    /// marker entity first (`Context::create`: an insert that waits for an uncommitted one of
    /// the same key); a marker already there is a duplicate, and the run rolls back.
    pub fn create_marker(&mut self, config: &Config, worker: usize, key: u8, ok: bool) {
        if self.db.markers & bit(key as usize) != 0 {
            self.decided(worker, key, Some(Verdict::Ack { duplicate: true }));
            return;
        }
        if !ok {
            self.budget.handler_failures -= 1;
            self.decided(worker, key, Some(Verdict::Requeue { counted: true }));
            return;
        }
        let mut tx = Tx {
            markers: bit(key as usize),
            effects: vec![key],
            ..Tx::default()
        };
        outbox::stage(config, &mut tx, key, 0);
        self.db.txs[worker] = Some(tx);
        self.set_step(
            worker,
            Step::InTransaction {
                handled: true,
                acked: false,
            },
        );
    }

    /// A claim (or marker) that waited for another transaction's lock past the claim wait:
    /// in progress elsewhere, requeued uncounted (`claim::lock_wait_ran_out`).
    pub fn claim_wait_runs_out(&mut self, worker: usize, key: u8) {
        self.decided(worker, key, Some(Verdict::Requeue { counted: false }));
    }

    /// Settles `worker`'s first decided delivery on the broker (`Settler::settle`); with
    /// `lost`, the acknowledgment is lost with its channel, and the broker delivers the message
    /// again.
    pub fn settle(&mut self, config: &Config, worker: usize, lost: bool) {
        let (key, verdict) = self.workers[worker].settle.remove(0);
        if lost {
            self.budget.lost_acks -= 1;
            self.broker.enqueue(key);
            return;
        }
        match verdict {
            Verdict::Ack { duplicate } => self.acknowledged(key, duplicate),
            Verdict::Requeue { counted } => {
                if !self.broker.requeue(key, counted, config.max_deliveries) {
                    self.dead_lettered(key);
                }
            }
            Verdict::DeadLetter(_) => self.dead_lettered(key),
        }
    }

    /// A delivery of `key` acknowledged (not dead-lettered).
    fn acknowledged(&mut self, key: u8, duplicate: bool) {
        if self.ghost.committed & bit(key as usize) == 0 {
            self.ghost.acked_too_early = true;
        }
        self.ghost.seen.duplicate_acked |= duplicate;
    }

    /// A copy of `key` put in the dead-letter queue, the delivery acknowledged.
    fn dead_lettered(&mut self, key: u8) {
        self.broker.dead_letter(key);
        self.ghost.seen.dead_lettered = true;
    }

    /// Moves `worker`'s per-message job to `step`.
    pub fn set_step(&mut self, worker: usize, step: Step) {
        let Job::Message { step: current, .. } = &mut self.workers[worker].job else {
            unreachable!("a per-message job")
        };
        *current = step;
    }
}

/// Whether a per-message claim by `worker` of `key` would wait for another transaction.
pub fn blocked(state: &State, config: &Config, worker: usize, key: u8) -> bool {
    match config.mode {
        Mode::Transactional => claim(state, config, worker, key as usize) == Claimed::Blocked,
        Mode::Entity => state.db.locked_by_other(key as usize, worker),
        // Its claim commits on its own, never inside another's transaction.
        Mode::TwoPhase => false,
    }
}

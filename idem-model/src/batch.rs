//! Batches (`idem-runtime/src/inbox/batch/`): up to two deliveries in one transaction, their
//! keys claimed in one statement, the fresh messages' handlers run unguarded first (the
//! optimistic path); when one fails, the transaction is rolled back and the others run again,
//! each under a savepoint, so that one bad message sinks nobody.

use crate::broker::Verdict;
use crate::config::Config;
use crate::db::{Record, Status, Tx};
use crate::inbox::Before;
use crate::outbox;
use crate::state::{Batch, Fate, Job, Lead, State};

impl State {
    /// A batch worker takes the ready copies of `keys` (`consumer/gather.rs`) and sorts them
    /// into leads, one per key in key order, and repeats (`batch::fates::sort_out`).
    pub fn take_batch(&mut self, worker: usize, keys: &[u8]) {
        let mut batch = Batch {
            leads: Vec::new(),
            repeats: Vec::new(),
            guarded: false,
            claimed: false,
        };
        for &key in keys {
            assert!(self.broker.take(key), "a ready copy");
            if batch.leads.iter().any(|lead| lead.key == key) {
                batch.repeats.push(key);
            } else {
                batch.leads.push(Lead {
                    key,
                    fate: Fate::Unclaimed,
                    failed_alone: false,
                });
            }
        }
        batch.leads.sort_by_key(|lead| lead.key);
        self.workers[worker].job = Job::Batch(batch);
    }

    /// A try begins (`Inbox::claim_batch`): the transaction, every lead's key claimed in one
    /// statement (fresh where no record is), the known ones read: a completed, live record is
    /// a duplicate, anything else (an expired record) is left for the per-message path.
    pub fn claim_batch(&mut self, worker: usize) {
        let mut tx = Tx::default();
        let mut fresh = Vec::new();
        let mut leads = std::mem::take(&mut self.batch(worker).leads);
        for lead in leads.iter_mut().filter(|lead| !lead.failed_alone) {
            let key = lead.key as usize;
            lead.fate = match self.db.records[key] {
                None => {
                    let token = self.db.new_token(key);
                    tx.claims.push((lead.key, Record::claim(token, 1, false)));
                    fresh.push(key);
                    Fate::Fresh
                }
                Some(record) if record.status == Status::Completed && !record.expired => {
                    Fate::Duplicate
                }
                Some(_) => Fate::Deferred,
            };
        }
        let batch = self.batch(worker);
        batch.leads = leads;
        batch.claimed = true;
        self.db.txs[worker] = Some(tx);
        for key in fresh {
            self.note_claim(worker, key, Before::Nothing);
        }
    }

    /// The claims waited for another transaction past the claim wait: every lead goes the
    /// per-message way (`claim_batch`'s `LockTimeout`).
    pub fn batch_wait_runs_out(&mut self, worker: usize) {
        for lead in self.batch(worker).leads.iter_mut() {
            if !lead.failed_alone {
                lead.fate = Fate::Deferred;
            }
        }
        self.conclude_batch(worker);
    }

    /// The next fresh lead's handler runs in the batch's transaction (`guard::handle`):
    /// unguarded, a failure rolls the try back and the others run again under savepoints
    /// (`Unguarded::run`, `Inbox::transact`); under a savepoint, it is rolled back alone
    /// (`Savepoints::run`).
    pub fn handle_in_batch(&mut self, config: &Config, worker: usize, ok: bool) {
        let aborted = self.db.aborted(worker);
        let guarded = self.batch(worker).guarded;
        if aborted && guarded {
            // The savepoint statement fails: the transaction is lost under a handler.
            self.lose_batch(worker);
            return;
        }
        let batch = self.batch(worker);
        let at = (batch.leads.iter())
            .position(|lead| lead.fate == Fate::Fresh)
            .expect("a fresh lead");
        let key = batch.leads[at].key;
        if ok && !aborted {
            let token = self.db.tx(worker).claims.iter().find(|(k, _)| *k == key);
            let token = token.expect("a fresh lead's claim").1.token;
            let tx = self.db.tx(worker);
            tx.effects.push(key);
            outbox::stage(config, tx, key, token);
            self.batch(worker).leads[at].fate = Fate::Processed;
            return;
        }
        if !ok {
            self.budget.handler_failures -= 1;
        }
        // The handler failed, or found the transaction aborted (`TransactionAborted`).
        let failed = Fate::Failed(Verdict::Requeue { counted: true });
        if guarded {
            self.batch(worker).leads[at].fate = failed;
            self.db.tx(worker).roll_back_handler(key);
            return;
        }
        self.ghost.seen.rerun = true;
        let lead = &mut self.batch(worker).leads[at];
        lead.fate = failed;
        lead.failed_alone = true;
        let batch = self.batch(worker);
        batch.guarded = true;
        if config.bugs.rerun_without_rollback {
            // The handlers that ran go again in the same transaction, their writes kept.
            for lead in &mut batch.leads {
                if lead.fate == Fate::Processed {
                    lead.fate = Fate::Fresh;
                }
            }
            return;
        }
        // `lost::roll_back`, then a new try without the culprit.
        batch.claimed = false;
        for lead in batch.leads.iter_mut().filter(|lead| !lead.failed_alone) {
            lead.fate = Fate::Unclaimed;
        }
        self.db.txs[worker] = None;
    }

    /// The try ends (`Inbox::finish`): the failed leads' claims released, the processed ones
    /// completed in one statement, one commit. A transaction the database rolled back shows as
    /// fewer completions than claims: the batch is lost.
    pub fn finish_batch(&mut self, worker: usize) {
        if self.db.aborted(worker) {
            self.lose_batch(worker);
            return;
        }
        let leads = self.batch(worker).leads.clone();
        let tx = self.db.tx(worker);
        for lead in &leads {
            let claim = tx.claims.iter().position(|(key, _)| *key == lead.key);
            match (lead.fate, claim) {
                (Fate::Failed(_), Some(at)) => {
                    tx.claims.remove(at);
                }
                (Fate::Processed, Some(at)) => tx.claims[at].1.status = Status::Completed,
                _ => {}
            }
        }
        self.commit(worker);
        self.conclude_batch(worker);
    }

    /// The transaction is lost under a handler: every message it held is requeued uncounted
    /// (`BatchRolledBack`, `Lost::error_for`).
    fn lose_batch(&mut self, worker: usize) {
        self.db.txs[worker] = None;
        for lead in self.batch(worker).leads.iter_mut() {
            if matches!(lead.fate, Fate::Fresh | Fate::Processed | Fate::Deferred) {
                lead.fate = Fate::Failed(Verdict::Requeue { counted: false });
            }
        }
        self.conclude_batch(worker);
    }

    /// Each message's result (`Inbox::conclude`, `Sorted::answer`): processed and duplicates
    /// acknowledged, failures settled as they stand, repeats answered from their lead, and the
    /// deferred ones processed one by one on the per-message path.
    fn conclude_batch(&mut self, worker: usize) {
        let Job::Batch(batch) = std::mem::replace(&mut self.workers[worker].job, Job::Idle) else {
            unreachable!("a batch")
        };
        let held = &mut self.workers[worker];
        let fate_of = |key: u8| {
            let lead = batch.leads.iter().find(|lead| lead.key == key);
            lead.expect("a repeat's lead").fate
        };
        for lead in &batch.leads {
            let verdict = match lead.fate {
                Fate::Processed => Verdict::Ack { duplicate: false },
                Fate::Duplicate => Verdict::Ack { duplicate: true },
                Fate::Failed(verdict) => verdict,
                Fate::Deferred => {
                    held.later.push(lead.key);
                    continue;
                }
                Fate::Unclaimed | Fate::Fresh => unreachable!("a lead left unsettled"),
            };
            held.settle.push((lead.key, verdict));
        }
        for &key in &batch.repeats {
            let verdict = match fate_of(key) {
                Fate::Processed | Fate::Duplicate => Verdict::Ack { duplicate: true },
                // Retried after its lead, not beside it (`InProgressElsewhere`).
                Fate::Failed(_) => Verdict::Requeue { counted: false },
                _ => {
                    held.later.push(key);
                    continue;
                }
            };
            held.settle.push((key, verdict));
        }
        if !held.later.is_empty() {
            let key = held.later.remove(0);
            held.job = Job::Message {
                key,
                step: crate::state::Step::Claim,
            };
        }
    }

    /// `worker`'s batch.
    pub fn batch(&mut self, worker: usize) -> &mut Batch {
        match &mut self.workers[worker].job {
            Job::Batch(batch) => batch,
            _ => unreachable!("a batch"),
        }
    }
}

/// Whether `worker`'s batch's claims would wait for another transaction.
pub fn batch_blocked(state: &State, worker: usize, batch: &Batch) -> bool {
    (batch.leads.iter())
        .filter(|lead| !lead.failed_alone)
        .any(|lead| state.db.locked_by_other(lead.key as usize, worker))
}

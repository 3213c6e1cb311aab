//! Two-phase mode: the claim committed with a lease, the handler's side effect outside any
//! transaction (a call to a downstream service, with a key derived from the message), the
//! lease renewed meanwhile, and the completion fenced by the claim token.

use crate::broker::Verdict;
use crate::config::Config;
use crate::db::{MessageId, Record, Status};
use crate::inbox::{Before, Claimed, claim, refused};
use crate::state::{Job, State, Step};

/// How a two-phase handler's run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HandlerRun {
    /// It called the downstream service and returned its output.
    Returns,
    /// It failed before calling.
    Fails,
    /// It called, then failed.
    CallsThenFails,
}

impl State {
    /// `Inbox::two_phase`'s claim (`inbox::claim::claim` on a connection of its own): a fresh
    /// record in progress with a lease, or the takeover of an expired record or a lapsed lease
    /// (`Store::take_over`), committed at once.
    pub fn claim_with_lease(&mut self, config: &Config, worker: usize, key: u8) {
        let claimed = claim(self, config, worker, key as usize);
        let Claimed::Acquired { before, attempt } = claimed else {
            self.decided(worker, key, Some(refused(claimed)));
            return;
        };
        self.note_claim(worker, key as usize, before);
        self.ghost.seen.takeover |= before == Before::Attempt;
        let token = self.db.new_token(key as usize);
        self.db.records[key as usize] = Some(Record::claim(token, attempt, true));
        self.set_step(
            worker,
            Step::Holding {
                token,
                attempt,
                returned: false,
            },
        );
    }

    /// The handler runs (`inbox::run`, beside `renewal::renew_until_lost`): its side effect is
    /// a call keyed by `Outbound::downstream_key`; a failure gives the claim up
    /// (`Inbox::give_up`): a first attempt's claim is deleted (`Store::release`), a takeover's
    /// handed on with its lease ended (`Store::hand_on`).
    pub fn handle_with_lease(&mut self, config: &Config, worker: usize, key: u8, run: HandlerRun) {
        let Job::Message {
            step: Step::Holding { token, attempt, .. },
            ..
        } = self.workers[worker].job
        else {
            unreachable!("a held claim")
        };
        if run != HandlerRun::Fails {
            let nonce = if config.bugs.fresh_staged_ids {
                token
            } else {
                0
            };
            self.downstream(MessageId {
                key,
                position: 0,
                run: nonce,
            });
        }
        if run == HandlerRun::Returns {
            self.set_step(
                worker,
                Step::Holding {
                    token,
                    attempt,
                    returned: true,
                },
            );
            return;
        }
        self.budget.handler_failures -= 1;
        let slot = &mut self.db.records[key as usize];
        if let Some(record) = slot.filter(|record| record.token == token) {
            if attempt > 1 {
                if let Status::InProgress { .. } = record.status {
                    *slot = Some(Record {
                        status: Status::InProgress { lease_live: false },
                        ..record
                    });
                }
            } else {
                *slot = None;
            }
        }
        self.decided(worker, key, Some(Verdict::Requeue { counted: true }));
    }

    /// A renewal (`Store::renew`): extends the lease while the token holds the claim in
    /// progress, even after the lease ran out, as long as nobody took it over.
    pub fn renew(&mut self, worker: usize, key: u8) {
        let Job::Message {
            step: Step::Holding { token, .. },
            ..
        } = self.workers[worker].job
        else {
            unreachable!("a held claim")
        };
        if let Some(record) = &mut self.db.records[key as usize]
            && record.token == token
            && record.status == (Status::InProgress { lease_live: false })
        {
            record.status = Status::InProgress { lease_live: true };
        }
    }

    /// The completion (`completion::complete_while_held`, `Store::complete`): only while the
    /// claim token still holds the record in progress; otherwise the claim was lost
    /// (`ClaimLost`, requeued).
    pub fn complete(&mut self, config: &Config, worker: usize, key: u8) {
        let Job::Message {
            step: Step::Holding { token, .. },
            ..
        } = self.workers[worker].job
        else {
            unreachable!("a held claim")
        };
        let fenced = |record: &Record| config.bugs.no_fencing || record.token == token;
        match &mut self.db.records[key as usize] {
            Some(record)
                if matches!(record.status, Status::InProgress { .. }) && fenced(record) =>
            {
                record.status = Status::Completed;
                record.expired = false;
                self.effect_committed(key as usize);
                self.decided(worker, key, Some(Verdict::Ack { duplicate: false }));
            }
            _ => {
                self.ghost.seen.fenced = true;
                self.decided(worker, key, Some(Verdict::Requeue { counted: true }));
            }
        }
    }

    /// The lease of `key`'s claim runs out by the database's clock: its holder crashed, or is
    /// paused or cut off from the database (which costs a fault).
    pub fn lease_runs_out(&mut self, key: u8) {
        if self.holder_runs(key) {
            self.budget.paused_holders -= 1;
        }
        let record = self.db.records[key as usize].as_mut().expect("a record");
        record.status = Status::InProgress { lease_live: false };
    }

    /// Whether a worker still runs the claim that `key`'s record carries (and renews it).
    pub fn holder_runs(&self, key: u8) -> bool {
        let Some(record) = self.db.records[key as usize] else {
            return false;
        };
        self.workers.iter().any(|worker| {
            matches!(worker.job, Job::Message { key: k, step: Step::Holding { token, .. } }
                if k == key && token == record.token)
        })
    }
}

//! The outbox: messages staged in the handler's transaction, and the relays that publish the
//! committed ones, each run's in order, holding back what the broker does not take.

use crate::config::{Config, OnSight};
use crate::db::{Exchange, MessageId, Row, Tx, bit};
use crate::state::{Relay, State};

/// How many rows a relay's batch takes.
pub const RELAY_BATCH: usize = 2;

/// A handler run of `key` stages its messages in `tx` (`Outbound::stage`, `Outbox::stage_for_run`),
/// each with the id derived from (consumer, key, position) (`derived_id`), or, with the planted
/// bug, one that differs from run to run (`token`). The first goes to the exchange that may be
/// missing.
pub fn stage(config: &Config, tx: &mut Tx, key: u8, token: u8) {
    for position in 0..config.staged {
        let run = if config.bugs.fresh_staged_ids {
            token
        } else {
            0
        };
        let exchange = if config.missing_exchange && position == 0 {
            Exchange::Missing
        } else {
            Exchange::Present
        };
        tx.staged.push(Row {
            id: MessageId { key, position, run },
            exchange,
            sent: false,
            held: None,
            locked_by: None,
        });
    }
}

/// The seqs a relay would take now: committed, unsent, not held, not locked by another relay,
/// oldest first (`Outbox::take_pending`: `… ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED`).
pub fn takeable(state: &State) -> Vec<u8> {
    (state.db.outbox.iter().enumerate())
        .filter(|(_, row)| !row.sent && row.held.is_none() && row.locked_by.is_none())
        .map(|(seq, _)| seq as u8)
        .take(RELAY_BATCH)
        .collect()
}

impl State {
    /// A relay takes a batch (`Outbox::take_pending_after`), keeps each run's order
    /// (`PendingBatch::keep_runs_in_order`: a run whose earlier unsent message the batch lacks
    /// waits, held back with it if it is held), and sorts out the messages to exchanges it
    /// holds back on sight (`relay::held::HoldMemory::sort`).
    pub fn relay_takes(&mut self, config: &Config, relay: usize) {
        let taken = takeable(self);
        for &seq in &taken {
            self.db.outbox[seq as usize].locked_by = Some(relay as u8);
        }
        let mut round = Relay {
            taken: taken.clone(),
            busy: true,
            holds_exchange: self.relays[relay].holds_exchange,
            ..Relay::default()
        };
        let rows = &self.db.outbox;
        // Runs that wait: from their first taken message after a gap (`run_order::wait_of`).
        let mut waiting: Vec<(u8, u8)> = Vec::new();
        for &seq in &taken {
            let run = rows[seq as usize].id.key;
            if waiting.iter().any(|(r, _)| *r == run) {
                continue;
            }
            let last = (taken.iter().rev())
                .find(|s| rows[**s as usize].id.key == run)
                .copied()
                .expect("the run has this message");
            let gap = (0..last).find(|s| {
                let row = rows[*s as usize];
                row.id.key == run && !row.sent && !taken.contains(s)
            });
            if let Some(gap) = gap {
                let from = (taken.iter())
                    .find(|s| **s > gap && rows[**s as usize].id.key == run)
                    .copied()
                    .expect("a taken message after the gap");
                if rows[gap as usize].held.is_some() {
                    round.holds.push((from, false));
                }
                waiting.push((run, from));
            }
        }
        let mut held_on_sight: u8 = 0;
        for &seq in &taken {
            let row = rows[seq as usize];
            let run = row.id.key;
            if waiting.iter().any(|(r, from)| *r == run && seq >= *from) {
                continue;
            }
            let follows_held = held_on_sight & bit(run as usize) != 0
                && config.on_sight == OnSight::HoldsRestOfRun;
            if follows_held {
                continue;
            }
            if round.holds_exchange && row.exchange == Exchange::Missing {
                round.holds.push((seq, false));
                held_on_sight |= bit(run as usize);
                continue;
            }
            round.publishable.push(seq);
        }
        self.relays[relay] = round;
    }

    /// The relay publishes its next message with confirms (`relay::pipeline::publish`); a
    /// message of a run the broker did not take this round is skipped. To the missing
    /// exchange, the broker closes the channel: the message is held back with its run and
    /// every message to the exchange (`HoldMemory::channel_closed`), and the round stops.
    pub fn relay_publishes(&mut self, relay: usize) {
        let seq = self.relays[relay].publishable.remove(0);
        let row = self.db.outbox[seq as usize];
        let run = row.id.key;
        if self.relays[relay].stopped & bit(run as usize) != 0 {
            return;
        }
        if row.exchange == Exchange::Missing && self.exchange_missing {
            let round = &mut self.relays[relay];
            round.holds.push((seq, true));
            round.holds_exchange = true;
            round.stopped |= bit(run as usize);
            round.closed = true;
            return;
        }
        let position = row.id.position;
        let earlier = (1u8 << position) - 1;
        if self.ghost.published[run as usize] & earlier != earlier {
            self.ghost.out_of_order = true;
        }
        self.ghost.published[run as usize] |= 1 << position;
        self.downstream(row.id);
        self.relays[relay].sent.push(seq);
    }

    /// The relay writes its holds and marks the confirmed messages sent, in the batch's
    /// transaction, whose commit unlocks the rest (`PendingBatch::hold`, `hold_exchange`,
    /// `mark_sent`).
    pub fn relay_marks_sent(&mut self, relay: usize) {
        let round = std::mem::take(&mut self.relays[relay]);
        let rows = &mut self.db.outbox;
        for &(seq, exchange) in &round.holds {
            let run = rows[seq as usize].id.key;
            for (at, row) in rows.iter_mut().enumerate() {
                if !row.sent && row.id.key == run && at >= seq as usize {
                    row.held = Some(relay as u8);
                }
            }
            if exchange {
                let runs: Vec<u8> = (rows.iter())
                    .filter(|row| !row.sent && row.exchange == Exchange::Missing)
                    .map(|row| row.id.key)
                    .collect();
                for row in rows.iter_mut() {
                    let to_it = row.exchange == Exchange::Missing || runs.contains(&row.id.key);
                    if !row.sent && to_it {
                        row.held = Some(relay as u8);
                    }
                }
            }
            self.ghost.seen.held = true;
        }
        for &seq in &round.sent {
            rows[seq as usize].sent = true;
        }
        for row in rows.iter_mut() {
            if row.locked_by == Some(relay as u8) {
                row.locked_by = None;
            }
        }
        self.relays[relay].holds_exchange = round.holds_exchange;
    }

    /// The holds in the table run out and are released (`Outbox::release_holds`). A relay's
    /// memory of the exchange runs out no later than the holds it wrote with it: it noted its
    /// `until` before writing them with the same pause.
    pub fn holds_run_out(&mut self) {
        for row in &mut self.db.outbox {
            if let Some(writer) = row.held.take() {
                self.relays[writer as usize].holds_exchange = false;
            }
        }
    }

    /// A relay crashes: its batch's transaction ends (its locks go), and its memory of holds
    /// with it; what it published and did not mark sent is published again.
    pub fn relay_crashes(&mut self, relay: usize) {
        for row in &mut self.db.outbox {
            if row.locked_by == Some(relay as u8) {
                row.locked_by = None;
            }
        }
        self.relays[relay] = Relay::default();
    }
}

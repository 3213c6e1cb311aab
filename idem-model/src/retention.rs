//! Retention: records reaching the end of their retention, the cleaner deleting them, and the
//! late duplicates a claim counts, by the expired record it finds or by the digests of the
//! keys the cleaner deleted.

use crate::db::{Status, bit};
use crate::inbox::Before;
use crate::state::State;

impl State {
    /// `key`'s record reaches the end of its retention (`expires_at <= now`, by the database's
    /// clock): from now on it behaves as absent. A record an open transaction holds is not
    /// considered (a transaction lasts far less than a retention), nor one whose lease still
    /// runs (a record in progress expires a retention after its lease).
    pub fn record_expires(&mut self, key: u8) {
        self.budget.expiries -= 1;
        let record = self.db.records[key as usize].as_mut().expect("a record");
        record.expired = true;
        self.ghost.live_effects[key as usize] = 0;
    }

    /// Whether `key`'s record can reach the end of its retention now.
    pub fn can_expire(&self, key: u8) -> bool {
        let Some(record) = self.db.records[key as usize] else {
            return false;
        };
        !record.expired
            && !self.db.locked(key as usize)
            && record.status != (Status::InProgress { lease_live: true })
    }

    /// Whether the cleaner can delete `key`'s record now: expired, and no transaction holds it
    /// (`Store::delete_expired`, `… FOR UPDATE SKIP LOCKED`).
    pub fn can_clean(&self, key: u8) -> bool {
        (self.db.records[key as usize]).is_some_and(|record| record.expired)
            && !self.db.locked(key as usize)
    }

    /// The cleaner deletes `key`'s expired record in a batch of its run
    /// (`Cleaner::delete_batches`); a completed one is added to the run's digest
    /// (`DigestRun::add`), written when the run ends.
    pub fn cleaner_deletes(&mut self, key: u8) {
        let record = self.db.records[key as usize].take().expect("a record");
        if record.status == Status::Completed {
            self.retention.deleting |= bit(key as usize);
        }
    }

    /// The cleaner's run ends: its digest written to the digest table (`DigestRun::write`) and
    /// kept by its own process (`Telemetry::record_deleted`).
    pub fn cleaner_writes_digest(&mut self) {
        let retention = &mut self.retention;
        retention.digest |= retention.deleting;
        retention.copies[0] |= retention.deleting;
        retention.deleting = 0;
    }

    /// `worker`'s process reads the digests back (`Telemetry::sync`, after each run of its
    /// cleaner task, whether its cleaner ran or another's did).
    pub fn reads_digest(&mut self, worker: usize) {
        self.retention.copies[worker] |= self.retention.digest;
    }

    /// Notes what `worker`'s claim of `key` replaced (`Telemetry::claimed`): a copy of a
    /// message processed before is a late duplicate, counted when it finds the completed
    /// record expired, or when the key is in its process's copy of the digests.
    pub fn note_claim(&mut self, worker: usize, key: usize, before: Before) {
        if self.ghost.completed & bit(key) == 0 {
            return;
        }
        self.ghost.completed &= !bit(key);
        let in_digest = self.retention.copies[worker] & bit(key) != 0;
        let counted = match before {
            Before::Expired { completed } => completed,
            Before::Nothing => in_digest,
            Before::Attempt => false,
        };
        if counted {
            self.ghost.seen.late_counted = true;
            return;
        }
        self.ghost.late_uncounted = true;
        // Missed for a reason the design does not give: the record was there to say so, or the
        // deletion had reached this process's digest.
        if before != Before::Nothing || in_digest {
            self.ghost.late_missed = true;
        }
    }
}

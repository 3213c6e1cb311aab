//! What the inbox table holds and what its statements bind, below every statement: a record's
//! status, a record read back, the values a claim writes, batches' claims and the cleaner's
//! deleted records.

use std::collections::HashSet;
use std::time::Duration;

use sea_orm::{DbErr, QueryResult, Value};

use crate::clock::duration_ms;
use crate::fingerprint::Fingerprint;
use crate::key::MessageKey;

/// A record's status column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Claimed by a two-phase handler that has not completed.
    InProgress,
    /// Processed; the output is stored.
    Completed,
}

impl Status {
    /// The status as the table stores it: `in_progress` or `completed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
        }
    }

    /// The status a column holds; `None` for text no version of idem writes.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        match text {
            "in_progress" => Some(Status::InProgress),
            "completed" => Some(Status::Completed),
            _ => None,
        }
    }
}

/// What an operator's release or forget does with a claim whose lease still runs by the
/// database's clock: its worker may still be running the handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveClaim {
    /// Leaves it alone and says how long its lease still runs.
    Refuse,
    /// Acts on it anyway, for a worker known dead: a worker still running may then repeat its
    /// external effect beside the one that takes the key next.
    Override,
}

/// The columns a record is read with, in the order [`Row::read`] reads them; the database's
/// clock comes last.
pub(crate) const READ_COLUMNS: &str = "status, fingerprint, output, attempts, claim_token, \
                                       created_at, claimed_at, lease_until, completed_at, \
                                       expires_at";

/// Every column a claim writes, in the order it binds them.
pub(crate) const CLAIM_COLUMNS: &str = "consumer, message_key, status, fingerprint, attempts, \
                                        claim_token, created_at, claimed_at, lease_until, \
                                        completed_at, expires_at";

/// An inbox row as read back, with the database's clock at the time of reading.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    /// The status column as stored; [`Status::parse`] reads it.
    pub(crate) status: String,
    pub(crate) fingerprint: Option<Vec<u8>>,
    pub(crate) output: Option<String>,
    pub(crate) attempts: i64,
    pub(crate) claim_token: i64,
    pub(crate) created_at: i64,
    pub(crate) claimed_at: i64,
    pub(crate) lease_until: Option<i64>,
    pub(crate) completed_at: Option<i64>,
    pub(crate) expires_at: i64,
    /// The database's clock when the row was read.
    pub(crate) now: i64,
}

impl Row {
    /// How long before the read the record was completed, by the database's clock.
    pub(crate) fn completed_age(&self) -> Option<Duration> {
        let completed_at = self.completed_at?;
        Some(Duration::from_millis(
            u64::try_from(self.now - completed_at).unwrap_or(0),
        ))
    }

    /// Reads [`READ_COLUMNS`] and the database's clock from `row`, starting at column `first`.
    pub(crate) fn read(row: &QueryResult, first: usize) -> Result<Self, DbErr> {
        let column = |n: usize| first + n;
        Ok(Row {
            status: row.try_get_by_index(column(0))?,
            fingerprint: row.try_get_by_index(column(1))?,
            output: row.try_get_by_index(column(2))?,
            attempts: row.try_get_by_index(column(3))?,
            claim_token: row.try_get_by_index(column(4))?,
            created_at: row.try_get_by_index(column(5))?,
            claimed_at: row.try_get_by_index(column(6))?,
            lease_until: row.try_get_by_index(column(7))?,
            completed_at: row.try_get_by_index(column(8))?,
            expires_at: row.try_get_by_index(column(9))?,
            now: row.try_get_by_index(column(10))?,
        })
    }
}

/// The values a claim writes, by insert or by takeover. Times are the database's: a claim gives
/// durations from its clock.
#[derive(Debug, Clone)]
pub(crate) struct ClaimValues<'a> {
    pub(crate) fingerprint: Option<&'a [u8; 32]>,
    pub(crate) attempts: i64,
    pub(crate) claim_token: i64,
    /// When the key was first claimed; `None` for now.
    pub(crate) created_at: Option<i64>,
    /// How long the claim is held before another worker may take it over; `None` for a claim
    /// inside the handler's transaction, which no other worker sees before it completes.
    pub(crate) lease: Option<Duration>,
    /// How long the record is kept after its lease.
    pub(crate) retention: Duration,
}

impl ClaimValues<'_> {
    /// Every claim is recorded in progress; the handler's completion marks it completed, in
    /// the same transaction (transactional mode) or after the handler (two-phase mode).
    pub(crate) fn values(&self) -> [Value; 5] {
        [
            text(Status::InProgress.as_str()),
            Value::from(self.fingerprint.map(|bytes| bytes.to_vec())),
            Value::from(self.attempts),
            Value::from(self.claim_token),
            Value::from(self.created_at),
        ]
    }

    /// The lease and the expiry, in milliseconds from the database's now. A record in progress
    /// is kept for the retention after its lease, however short the retention: a live claim
    /// never counts as expired.
    pub(crate) fn times(&self) -> [Value; 2] {
        let lease = self.lease.map(duration_ms);
        [
            Value::from(lease),
            Value::from(
                lease
                    .unwrap_or(0)
                    .saturating_add(duration_ms(self.retention)),
            ),
        ]
    }
}

/// What a probe claim of start-up's schema check did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probed {
    /// It stored its row.
    Stored,
    /// A row with an equal key was there.
    Duplicate,
    /// The table dropped its row (MySQL/MariaDB's `INSERT IGNORE` on a refused value).
    Dropped,
}

/// A fresh claim of a batch: its key and the fingerprint recorded with it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchClaim<'a> {
    pub(crate) key: &'a MessageKey,
    pub(crate) fingerprint: Option<&'a Fingerprint>,
}

/// What a batch's claim statement did: the keys it inserted, and where the database tells it
/// (PostgreSQL), the id of the transaction that holds them.
#[derive(Debug)]
pub(crate) struct Claims {
    pub(crate) fresh: HashSet<String>,
    pub(crate) transaction_id: Option<i64>,
    /// Whether the transaction's lock waits are still bounded as a claim's: to end with
    /// [`Store::end_claim_wait`](super::Store::end_claim_wait) before the handlers run.
    pub(crate) waits_bounded: bool,
}

/// A record the cleaner deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Deleted {
    pub(crate) consumer: String,
    pub(crate) key: String,
    /// Whether its message had been processed (not an abandoned claim).
    pub(crate) completed: bool,
    /// When its message was processed (epoch ms, the database's clock).
    pub(crate) completed_at: Option<i64>,
}

/// A text value.
pub(crate) fn text(value: &str) -> Value {
    Value::from(value.to_owned())
}

/// A text value, or NULL.
pub(crate) fn opt_text(value: Option<&str>) -> Value {
    Value::from(value.map(str::to_owned))
}

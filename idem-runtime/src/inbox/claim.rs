//! Claiming an inbox key: one atomic conditional insert, and the takeover of records that
//! expired or whose lease ran out.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sea_orm::{ConnectionTrait, DbErr};

use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::key::InboxKey;
use crate::store::dialect::{Failure, classify};
use crate::store::{ClaimValues, Row, Status, Store};
use crate::telemetry::Before;

/// How many times a claim is retried when the record changes under it (deleted by the cleaner,
/// taken over by another worker) before reporting contention.
const RACES: usize = 3;

/// What a claim is for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClaimRequest<'a> {
    pub(crate) key: &'a InboxKey,
    pub(crate) fingerprint: Option<&'a Fingerprint>,
    /// `Some` for a two-phase claim (recorded in progress with this lease); `None` for a claim
    /// inside the handler's transaction (recorded completed, committed with the effects).
    pub(crate) lease: Option<Duration>,
    pub(crate) retention: Duration,
    pub(crate) max_attempts: u32,
    /// How long the claim waits for another transaction holding the key.
    pub(crate) claim_wait: Duration,
}

/// The result of a claim.
#[derive(Debug)]
pub(crate) enum Claimed {
    /// The key is this worker's to process.
    Acquired {
        token: i64,
        attempt: u32,
        /// When the claim that was taken over had started (epoch ms), on a lease takeover.
        previous_claim_at: Option<i64>,
        /// What was there before.
        before: Before,
    },
    /// The message was processed before.
    Completed {
        /// Its stored output (JSON).
        output: Option<String>,
        /// How long ago its record was completed.
        age: Option<Duration>,
    },
}

/// How many times a claim that lost a deadlock is tried again before the error goes to the
/// transport.
const MAX_CLAIM_DEADLOCKS: u32 = 5;

/// The deadlocks a claim lost, to try it again a bounded number of times: copies racing to take
/// over one expired record, or batches sharing keys, can deadlock on MySQL/MariaDB; the victim's
/// transaction is rolled back, and a new one finds the winner's record. Nothing has run yet,
/// so the claim is simply tried again, at most [`MAX_CLAIM_DEADLOCKS`] times.
#[derive(Debug, Default)]
pub(crate) struct Deadlocks(u32);

impl Deadlocks {
    /// Whether a claim that failed with `error` is to be tried again.
    pub(crate) fn try_again(&mut self, error: &DbErr) -> bool {
        let again = classify(error) == Failure::Deadlock && self.0 < MAX_CLAIM_DEADLOCKS;
        self.0 += u32::from(again);
        again
    }
}

/// A claim token: unique per claim, so that a takeover is a compare-and-swap on it. A random
/// base per process plus a counter: unique within the process, and colliding across processes
/// with a probability of about one in 2^64 per pair of claims on the same key.
pub(crate) fn new_token() -> i64 {
    static BASE: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let base = *BASE.get_or_init(|| uuid::Uuid::new_v4().as_u64_pair().0);
    base.wrapping_add(COUNTER.fetch_add(1, Ordering::Relaxed)) as i64
}

/// Claims `request.key` on `conn`: a fresh insert, a takeover, or the report of what holds it.
///
/// Every claim is recorded in progress; in transactional mode no other worker sees it before the
/// handler's transaction completes it. Leases and expiries are read against the database's clock.
pub(crate) async fn claim(
    store: &Store,
    conn: &impl ConnectionTrait,
    request: ClaimRequest<'_>,
) -> Result<Claimed> {
    for _ in 0..RACES {
        let token = new_token();
        let values = |attempts: i64, created_at: Option<i64>| ClaimValues {
            fingerprint: request.fingerprint.map(Fingerprint::as_bytes),
            attempts,
            claim_token: token,
            created_at,
            lease: request.lease,
            retention: request.retention,
        };
        if store
            .insert_claim(conn, request.key, &values(1, None))
            .await
            .map_err(|error| lock_wait_ran_out(request, error))?
        {
            return Ok(acquired(token, 1, None, Before::Nothing));
        }
        let claimed = take_over_or_report(store, conn, request, token, values).await?;
        if let Some(claimed) = claimed {
            if matches!(claimed, Claimed::Acquired { .. }) && request.lease.is_none() {
                // The handler's statements run next in this transaction: they wait for locks
                // as long as the application configured, not as long as a claim does.
                store.end_claim_wait(conn).await?;
            }
            return Ok(claimed);
        }
    }
    // Three races in a row: someone else is busy with this key.
    Err(Error::InProgressElsewhere {
        key: request.key.clone(),
        remaining: Duration::ZERO,
    })
}

/// After an insert that found a record: takes it over when it expired or its lease ran out,
/// or reports what holds it. `None` when the record changed meanwhile (try again).
async fn take_over_or_report<'a>(
    store: &Store,
    conn: &impl ConnectionTrait,
    request: ClaimRequest<'a>,
    token: i64,
    values: impl Fn(i64, Option<i64>) -> ClaimValues<'a>,
) -> Result<Option<Claimed>> {
    let lock_wait = |error| lock_wait_ran_out(request, error);
    let Some(row) = store.find(conn, request.key).await.map_err(lock_wait)? else {
        return Ok(None); // deleted by the cleaner since the insert saw it
    };
    let status = Status::parse(&row.status).ok_or_else(|| Error::CorruptRecord {
        key: request.key.clone(),
        detail: format!("unknown status {:?}", row.status),
    })?;
    if row.expires_at <= row.now {
        // Past its retention: the record behaves as absent.
        let taken = store
            .take_over(conn, request.key, row.claim_token, &values(1, None))
            .await
            .map_err(lock_wait)?;
        let completed_age = (status == Status::Completed)
            .then(|| row.completed_age())
            .flatten();
        let before = Before::Expired { completed_age };
        return Ok(taken.then(|| acquired(token, 1, None, before)));
    }
    check_fingerprint(request, &row)?;
    if status == Status::Completed {
        let age = row.completed_age();
        return Ok(Some(Claimed::Completed {
            output: row.output,
            age,
        }));
    }
    let lease_until = row.lease_until.unwrap_or(0);
    if lease_until > row.now {
        return Err(Error::InProgressElsewhere {
            key: request.key.clone(),
            remaining: Duration::from_millis((lease_until - row.now) as u64),
        });
    }
    let attempts = u32::try_from(row.attempts).unwrap_or(u32::MAX);
    if attempts >= request.max_attempts {
        return Err(Error::NeedsIntervention {
            key: request.key.clone(),
            attempts,
        });
    }
    let next = attempts + 1;
    let taken = store
        .take_over(
            conn,
            request.key,
            row.claim_token,
            &values(i64::from(next), Some(row.created_at)),
        )
        .await
        .map_err(lock_wait)?;
    Ok(taken.then(|| acquired(token, next, Some(row.claimed_at), Before::Attempt)))
}

/// A claim whose wait for another transaction's lock ran out: the key is being processed
/// elsewhere (a long transactional handler holds it), which is reported as such, not as a
/// database failure.
fn lock_wait_ran_out(request: ClaimRequest<'_>, error: DbErr) -> Error {
    match classify(&error) {
        Failure::LockTimeout => Error::InProgressElsewhere {
            key: request.key.clone(),
            remaining: request.claim_wait,
        },
        _ => error.into(),
    }
}

fn acquired(token: i64, attempt: u32, previous_claim_at: Option<i64>, before: Before) -> Claimed {
    Claimed::Acquired {
        token,
        attempt,
        previous_claim_at,
        before,
    }
}

fn check_fingerprint(request: ClaimRequest<'_>, row: &Row) -> Result<()> {
    check_stored_fingerprint(request.key, row.fingerprint.as_deref(), request.fingerprint)
}

/// Checks a message's fingerprint against the one stored with its key's record: a mismatch is
/// a reused key with other content; a missing one on either side is not checked.
pub(crate) fn check_stored_fingerprint(
    key: &InboxKey,
    stored: Option<&[u8]>,
    received: Option<&Fingerprint>,
) -> Result<()> {
    let (Some(stored), Some(received)) = (stored, received) else {
        return Ok(());
    };
    if stored == received.as_bytes() {
        return Ok(());
    }
    let stored = Fingerprint::from_bytes(stored).ok_or_else(|| Error::CorruptRecord {
        key: key.clone(),
        detail: format!("a fingerprint of {} bytes, not 32", stored.len()),
    })?;
    Err(Error::FingerprintMismatch {
        key: key.clone(),
        stored,
        received: *received,
    })
}

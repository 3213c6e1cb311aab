//! Claiming an inbox key: one atomic conditional insert, and the takeover of records that
//! expired or whose lease ran out.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sea_orm::{ConnectionTrait, DbErr};

use crate::clock::{duration_ms, now_ms};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::key::InboxKey;
use crate::store::{ClaimValues, Row, Status, Store};

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
    },
    /// The message was processed before; its stored output (JSON).
    Completed(Option<String>),
}

/// A claim token: unique per claim, so that a takeover is a compare-and-swap on it. A random
/// base per process plus a counter: unique within the process, and colliding across processes
/// with a probability of about one in 2^64 per pair of claims on the same key.
fn new_token() -> i64 {
    static BASE: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let base = *BASE.get_or_init(|| uuid::Uuid::new_v4().as_u64_pair().0);
    base.wrapping_add(COUNTER.fetch_add(1, Ordering::Relaxed)) as i64
}

/// Claims `request.key` on `conn`: a fresh insert, a takeover, or the report of what holds it.
pub(crate) async fn claim(
    store: &Store,
    conn: &impl ConnectionTrait,
    request: ClaimRequest<'_>,
) -> Result<Claimed> {
    for _ in 0..RACES {
        let now = now_ms();
        let token = new_token();
        let lease_until = request
            .lease
            .map(|lease| now.saturating_add(duration_ms(lease)));
        let values = |attempts: i64, created_at: i64| ClaimValues {
            status: if request.lease.is_some() {
                Status::InProgress
            } else {
                Status::Completed
            },
            fingerprint: request.fingerprint.map(Fingerprint::as_bytes),
            attempts,
            claim_token: token,
            created_at,
            claimed_at: now,
            lease_until,
            completed_at: request.lease.is_none().then_some(now),
            // An in-progress record is kept for the retention after its lease, however short the
            // retention: a live claim never counts as expired.
            expires_at: lease_until
                .unwrap_or(now)
                .saturating_add(duration_ms(request.retention)),
        };
        if store
            .insert_claim(conn, request.key, &values(1, now))
            .await?
        {
            return Ok(acquired(token, 1, None));
        }
        let Some(row) = store.find(conn, request.key).await? else {
            continue; // deleted by the cleaner since the insert saw it
        };
        if row.expires_at <= now {
            // Past its retention: the record behaves as absent.
            if store
                .take_over(conn, request.key, row.claim_token, &values(1, now))
                .await?
            {
                return Ok(acquired(token, 1, None));
            }
            continue;
        }
        check_fingerprint(request, &row)?;
        match row.status {
            Status::Completed => return Ok(Claimed::Completed(row.output)),
            Status::InProgress => {
                let lease_until = row.lease_until.unwrap_or(0);
                if lease_until > now {
                    return Err(Error::InProgressElsewhere {
                        key: request.key.clone(),
                        remaining: Duration::from_millis((lease_until - now) as u64),
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
                if store
                    .take_over(
                        conn,
                        request.key,
                        row.claim_token,
                        &values(i64::from(next), row.created_at),
                    )
                    .await?
                {
                    return Ok(acquired(token, next, Some(row.claimed_at)));
                }
            }
        }
    }
    // Three races in a row: someone else is busy with this key.
    Err(Error::InProgressElsewhere {
        key: request.key.clone(),
        remaining: Duration::ZERO,
    })
}

fn acquired(token: i64, attempt: u32, previous_claim_at: Option<i64>) -> Claimed {
    Claimed::Acquired {
        token,
        attempt,
        previous_claim_at,
    }
}

fn check_fingerprint(request: ClaimRequest<'_>, row: &Row) -> Result<()> {
    let (Some(stored), Some(received)) = (row.fingerprint.as_deref(), request.fingerprint) else {
        return Ok(());
    };
    if stored == received.as_bytes() {
        return Ok(());
    }
    let stored = Fingerprint::from_bytes(stored)
        .ok_or_else(|| DbErr::Custom("corrupt fingerprint in the inbox".to_owned()))?;
    Err(Error::FingerprintMismatch {
        key: request.key.clone(),
        stored,
        received: *received,
    })
}

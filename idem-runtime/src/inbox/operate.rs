//! What an operator does with an inbox besides processing: its records counted per consumer,
//! and a stuck claim ended (the `idem` command's `inbox` subcommands use these).

use std::time::{Duration, SystemTime};

use crate::clock::from_epoch_ms;
use crate::error::{Error, Result};
use crate::inbox::claim::new_token;
use crate::inbox::inner::Inner;
use crate::key::InboxKey;
use crate::store::{Census, LiveClaim, Row, Status};
use crate::telemetry::DuplicateSummary;

/// One consumer's records in the inbox table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerStats {
    /// The consumer.
    pub consumer: String,
    /// Records of processed messages (expired ones included).
    pub completed: u64,
    /// Committed claims not completed: two-phase handlers running, or stopped before their
    /// completion (a transactional handler's claim is never seen before it commits).
    pub in_progress: u64,
    /// How long ago the oldest in-progress claim started.
    pub oldest_claim_age: Option<Duration>,
    /// Records past their expiry, which the cleaner has not deleted yet: they count as absent.
    pub expired: u64,
    /// The most claims one key had (1, plus one per takeover).
    pub max_attempts: u32,
    /// When the oldest record was first claimed.
    pub oldest: Option<SystemTime>,
    /// When the newest record was first claimed.
    pub newest: Option<SystemTime>,
    /// Records whose status no version of idem writes.
    pub unknown_status: u64,
    /// The retention its handler ran with, as its completed records say (the longest of their
    /// expiries less their completions); none without a completed record.
    pub retention: Option<Duration>,
}

/// What [`InboxAdmin::release`](crate::admin::InboxAdmin::release) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Released {
    /// The claim's lease ended now and its token was taken away: the next delivery takes the
    /// key over, and the worker that held it can neither renew nor complete it. `attempts` is
    /// the number of claims the key has had: once it reaches the inbox's `max_attempts`, the
    /// next delivery is dead-lettered (`needs-intervention`) instead, and
    /// [`InboxAdmin::forget`](crate::admin::InboxAdmin::forget) is what lets it be processed again.
    Released {
        /// Claims the key has had, the released one included.
        attempts: u32,
    },
    /// The key was processed: there is no claim to end ([`InboxAdmin::forget`](crate::admin::InboxAdmin::forget) deletes the record).
    Completed,
    /// The claim changed between the read and the release (completed, or taken over by another
    /// worker): nothing was done, look again.
    Changed,
    /// The inbox holds no record of the key.
    Absent,
    /// The claim's lease still runs (its worker may still be running the handler): nothing was
    /// done, as asked.
    Live {
        /// How long the lease still runs, by the database's clock.
        lease_left: Duration,
    },
}

/// What [`InboxAdmin::forget`](crate::admin::InboxAdmin::forget) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Forgotten {
    /// The record was deleted: the next delivery of its message is processed again.
    Deleted,
    /// The inbox holds no record of the key.
    Absent,
    /// The key is claimed and its lease still runs (its worker may still be running the
    /// handler): nothing was done, as asked.
    Live {
        /// How long the lease still runs, by the database's clock.
        lease_left: Duration,
    },
    /// The claim's lease ran out while this ran: nothing was done, look again.
    Changed,
}

impl Inner {
    /// See the `Inbox` method of this name.
    pub(crate) async fn duplicate_summaries(&self) -> Result<Vec<DuplicateSummary>> {
        let (store, db) = (&self.store, &self.db);
        Ok(crate::telemetry::read_summaries(store, db, None).await?)
    }

    /// See the `Inbox` method of this name.
    pub(crate) async fn duplicate_summaries_since(
        &self,
        window: Duration,
    ) -> Result<Vec<DuplicateSummary>> {
        let (store, db) = (&self.store, &self.db);
        Ok(crate::telemetry::read_summaries(store, db, Some(window)).await?)
    }

    /// See the `Inbox` method of this name.
    pub(crate) async fn stats(&self, consumer: Option<&str>) -> Result<Vec<ConsumerStats>> {
        let counts = Census::of(&self.store).count(&self.db, consumer).await?;
        let mut all: Vec<ConsumerStats> = Vec::new();
        for count in counts {
            if all
                .last()
                .is_none_or(|last| last.consumer != count.consumer)
            {
                all.push(ConsumerStats {
                    consumer: count.consumer.clone(),
                    ..ConsumerStats::default()
                });
            }
            let stats = all.last_mut().expect("pushed above");
            match count.status {
                Some(Status::Completed) => stats.completed += count.records,
                Some(Status::InProgress) => {
                    stats.in_progress += count.records;
                    let age = u64::try_from(count.now - count.oldest_claimed_at).unwrap_or(0);
                    stats.oldest_claim_age = Some(Duration::from_millis(age));
                }
                None => stats.unknown_status += count.records,
            }
            stats.expired += count.expired;
            if let Some(ms) = count.retention_ms {
                let retention = Duration::from_millis(u64::try_from(ms).unwrap_or(0));
                stats.retention = Some(stats.retention.map_or(retention, |r| r.max(retention)));
            }
            let attempts = u32::try_from(count.max_attempts).unwrap_or(u32::MAX);
            stats.max_attempts = stats.max_attempts.max(attempts);
            let oldest = from_epoch_ms(count.oldest_created_at);
            let newest = from_epoch_ms(count.newest_created_at);
            stats.oldest = Some(stats.oldest.map_or(oldest, |was| was.min(oldest)));
            stats.newest = Some(stats.newest.map_or(newest, |was| was.max(newest)));
        }
        Ok(all)
    }

    /// See the `Inbox` method of this name.
    pub(crate) async fn release(&self, key: &InboxKey, live: LiveClaim) -> Result<Released> {
        let store = &self.store;
        let Some(row) = store.find(&self.db, key).await? else {
            return Ok(Released::Absent);
        };
        match Status::parse(&row.status) {
            Some(Status::Completed) => return Ok(Released::Completed),
            Some(Status::InProgress) => {}
            None => {
                return Err(Error::CorruptRecord {
                    key: key.clone(),
                    detail: format!("unknown status {:?}", row.status),
                });
            }
        }
        if let (LiveClaim::Refuse, Some(lease_left)) = (live, lease_left(&row)) {
            return Ok(Released::Live { lease_left });
        }
        let revoked = store
            .revoke(&self.db, key, row.claim_token, new_token(), live)
            .await?;
        Ok(if revoked {
            Released::Released {
                attempts: u32::try_from(row.attempts).unwrap_or(u32::MAX),
            }
        } else {
            Released::Changed
        })
    }

    /// See the `Inbox` method of this name.
    pub(crate) async fn forget(&self, key: &InboxKey, live: LiveClaim) -> Result<Forgotten> {
        let store = &self.store;
        if store.delete(&self.db, key, live).await? {
            return Ok(Forgotten::Deleted);
        }
        Ok(match store.peek(&self.db, key).await? {
            None => Forgotten::Absent,
            Some(row) => match lease_left(&row) {
                Some(lease_left) => Forgotten::Live { lease_left },
                // Its lease ran out between the two statements.
                None => Forgotten::Changed,
            },
        })
    }
}

/// How long the lease of the claim `row` holds still runs, by the database's clock; `None` when
/// it is not a claim in progress or its lease has run out.
fn lease_left(row: &Row) -> Option<Duration> {
    let lease_until = row.lease_until?;
    let claimed = Status::parse(&row.status) == Some(Status::InProgress);
    let left = u64::try_from(lease_until - row.now)
        .ok()
        .filter(|ms| *ms > 0)?;
    claimed.then(|| Duration::from_millis(left))
}

//! What an inbox learns of its duplicates, for the operator deciding its retention: each
//! duplicate's age, and the **late duplicates**, copies that came after their key's record had
//! expired, which the inbox processes again.
//!
//! A late duplicate is caught two ways. A copy that finds its key's completed record expired but
//! not yet deleted is one for certain, its age known. A copy whose key has no record is checked
//! against digests (Bloom filters, [`bloom`]) of the keys the cleaner deleted: a hit is one, its
//! age at least what the digest tells, or, at most once in 100 000 fresh keys over a full
//! digest, a false alarm. Either is counted (`idem_late_duplicates_total`, registered at zero as
//! soon as a consumer is known) and logged with its key, once per key in a while.
//!
//! Nothing is written per message: each process counts in memory and adds its counts to a row
//! per consumer and day (`<inbox>_dup_daily`) when its cleaner task looks at the table; the
//! cleaner that deletes writes the digests' changed pieces (`<inbox>_key_digest`), which every
//! cleaner task reads back.

mod bloom;
mod counting;
mod daily;
mod digest;
mod summary;

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use sea_orm::DbErr;

pub(crate) use digest::DigestRun;
pub use summary::DuplicateSummary;
pub(crate) use summary::read_all as read_summaries;

use crate::key::InboxKey;
use crate::metrics::LATE_DUPLICATES_TOTAL;
use counting::now_ms;
use daily::Daily;
use digest::Digests;

/// How many late duplicates' keys are remembered, so that the retries of one are not counted
/// again.
const REMEMBERED: usize = 4096;

/// What was there before a claim took its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Before {
    /// No record: the key is new, or its record was deleted.
    Nothing,
    /// A record past its retention; `completed_age` is how long ago its message was processed
    /// (none for an abandoned claim).
    Expired { completed_age: Option<Duration> },
    /// An attempt whose lease ran out.
    Attempt,
}

/// An inbox's duplicates' summaries and its digests of deleted keys.
#[derive(Debug)]
pub(crate) struct Telemetry {
    daily: Daily,
    digests: Digests,
    /// Consumers whose counter of late duplicates is registered.
    counted: RwLock<HashSet<String>>,
    /// Keys of late duplicates counted lately.
    reported: Mutex<Reported>,
    /// How many syncs failed (said now and then).
    failures: AtomicU64,
}

#[derive(Debug, Default)]
struct Reported {
    order: VecDeque<InboxKey>,
    keys: HashSet<InboxKey>,
}

impl Reported {
    /// Notes `key`; whether it was not noted lately.
    fn first_time(&mut self, key: &InboxKey) -> bool {
        if !self.keys.insert(key.clone()) {
            return false;
        }
        self.order.push_back(key.clone());
        if self.order.len() > REMEMBERED
            && let Some(oldest) = self.order.pop_front()
        {
            self.keys.remove(&oldest);
        }
        true
    }
}

/// What a late duplicate's age is known to be.
#[derive(Debug, Clone, Copy)]
enum LateAge {
    /// Its record had expired: processed exactly this long before.
    Expired(Duration),
    /// The digest recognised it: processed at least this long before.
    Deleted(Duration),
}

impl Telemetry {
    /// The telemetry of an inbox whose digests cover `window` of deletions, and whose
    /// consumers' messages may be redelivered for `redelivery` (its configured window).
    pub(crate) fn new(window: Duration, redelivery: Option<Duration>) -> Self {
        Self {
            daily: Daily::new(redelivery),
            digests: Digests::new(window),
            counted: RwLock::default(),
            reported: Mutex::default(),
            failures: AtomicU64::new(0),
        }
    }

    /// Registers `consumer`'s counter of late duplicates at zero, the first time it is named,
    /// so that a scrape shows it before its first late duplicate.
    pub(crate) fn known(&self, consumer: &str) {
        let counted = self.counted.read().unwrap_or_else(|e| e.into_inner());
        if counted.contains(consumer) {
            return;
        }
        drop(counted);
        let mut counted = self.counted.write().unwrap_or_else(|e| e.into_inner());
        if counted.insert(consumer.to_owned()) {
            metrics::counter!(LATE_DUPLICATES_TOTAL, "consumer" => consumer.to_owned())
                .increment(0);
        }
    }

    /// Records a duplicate answered from its record, `age` after the record was completed.
    pub(crate) fn duplicate(&self, consumer: &str, age: Option<Duration>) {
        self.known(consumer);
        crate::observe::duplicate_age(consumer, age);
        self.daily.duplicate(consumer, age);
    }

    /// Looks at what a claim of `key`, made with `retention`, found: a late duplicate is
    /// counted and logged.
    pub(crate) fn claimed(&self, key: &InboxKey, before: Before, retention: Duration) {
        let consumer = key.consumer.as_str();
        self.known(consumer);
        match before {
            Before::Expired {
                completed_age: Some(age),
            } => {
                self.daily.claimed(consumer, retention, 0.0);
                self.late(key, LateAge::Expired(age));
            }
            Before::Nothing => {
                let check = self.digests.check(key);
                self.daily.claimed(consumer, retention, check.false_alarm);
                if let Some(completed_by_ms) = check.completed_by_ms {
                    let age_ms = u64::try_from(now_ms().saturating_sub(completed_by_ms));
                    let age = Duration::from_millis(age_ms.unwrap_or(0));
                    self.late(key, LateAge::Deleted(age));
                }
            }
            _ => self.daily.claimed(consumer, retention, 0.0),
        }
    }

    fn late(&self, key: &InboxKey, age: LateAge) {
        let first = (self.reported.lock().unwrap_or_else(|e| e.into_inner())).first_time(key);
        if !first {
            return;
        }
        let consumer = key.consumer.as_str();
        metrics::counter!(LATE_DUPLICATES_TOTAL, "consumer" => consumer.to_owned()).increment(1);
        match age {
            LateAge::Expired(age) => {
                self.daily.late_expired(consumer, age);
                tracing::warn!(
                    consumer,
                    key = key.message_key.as_str(),
                    age_s = age.as_secs(),
                    "late duplicate: its record had expired, so it is processed again; the \
                     consumer's retention is shorter than its redeliveries"
                );
            }
            LateAge::Deleted(at_least) => {
                self.daily.late_deleted(consumer, at_least);
                tracing::warn!(
                    consumer,
                    key = key.message_key.as_str(),
                    age_at_least_s = at_least.as_secs(),
                    "late duplicate (or, at most once in 100 000 new keys, a false alarm of \
                     the digest): the cleaner had deleted its record, so it is processed \
                     again; the consumer's retention is shorter than its redeliveries"
                );
            }
        }
    }

    /// Writes this process's summaries that changed, and reads the digests the cleaner wrote
    /// since the last look. Called by the cleaner task after each of its runs.
    pub(crate) async fn sync(&self, store: &crate::store::Store, db: &sea_orm::DatabaseConnection) {
        let synced = async {
            self.daily.flush(store, db).await?;
            self.digests.refresh(store, db).await
        }
        .await;
        if let Err(error) = synced {
            self.missing_or_failed(&error);
        }
    }

    /// Adds what a cleaner run deleted to the digests, and keeps this process's copy.
    pub(crate) async fn record_deleted(
        &self,
        run: DigestRun,
        store: &crate::store::Store,
        db: &sea_orm::DatabaseConnection,
    ) {
        match run.write(store, db, self.digests.window()).await {
            Ok(written) => self.digests.keep(written),
            Err(error) => self.missing_or_failed(&error),
        }
    }

    fn missing_or_failed(&self, error: &DbErr) {
        // Said at the first failure, then once per ten, not at every cleaner run.
        let failures = self.failures.fetch_add(1, Ordering::Relaxed);
        if failures.is_multiple_of(10) {
            tracing::warn!(
                %error,
                failures = failures + 1,
                "cannot write or read the inbox's duplicates' summaries and digests (their \
                 tables are created with the inbox's, or by the UpgradeInboxCompanions \
                 migration); late duplicates are not detected meanwhile"
            );
        }
    }
}

//! The cleaner: deletes expired records in bounded batches, one cleaner at a time.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sea_orm::TransactionOptions;

use crate::store::dialect::begin_detached;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::RetentionPolicy;
use crate::error::{Error, Result};
use crate::metrics::CLEANUP_DELETED_TOTAL;
use crate::outbox::Outbox;
use crate::store::{Cleaning, Store};
use crate::telemetry::{DigestRun, Telemetry};

/// What one cleanup run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Records deleted.
    pub deleted: u64,
    /// Delete statements run, each its own short transaction of at most the batch size.
    pub batches: u32,
    /// Whether the run did nothing because another cleaner held the lock.
    pub skipped: bool,
    /// Whether the run still found full batches after one cleanup interval, and warned: records
    /// expire faster than the cleaner deletes them at its busy share, or a backlog (the first
    /// run after a long stop) takes it longer than an interval.
    pub fell_behind: bool,
}

impl CleanupReport {
    fn add(&mut self, other: CleanupReport) {
        self.deleted += other.deleted;
        self.batches += other.batches;
        self.fell_behind |= other.fell_behind;
    }
}

/// The cadence of one table's cleanup run: batches until one is not full, a rest after each
/// full one so that deleting takes at most the policy's busy share of the time, and a warning,
/// once per run, when the run still finds full batches after one cleanup interval.
struct Batching<'a> {
    table: String,
    policy: &'a RetentionPolicy,
    started: Instant,
    /// When the batch under way was sent.
    sent: Instant,
    deleted: u64,
    batches: u32,
    fell_behind: bool,
}

impl<'a> Batching<'a> {
    fn start(table: String, policy: &'a RetentionPolicy) -> Self {
        Batching {
            table,
            policy,
            started: Instant::now(),
            sent: Instant::now(),
            deleted: 0,
            batches: 0,
            fell_behind: false,
        }
    }

    /// Notes that a batch is sent now.
    fn sending(&mut self) {
        self.sent = Instant::now();
    }

    /// After a batch that deleted `deleted` rows: whether to run another (the batch was full
    /// and the cleaner is not asked to stop), having rested first.
    async fn another(&mut self, deleted: u64, stop: &watch::Receiver<bool>) -> bool {
        self.deleted += deleted;
        self.batches += 1;
        if deleted < u64::from(self.policy.batch_size()) || *stop.borrow() {
            return false;
        }
        self.full_batch();
        pause(self.policy.rest_after(self.sent.elapsed())).await;
        true
    }

    /// Warns, once, when a full batch comes after one cleanup interval.
    fn full_batch(&mut self) {
        let elapsed = self.started.elapsed();
        if self.fell_behind || elapsed <= self.policy.cleanup_interval() {
            return;
        }
        self.fell_behind = true;
        tracing::warn!(
            table = %self.table,
            deleted = self.deleted,
            rows_per_second = (self.deleted as f64 / elapsed.as_secs_f64()).round(),
            max_busy_percent = self.policy.max_busy_percent(),
            batch_size = self.policy.batch_size(),
            "the cleaner is falling behind: its run outlasted the cleanup interval; if rows \
             expire faster than it deletes them at its busy share (not a backlog after a stop), \
             raise RetentionPolicy::with_max_busy_percent (or the batch size)"
        );
    }
}

/// Deletes expired inbox records, following the inbox's [`RetentionPolicy`](crate::RetentionPolicy).
///
/// Each batch is one `DELETE` of at most the batch size, found through the expiry index, in its
/// own short transaction, with a pause between batches so consumers are never held up for long.
/// Only one cleaner works on a table at a time, across processes: a PostgreSQL advisory lock or a
/// MySQL/MariaDB named lock (`GET_LOCK`), or, on SQLite, which one process owns, a lock in the
/// process keyed by the database file and the table (an in-memory database by its inbox). A
/// cleaner that finds the lock taken skips its run.
///
/// On PostgreSQL and MySQL/MariaDB the lock is held by a transaction of its own while batches run
/// on other connections: the pool needs at least two.
#[derive(Debug, Clone)]
pub struct Cleaner {
    inner: Arc<CleanerParts>,
}

/// What a cleaner works with: its inbox's connection, store, telemetry, retention and outbox.
#[derive(Debug)]
pub(crate) struct CleanerParts {
    pub(crate) db: sea_orm::DatabaseConnection,
    pub(crate) store: Arc<Store>,
    pub(crate) telemetry: Arc<Telemetry>,
    pub(crate) retention: RetentionPolicy,
    pub(crate) outbox: Option<Outbox>,
}

/// A running cleaner task, from [`Cleaner::spawn`].
#[derive(Debug)]
pub struct CleanerHandle {
    stop: watch::Sender<bool>,
    task: JoinHandle<CleanupReport>,
}

impl CleanerHandle {
    /// Stops the cleaner after its current batch and returns what it deleted in all.
    pub async fn stop(self) -> CleanupReport {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

impl Cleaner {
    /// The cleaner of the inbox whose `parts` are given.
    pub(crate) fn new(parts: CleanerParts) -> Self {
        Self {
            inner: Arc::new(parts),
        }
    }

    /// Runs one cleanup now: deletes every record expired at the start of the run, batch by
    /// batch, unless another cleaner holds the lock.
    ///
    /// The run goes on in a task of its own even if this future is dropped, so that a lock it
    /// took is always released.
    pub async fn run_once(&self) -> Result<CleanupReport> {
        let cleaner = self.clone();
        let run = tokio::spawn(async move {
            let (_tx, stop) = watch::channel(false);
            let report = cleaner.run_locked(&stop).await;
            cleaner.sync_telemetry().await;
            report
        });
        match run.await {
            Ok(report) => report,
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
    }

    /// Writes this process's duplicates' summaries and reads the digests of deleted keys back.
    async fn sync_telemetry(&self) {
        let inner = &self.inner;
        inner.telemetry.sync(&inner.store, &inner.db).await;
    }

    /// How many connections of the inbox's pool a cleanup run holds at once: two on PostgreSQL
    /// and MySQL/MariaDB (the lock's transaction and a batch's), one on SQLite.
    pub fn connections_needed(&self) -> u32 {
        if self.inner.store.dialect().one_process() {
            1
        } else {
            2
        }
    }

    /// The most connections the inbox's pool opens, when it is a sqlx pool of an enabled
    /// backend: to check that the pool leaves room for the cleaner (see
    /// [`connections_needed`](Cleaner::connections_needed)) besides the handlers.
    pub fn pool_max_connections(&self) -> Option<u32> {
        match &self.inner.db.inner {
            #[cfg(feature = "postgres")]
            sea_orm::DatabaseConnectionType::SqlxPostgresPoolConnection(_) => Some(
                self.inner
                    .db
                    .get_postgres_connection_pool()
                    .options()
                    .get_max_connections(),
            ),
            #[cfg(feature = "mysql")]
            sea_orm::DatabaseConnectionType::SqlxMySqlPoolConnection(_) => Some(
                self.inner
                    .db
                    .get_mysql_connection_pool()
                    .options()
                    .get_max_connections(),
            ),
            #[cfg(feature = "sqlite")]
            sea_orm::DatabaseConnectionType::SqlxSqlitePoolConnection(_) => Some(
                self.inner
                    .db
                    .get_sqlite_connection_pool()
                    .options()
                    .get_max_connections(),
            ),
            _ => None,
        }
    }

    /// Spawns a tokio task that runs a cleanup at once and then every
    /// [`cleanup_interval`](crate::RetentionPolicy::cleanup_interval), until stopped.
    pub fn spawn(self) -> CleanerHandle {
        let (stop_tx, mut stop) = watch::channel(false);
        let interval = self.inner.retention.cleanup_interval();
        let task = tokio::spawn(async move {
            let mut total = CleanupReport::default();
            loop {
                match self.run_locked(&stop).await {
                    Ok(report) => total.add(report),
                    Err(error) => tracing::warn!(%error, "inbox cleanup failed; retrying later"),
                }
                // Every process's task, whether its cleaner ran or another one did.
                self.sync_telemetry().await;
                tokio::select! {
                    _ = stop.changed() => break,
                    _ = tokio::time::sleep(interval) => {}
                }
            }
            // What the last interval saw, before the process goes.
            self.sync_telemetry().await;
            total
        });
        CleanerHandle {
            stop: stop_tx,
            task,
        }
    }

    async fn run_locked(&self, stop: &watch::Receiver<bool>) -> Result<CleanupReport> {
        let store = &self.inner.store;
        let db = &self.inner.db;
        if store.dialect().one_process() {
            let database = match Cleaning::of(store).database_file(db).await? {
                Some(file) => file,
                // In memory: a database of this inbox's own pool.
                None => format!("in-memory inbox {:p}", Arc::as_ptr(&self.inner)),
            };
            let Some(_guard) = ProcessLock::try_acquire(database, store.table().to_string()) else {
                return Ok(skipped());
            };
            return self.delete_batches(stop).await;
        }
        let holder = begin_detached(db, TransactionOptions::default()).await?;
        if !Cleaning::of(store).try_lock_cleaner(&holder).await? {
            holder.rollback().await?;
            return Ok(skipped());
        }
        let result = self.delete_batches(stop).await;
        let unlocked = Cleaning::of(store).unlock_cleaner(&holder).await;
        holder.commit().await?;
        unlocked?;
        result
    }

    async fn delete_batches(&self, stop: &watch::Receiver<bool>) -> Result<CleanupReport> {
        let policy = &self.inner.retention;
        let store = &self.inner.store;
        // Records are expired by the database's clock, as claims read them.
        let now = Cleaning::of(store).now(&self.inner.db).await?;
        let mut report = CleanupReport::default();
        let mut batching = Batching::start(store.table().to_string(), policy);
        let mut digest = DigestRun::default();
        let mut digested = true;
        let deleting = async {
            loop {
                batching.sending();
                let deleted = Cleaning::of(store)
                    .delete_expired(&self.inner.db, now, policy.batch_size())
                    .await?;
                // A digest that cannot be read or written leaves the deletions alone.
                if digested {
                    digested = digest.add(store, &self.inner.db, &deleted).await.is_ok();
                }
                if !batching.another(deleted.len() as u64, stop).await {
                    return Ok::<_, Error>(());
                }
            }
        }
        .await;
        // What was deleted before a failure is digested too.
        (self.inner.telemetry)
            .record_deleted(digest, store, &self.inner.db)
            .await;
        deleting?;
        report.deleted = batching.deleted;
        report.batches = batching.batches;
        report.fell_behind = batching.fell_behind;
        metrics::counter!(CLEANUP_DELETED_TOTAL, "table" => store.table().to_string())
            .increment(report.deleted);
        if let Some(outbox) = &self.inner.outbox {
            report.fell_behind |= self.delete_sent(outbox, stop).await?;
        }
        if report.deleted > 0 {
            tracing::info!(
                table = %store.table(),
                deleted = report.deleted,
                batches = report.batches,
                "deleted expired inbox records"
            );
        }
        Ok(report)
    }
}

impl Cleaner {
    /// Deletes the outbox's rows sent longer than its retention ago, in bounded batches;
    /// returns whether it fell behind.
    async fn delete_sent(&self, outbox: &Outbox, stop: &watch::Receiver<bool>) -> Result<bool> {
        let policy = &self.inner.retention;
        let mut batching = Batching::start(outbox.table().to_string(), policy);
        loop {
            batching.sending();
            let batch = outbox.delete_sent(policy.batch_size()).await?;
            if !batching.another(batch, stop).await {
                break;
            }
        }
        let deleted = batching.deleted;
        metrics::counter!(CLEANUP_DELETED_TOTAL, "table" => outbox.table().to_string())
            .increment(deleted);
        if deleted > 0 {
            tracing::info!(table = %outbox.table(), deleted, "deleted sent outbox messages");
        }
        Ok(batching.fell_behind)
    }
}

fn skipped() -> CleanupReport {
    CleanupReport {
        skipped: true,
        ..CleanupReport::default()
    }
}

async fn pause(duration: Duration) {
    if !duration.is_zero() {
        tokio::time::sleep(duration).await;
    }
}

/// The SQLite cleaner lock: the `(database file, table)` pairs being cleaned in this process.
static SQLITE_CLEANING: Mutex<Option<HashSet<(String, String)>>> = Mutex::new(None);

struct ProcessLock((String, String));

impl ProcessLock {
    fn try_acquire(database: String, table: String) -> Option<Self> {
        let key = (database, table);
        let mut cleaning = SQLITE_CLEANING.lock().unwrap_or_else(|e| e.into_inner());
        cleaning
            .get_or_insert_with(HashSet::new)
            .insert(key.clone())
            .then(|| Self(key))
    }
}

impl Drop for ProcessLock {
    fn drop(&mut self) {
        let mut cleaning = SQLITE_CLEANING.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cleaning) = cleaning.as_mut() {
            cleaning.remove(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use sea_orm::{ConnectionTrait, Database};

    use super::*;
    use crate::Inbox;

    /// An inbox on a database of its own in memory, holding `count` expired records, cleaned in
    /// batches of 50 with pauses between them.
    async fn in_memory_inbox(count: usize) -> Inbox {
        in_memory_inbox_cleaned_every(count, Duration::from_secs(3600)).await
    }

    async fn in_memory_inbox_cleaned_every(count: usize, interval: Duration) -> Inbox {
        let db = Database::connect("sqlite::memory:").await.unwrap();
        let policy = RetentionPolicy::default()
            .with_batch_size(50)
            .with_cleanup_interval(interval);
        let inbox = Inbox::builder(db.clone())
            .retention(policy)
            .build()
            .await
            .unwrap();
        let rows: Vec<String> = (0..count)
            .map(|i| format!("('c', 'k-{i}', 'completed', NULL, NULL, 1, 0, 1, 1, NULL, 1, 1)"))
            .collect();
        db.execute_unprepared(&format!(
            "INSERT INTO idem_inbox (consumer, message_key, status, fingerprint, output, attempts, \
             claim_token, created_at, claimed_at, lease_until, completed_at, expires_at) VALUES {}",
            rows.join(", ")
        ))
        .await
        .unwrap();
        inbox
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cleaner_tells_its_pool_size_and_needs() {
        let mut options = sea_orm::ConnectOptions::new("sqlite::memory:");
        options.max_connections(3);
        let db = Database::connect(options).await.unwrap();
        let inbox = Inbox::builder(db).build().await.unwrap();
        let cleaner = inbox.cleaner();
        assert_eq!(cleaner.pool_max_connections(), Some(3));
        assert_eq!(cleaner.connections_needed(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn in_memory_databases_with_one_table_name_are_cleaned_at_once() {
        let (one, two) = (in_memory_inbox(300).await, in_memory_inbox(200).await);
        let (one, two) = (one.cleaner(), two.cleaner());
        let parts = &one.inner;
        let database = Cleaning::of(&parts.store).database_file(&parts.db).await;
        assert_eq!(database.unwrap(), None);
        let (a, b) = tokio::join!(one.run_once(), two.run_once());
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!((a.deleted, a.skipped), (300, false), "{a:?}");
        assert_eq!((b.deleted, b.skipped), (200, false), "{b:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_that_outlasts_the_cleanup_interval_says_it_fell_behind() {
        // 20 batches with a 10 ms pause after each full one: about 200 ms, against an interval
        // of 50 ms, then of an hour.
        let behind = in_memory_inbox_cleaned_every(1_000, Duration::from_millis(50)).await;
        let report = behind.cleaner().run_once().await.unwrap();
        assert_eq!(
            (report.deleted, report.fell_behind),
            (1_000, true),
            "{report:?}"
        );
        let on_time = in_memory_inbox(1_000).await;
        let report = on_time.cleaner().run_once().await.unwrap();
        assert_eq!(
            (report.deleted, report.fell_behind),
            (1_000, false),
            "{report:?}"
        );
    }
}

/// A cleaner's runs, their batches paced by the real [`Batching`], against a simulated table
/// whose rows expire at a steady rate, with seeded policies and statement costs (see
/// `idem_sim`).
#[cfg(test)]
mod simulation {
    use idem_sim::{self as sim, Rng};

    use super::*;

    /// What a simulated cleaner met.
    struct Seen {
        /// The most expired rows waiting at a run's start.
        backlog: u64,
        /// Whether a run said it fell behind.
        fell_behind: bool,
        runs: u32,
    }

    /// One run of 12 cleanup intervals: rows expiring at `factor` times what the cleaner can
    /// delete at its busy share. Fails if a run's batches took more than the busy share of its
    /// time; if the cleaner kept up (`factor` at most 0.3) but said it fell behind or let the
    /// expired rows pile up; or if it could not keep up (`factor` from 1.2) and never said so.
    async fn run(mut rng: Rng) -> Result<String, String> {
        let interval = Duration::from_secs(1 + rng.below(10));
        let batch = 100 + rng.below(900);
        let percent = u8::try_from(5 + rng.below(46)).expect("small");
        let least_rest = Duration::from_millis(rng.below(50));
        let policy = RetentionPolicy::new(Duration::from_secs(3_600))
            .with_cleanup_interval(interval)
            .with_batch_size(u32::try_from(batch).expect("small"))
            .with_pause_between_batches(least_rest)
            .with_max_busy_percent(percent);
        // A DELETE of `n` rows takes a fixed part and a part per row, in whole milliseconds.
        let (fixed_ms, per_row_us) = (1 + rng.below(20), 10 + rng.below(190));
        let busy = |n: u64| Duration::from_millis(fixed_ms + (n * per_row_us).div_ceil(1_000));
        let full = busy(batch).as_secs_f64();
        let rest =
            (full * f64::from(100 - percent) / f64::from(percent)).max(least_rest.as_secs_f64());
        let capacity = batch as f64 / (full + rest);
        let factor =
            [0.1, 0.2, 0.3, 1.2, 1.5, 2.0, 3.0][usize::try_from(rng.below(7)).expect("small")];
        let rate = capacity * factor;

        let start = Instant::now();
        let deadline = start + interval * 12;
        let mut deleted = 0u64;
        let expired = |deleted: u64| {
            let arrived = (rate * start.elapsed().as_secs_f64()) as u64;
            arrived.saturating_sub(deleted)
        };
        let (_stop_tx, stop) = watch::channel(false);
        let mut seen = Seen {
            backlog: 0,
            fell_behind: false,
            runs: 0,
        };
        let policy_said = format!(
            "every {interval:?}, batches of {batch}, {percent} % busy, rests of at least \
             {least_rest:?}; a full batch takes {full:.3} s; rows expire at {rate:.0}/s, \
             {factor} × the {capacity:.0}/s it can delete"
        );
        while Instant::now() < deadline {
            seen.runs += 1;
            seen.backlog = seen.backlog.max(expired(deleted));
            let mut batching = Batching::start("simulated".to_owned(), &policy);
            let mut busy_total = Duration::ZERO;
            let mut last_busy;
            loop {
                batching.sending();
                let rows = expired(deleted).min(batch);
                last_busy = busy(rows);
                tokio::time::sleep(last_busy).await;
                busy_total += last_busy;
                deleted += rows;
                if Instant::now() >= deadline || !batching.another(rows, &stop).await {
                    break;
                }
            }
            seen.fell_behind |= batching.fell_behind;
            let elapsed = batching.started.elapsed();
            // Every batch but the last was followed by its rest.
            let share = f64::from(percent) / 100.0;
            let allowed =
                share * (elapsed - last_busy).as_secs_f64() + 0.001 * f64::from(batching.batches);
            if (busy_total - last_busy).as_secs_f64() > allowed {
                return Err(format!(
                    "{policy_said}\nrun {}: busy {busy_total:?} of {elapsed:?} in {} batches, \
                     more than {percent} %",
                    seen.runs, batching.batches
                ));
            }
            tokio::time::sleep(interval).await;
        }
        let pile = (rate * interval.as_secs_f64() * 1.5) as u64 + 2 * batch;
        let broken = if factor <= 0.3 && seen.fell_behind {
            Some("it kept up, yet said it fell behind".to_owned())
        } else if factor <= 0.3 && seen.backlog > pile {
            Some(format!(
                "it kept up, yet {} rows waited at a run's start",
                seen.backlog
            ))
        } else if factor >= 1.2 && !seen.fell_behind {
            Some("it could not keep up and never said so".to_owned())
        } else {
            None
        };
        match broken {
            Some(broken) => Err(format!("{policy_said}\n{broken} ({} runs)", seen.runs)),
            None => Ok(format!(
                "factor {factor}, {} runs, {}",
                seen.runs, seen.fell_behind
            )),
        }
    }

    #[test]
    fn a_cleaner_keeps_to_its_share_keeps_up_below_it_and_says_when_it_cannot() {
        let reports = sim::check("cleaner", 200, run);
        if sim::replaying() {
            return;
        }
        assert!(reports.iter().any(|r| r.ends_with("true")));
        assert!(reports.iter().any(|r| r.ends_with("false")));
    }
}

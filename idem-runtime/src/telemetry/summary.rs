//! Each consumer's duplicates as this process saw them, kept in memory and written as one row
//! per consumer and process; and the rows of every process read back, summed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Value};

use crate::store::Store;
use crate::store::table::{DUPLICATES, companion};

/// How long a process's row is kept after its last write: 90 days.
const STALE_AFTER_MS: i64 = 90 * 86_400_000;

/// See [`DuplicateSummary::AGE_BUCKETS`].
const AGE_BUCKETS: [u64; 9] = DuplicateSummary::AGE_BUCKETS;

/// One consumer's duplicates, as every process that ran it wrote them.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct DuplicateSummary {
    /// The consumer.
    pub consumer: String,
    /// Duplicates answered from their records.
    pub duplicates: u64,
    /// How many fell in each of [`DuplicateSummary::AGE_BUCKETS`], and (last) how many were
    /// older.
    pub ages: Vec<u64>,
    /// The oldest duplicate's age.
    pub max_age: Duration,
    /// Late duplicates: copies processed again because their record had expired or been
    /// deleted.
    pub late: u64,
    /// Of them, those the digest of deleted keys recognised, false alarms included.
    pub late_deleted: u64,
    /// How many false alarms the digest was expected to give over the keys it checked (each
    /// check errs at the rate of a full filter times the filters checked): `late_deleted`
    /// well above it says the late duplicates are real.
    pub expected_false_alarms: f64,
    /// The longest redelivery window its processes were configured with
    /// ([`InboxBuilder::redelivery_window`](crate::InboxBuilder::redelivery_window)), if one was.
    pub redelivery_window: Option<Duration>,
    /// Since when the counts run (the earliest process's start).
    pub since: Option<SystemTime>,
    /// When a process last wrote them.
    pub updated: Option<SystemTime>,
}

impl DuplicateSummary {
    /// The upper bounds, in seconds, of the age buckets duplicates are counted in (a last
    /// bucket holds the older ones): a second, a minute, ten minutes, an hour, six hours, a
    /// day, three days, a week, two weeks.
    pub const AGE_BUCKETS: [u64; 9] = [
        1, 60, 600, 3_600, 21_600, 86_400, 259_200, 604_800, 1_209_600,
    ];

    /// The smallest age bound under which at least `share` (0 to 1) of the duplicates came,
    /// `None` when they came later than every bound (or there were none).
    pub fn age_below(&self, share: f64) -> Option<Duration> {
        let wanted = (self.duplicates as f64 * share).ceil() as u64;
        let mut seen = 0;
        for (bound, count) in AGE_BUCKETS.iter().zip(&self.ages) {
            seen += count;
            if seen >= wanted && self.duplicates > 0 {
                return Some(Duration::from_secs(*bound));
            }
        }
        None
    }
}

/// One consumer's counts in this process.
#[derive(Debug, Clone, Default)]
struct Counts {
    duplicates: u64,
    ages: [u64; AGE_BUCKETS.len() + 1],
    max_age_ms: u64,
    late: u64,
    late_deleted: u64,
    /// Expected false alarms, in millionths.
    expected_micros: u64,
    /// Changed since last written.
    dirty: bool,
}

/// This process's counts, by consumer, and who it is in the table.
#[derive(Debug)]
pub(super) struct Summaries {
    instance: String,
    since_ms: i64,
    /// The inbox's redelivery window, written with each row.
    redelivery_ms: Option<i64>,
    counts: Mutex<HashMap<String, Counts>>,
}

impl Summaries {
    /// This process's summaries, of an inbox configured with `redelivery` as its window.
    pub(super) fn new(redelivery: Option<Duration>) -> Self {
        Self {
            instance: uuid::Uuid::new_v4().to_string(),
            since_ms: now_ms(),
            redelivery_ms: redelivery
                .map(|window| i64::try_from(window.as_millis()).unwrap_or(i64::MAX)),
            counts: Mutex::default(),
        }
    }

    fn update(&self, consumer: &str, change: impl FnOnce(&mut Counts)) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let counts = counts.entry(consumer.to_owned()).or_default();
        change(counts);
        counts.dirty = true;
    }

    /// Counts a duplicate `age` after its record was completed.
    pub(super) fn duplicate(&self, consumer: &str, age: Option<Duration>) {
        let age = age.unwrap_or_default();
        let bucket = AGE_BUCKETS
            .iter()
            .position(|bound| age.as_secs_f64() <= *bound as f64)
            .unwrap_or(AGE_BUCKETS.len());
        let age_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
        self.update(consumer, |counts| {
            counts.duplicates += 1;
            counts.ages[bucket] += 1;
            counts.max_age_ms = counts.max_age_ms.max(age_ms);
        });
    }

    /// Counts a late duplicate, one the digest recognised when `deleted`.
    pub(super) fn late(&self, consumer: &str, deleted: bool) {
        self.update(consumer, |counts| {
            counts.late += 1;
            counts.late_deleted += u64::from(deleted);
        });
    }

    /// Counts a fresh key checked against the digest, which errs on it with probability
    /// `false_alarm`.
    pub(super) fn checked(&self, consumer: &str, false_alarm: f64) {
        let micros = (false_alarm * 1e6).round() as u64;
        self.update(consumer, |counts| counts.expected_micros += micros);
    }

    /// Writes the counts that changed, a row per consumer for this process.
    pub(super) async fn flush(&self, store: &Store, db: &DatabaseConnection) -> Result<(), DbErr> {
        // The rows of processes silent for three months go: their counts are that old.
        let table = companion(store.backend(), store.table(), DUPLICATES);
        let prune = store
            .dialect()
            .placeholders(&format!("DELETE FROM {table} WHERE updated_ms < ?"));
        let stale = Value::from(now_ms() - STALE_AFTER_MS);
        db.execute_raw(store.statement(&prune, vec![stale])).await?;
        let changed: Vec<(String, Counts)> = {
            let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
            (counts.iter_mut())
                .filter(|(_, counts)| counts.dirty)
                .map(|(consumer, counts)| {
                    counts.dirty = false;
                    (consumer.clone(), counts.clone())
                })
                .collect()
        };
        let mut changed = changed.into_iter();
        while let Some((consumer, counts)) = changed.next() {
            if let Err(error) = self.write(store, db, &consumer, &counts).await {
                // Written at the next flush, with those after it.
                self.update(&consumer, |_| {});
                for (consumer, _) in changed {
                    self.update(&consumer, |_| {});
                }
                return Err(error);
            }
        }
        Ok(())
    }

    async fn write(
        &self,
        store: &Store,
        db: &DatabaseConnection,
        consumer: &str,
        counts: &Counts,
    ) -> Result<(), DbErr> {
        let dialect = store.dialect();
        let table = companion(store.backend(), store.table(), DUPLICATES);
        let ages: Vec<String> = counts.ages.iter().map(u64::to_string).collect();
        let int = |n: u64| Value::from(i64::try_from(n).unwrap_or(i64::MAX));
        let values = vec![
            Value::from(now_ms()),
            int(counts.duplicates),
            Value::from(ages.join(",")),
            int(counts.max_age_ms),
            int(counts.late),
            int(counts.late_deleted),
            int(counts.expected_micros),
            Value::from(self.redelivery_ms),
            Value::from(consumer.to_owned()),
            Value::from(self.instance.clone()),
        ];
        let update = dialect.placeholders(&format!(
            "UPDATE {table} SET updated_ms = ?, duplicates = ?, ages = ?, max_age_ms = ?, \
             late = ?, late_deleted = ?, false_alarms_micros = ?, window_ms = ? \
             WHERE consumer = ? AND instance = ?"
        ));
        let updated = db
            .execute_raw(store.statement(&update, values.clone()))
            .await?;
        if updated.rows_affected() > 0 {
            return Ok(());
        }
        let insert = dialect.placeholders(&format!(
            "INSERT INTO {table} (updated_ms, duplicates, ages, max_age_ms, late, late_deleted, \
             false_alarms_micros, window_ms, consumer, instance, since_ms) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        ));
        let mut values = values;
        values.push(Value::from(self.since_ms));
        db.execute_raw(store.statement(&insert, values)).await?;
        Ok(())
    }
}

/// Every consumer's summary, the rows of all processes summed, by consumer name.
pub(crate) async fn read_all(
    store: &Store,
    db: &DatabaseConnection,
) -> Result<Vec<DuplicateSummary>, DbErr> {
    let table = companion(store.backend(), store.table(), DUPLICATES);
    let sql = format!(
        "SELECT consumer, duplicates, ages, max_age_ms, late, since_ms, updated_ms, \
         late_deleted, false_alarms_micros, window_ms FROM {table}"
    );
    let rows = db.query_all_raw(store.statement(&sql, Vec::new())).await?;
    let mut all: HashMap<String, DuplicateSummary> = HashMap::new();
    for row in &rows {
        let consumer = store.read_key(row, 0)?;
        let summary = all
            .entry(consumer.clone())
            .or_insert_with(|| DuplicateSummary {
                consumer,
                ages: vec![0; AGE_BUCKETS.len() + 1],
                ..DuplicateSummary::default()
            });
        let count = |index: usize| -> Result<u64, DbErr> {
            Ok(u64::try_from(row.try_get_by_index::<i64>(index)?).unwrap_or(0))
        };
        summary.duplicates += count(1)?;
        let ages: String = row.try_get_by_index(2)?;
        for (total, count) in summary.ages.iter_mut().zip(ages.split(',')) {
            *total += count.parse::<u64>().unwrap_or(0);
        }
        summary.max_age = summary.max_age.max(Duration::from_millis(count(3)?));
        summary.late += count(4)?;
        summary.late_deleted += count(7)?;
        summary.expected_false_alarms += count(8)? as f64 / 1e6;
        if let Some(window) = row.try_get_by_index::<Option<i64>>(9)? {
            let window = Duration::from_millis(u64::try_from(window).unwrap_or(0));
            summary.redelivery_window =
                Some(summary.redelivery_window.map_or(window, |w| w.max(window)));
        }
        let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
        let (since, updated) = (at(count(5)?), at(count(6)?));
        summary.since = Some(summary.since.map_or(since, |s| s.min(since)));
        summary.updated = Some(summary.updated.map_or(updated, |u| u.max(updated)));
    }
    let mut all: Vec<_> = all.into_values().collect();
    all.sort_by(|a, b| a.consumer.cmp(&b.consumer));
    Ok(all)
}

/// Milliseconds since the Unix epoch, by this process's clock.
pub(super) fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

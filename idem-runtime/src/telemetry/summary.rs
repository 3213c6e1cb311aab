//! Each consumer's duplicates as its processes wrote them, a row per consumer and day
//! (`<inbox>_dup_daily`, see [`daily`](super::daily)), read back and summed over a window.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, QueryResult};

use super::counting::{AGE_BUCKETS, AGE_COLUMNS, DAY_MS, now_ms};
use crate::store::Store;
use crate::store::table::DUP_DAILY;

/// One consumer's duplicates, as every process that ran it wrote them, over the days read.
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
    /// The age of the oldest late duplicate whose record had expired (not yet deleted): how
    /// long before it its message was processed. None without one.
    pub late_expired_max_age: Option<Duration>,
    /// The age the oldest late duplicate the digest recognised had at least (the newest
    /// completion among the keys of the digest's piece that held it). None without one.
    pub late_deleted_max_age: Option<Duration>,
    /// How many false alarms the digest was expected to give over the keys it checked: the
    /// sum, over every check, of the false-positive probability of the pieces it read, from
    /// the keys each held. `late_deleted` well above it says the late duplicates are real.
    pub expected_false_alarms: f64,
    /// The retention the consumer's claims ran with, as the last process to write said (read
    /// whatever the window).
    pub retention: Option<Duration>,
    /// The longest redelivery window its processes were configured with
    /// ([`InboxBuilder::redelivery_window`](crate::InboxBuilder::redelivery_window)), if one was.
    pub redelivery_window: Option<Duration>,
    /// Since when the counts run (the first write of the earliest day read).
    pub since: Option<SystemTime>,
    /// When a process last wrote them.
    pub updated: Option<SystemTime>,
}

impl DuplicateSummary {
    /// The upper bounds, in seconds, of the age buckets duplicates are counted in (a last
    /// bucket holds the older ones): a second, a minute, ten minutes, an hour, six hours, a
    /// day, three days, a week, two weeks.
    pub const AGE_BUCKETS: [u64; 9] = AGE_BUCKETS;

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

    /// Late duplicates whose record had expired, not yet deleted: late for certain.
    pub fn late_expired(&self) -> u64 {
        self.late.saturating_sub(self.late_deleted)
    }

    fn new(consumer: String) -> Self {
        Self {
            consumer,
            ages: vec![0; AGE_BUCKETS.len() + 1],
            ..Self::default()
        }
    }
}

/// One row: a consumer's day.
struct Day {
    day_ms: i64,
    updated_ms: i64,
    retention_ms: Option<i64>,
}

/// Every consumer's summary, by consumer name: the days that end after `since` ago summed
/// (every day kept when `None`), the retention from the latest row that has one.
pub(crate) async fn read_all(
    store: &Store,
    db: &DatabaseConnection,
    since: Option<Duration>,
) -> Result<Vec<DuplicateSummary>, DbErr> {
    let table = store.companion(DUP_DAILY);
    let sql = format!(
        "SELECT consumer, day_ms, since_ms, updated_ms, duplicates, {AGE_COLUMNS}, max_age_ms, \
         late_expired, late_expired_max_age_ms, late_deleted, late_deleted_max_age_ms, \
         expected_false_alarms, retention_ms, window_ms FROM {table}"
    );
    let rows = db.query_all_raw(store.statement(&sql, Vec::new())).await?;
    let from_ms = since.map_or(i64::MIN, |since| {
        now_ms().saturating_sub(i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
    });
    let mut all: HashMap<String, (DuplicateSummary, Option<Day>)> = HashMap::new();
    for row in &rows {
        let consumer = store.read_key(row, 0)?;
        let (summary, latest) = all
            .entry(consumer.clone())
            .or_insert_with(|| (DuplicateSummary::new(consumer), None));
        let day = Day {
            day_ms: row.try_get_by_index(1)?,
            updated_ms: row.try_get_by_index(3)?,
            retention_ms: row.try_get_by_index(AGE_END + 6)?,
        };
        if day.day_ms + DAY_MS > from_ms {
            add_row(summary, row)?;
        }
        let later =
            |latest: &Day| (day.day_ms, day.updated_ms) > (latest.day_ms, latest.updated_ms);
        if day.retention_ms.is_some() && latest.as_ref().is_none_or(later) {
            *latest = Some(day);
        }
    }
    let mut all: Vec<DuplicateSummary> = (all.into_values())
        .map(|(mut summary, latest)| {
            summary.retention = (latest.and_then(|day| day.retention_ms)).map(duration_ms);
            summary
        })
        .collect();
    all.sort_by(|a, b| a.consumer.cmp(&b.consumer));
    Ok(all)
}

/// The column after the ages.
const AGE_END: usize = 5 + AGE_BUCKETS.len() + 1;

/// Adds one day's row to `summary`.
fn add_row(summary: &mut DuplicateSummary, row: &QueryResult) -> Result<(), DbErr> {
    let count = |index: usize| -> Result<u64, DbErr> {
        Ok(u64::try_from(row.try_get_by_index::<i64>(index)?).unwrap_or(0))
    };
    let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
    let (since, updated) = (at(count(2)?), at(count(3)?));
    summary.since = Some(summary.since.map_or(since, |s| s.min(since)));
    summary.updated = Some(summary.updated.map_or(updated, |u| u.max(updated)));
    summary.duplicates += count(4)?;
    for (bucket, total) in summary.ages.iter_mut().enumerate() {
        *total += count(5 + bucket)?;
    }
    let longest = |kept: &mut Duration, index: usize| -> Result<(), DbErr> {
        *kept = (*kept).max(Duration::from_millis(count(index)?));
        Ok(())
    };
    longest(&mut summary.max_age, AGE_END)?;
    let (expired, deleted) = (count(AGE_END + 1)?, count(AGE_END + 3)?);
    summary.late += expired + deleted;
    summary.late_deleted += deleted;
    let oldest = |kept: &mut Option<Duration>, late: u64, index: usize| -> Result<(), DbErr> {
        if late > 0 {
            let age = Duration::from_millis(count(index)?);
            *kept = Some(kept.map_or(age, |kept| kept.max(age)));
        }
        Ok(())
    };
    oldest(&mut summary.late_expired_max_age, expired, AGE_END + 2)?;
    oldest(&mut summary.late_deleted_max_age, deleted, AGE_END + 4)?;
    summary.expected_false_alarms += row.try_get_by_index::<f64>(AGE_END + 5)?;
    if let Some(window) = row.try_get_by_index::<Option<i64>>(AGE_END + 7)? {
        let window = duration_ms(window);
        summary.redelivery_window =
            Some(summary.redelivery_window.map_or(window, |w| w.max(window)));
    }
    Ok(())
}

fn duration_ms(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

//! Each consumer's duplicates as this process sees them: counted in memory since its last
//! write, then added, when its cleaner task looks at the table, to the consumer's row of the
//! day (`<inbox>_dup_daily`). One row per consumer and day whatever the number of processes or
//! of their starts; rows older than [`HORIZON_MS`] are deleted.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, SqlErr, Value};

use super::counting::{AGE_BUCKETS, AGE_COLUMNS, DAY_MS, now_ms};
use crate::store::Store;
use crate::store::table::DUP_DAILY;

/// How long a day's row is kept: 90 days.
const HORIZON_MS: i64 = 90 * DAY_MS;

const AGES: usize = AGE_BUCKETS.len() + 1;

/// Counts that add up: what one process saw of one consumer since it last wrote them.
#[derive(Debug, Clone, Default)]
struct Counts {
    duplicates: u64,
    ages: [u64; AGES],
    max_age_ms: u64,
    late_expired: u64,
    late_expired_max_age_ms: u64,
    late_deleted: u64,
    late_deleted_max_age_ms: u64,
    expected_false_alarms: f64,
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        self.duplicates += other.duplicates;
        for (total, count) in self.ages.iter_mut().zip(other.ages) {
            *total += count;
        }
        self.max_age_ms = self.max_age_ms.max(other.max_age_ms);
        self.late_expired += other.late_expired;
        self.late_expired_max_age_ms =
            (self.late_expired_max_age_ms).max(other.late_expired_max_age_ms);
        self.late_deleted += other.late_deleted;
        self.late_deleted_max_age_ms =
            (self.late_deleted_max_age_ms).max(other.late_deleted_max_age_ms);
        self.expected_false_alarms += other.expected_false_alarms;
    }
}

/// What this process knows of one consumer.
#[derive(Debug, Default)]
struct Seen {
    unwritten: Counts,
    /// The retention of its latest claim.
    retention_ms: Option<i64>,
    /// Whether anything changed since the last write.
    dirty: bool,
}

/// This process's counts, by consumer.
#[derive(Debug)]
pub(super) struct Daily {
    /// The inbox's redelivery window, written with each row.
    redelivery_ms: Option<i64>,
    consumers: Mutex<HashMap<String, Seen>>,
    /// The day whose old rows were last deleted.
    pruned_day: Mutex<i64>,
}

impl Daily {
    /// This process's counts, of an inbox configured with `redelivery` as its window.
    pub(super) fn new(redelivery: Option<Duration>) -> Self {
        Self {
            redelivery_ms: redelivery.map(ms),
            consumers: Mutex::default(),
            pruned_day: Mutex::new(i64::MIN),
        }
    }

    fn update(&self, consumer: &str, change: impl FnOnce(&mut Seen)) {
        let mut consumers = self.consumers.lock().unwrap_or_else(|e| e.into_inner());
        let seen = seen_mut(&mut consumers, consumer);
        change(seen);
        seen.dirty = true;
    }

    /// Counts a duplicate `age` after its record was completed.
    pub(super) fn duplicate(&self, consumer: &str, age: Option<Duration>) {
        let age = age.unwrap_or_default();
        let bucket = AGE_BUCKETS
            .iter()
            .position(|bound| age.as_secs_f64() <= *bound as f64)
            .unwrap_or(AGE_BUCKETS.len());
        let age_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
        self.update(consumer, |seen| {
            let counts = &mut seen.unwritten;
            counts.duplicates += 1;
            counts.ages[bucket] += 1;
            counts.max_age_ms = counts.max_age_ms.max(age_ms);
        });
    }

    /// Notes a claim made with `retention`, checked against the digest, which errs on it with
    /// probability `false_alarm`.
    pub(super) fn claimed(&self, consumer: &str, retention: Duration, false_alarm: f64) {
        let retention_ms = Some(ms(retention));
        let mut consumers = self.consumers.lock().unwrap_or_else(|e| e.into_inner());
        let seen = seen_mut(&mut consumers, consumer);
        // Written when it changes, or with the next counts.
        seen.dirty |= seen.retention_ms != retention_ms || false_alarm > 0.0;
        seen.retention_ms = retention_ms;
        seen.unwritten.expected_false_alarms += false_alarm;
    }

    /// Counts a late duplicate whose record had expired, processed `age` before.
    pub(super) fn late_expired(&self, consumer: &str, age: Duration) {
        let age_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
        self.update(consumer, |seen| {
            let counts = &mut seen.unwritten;
            counts.late_expired += 1;
            counts.late_expired_max_age_ms = counts.late_expired_max_age_ms.max(age_ms);
        });
    }

    /// Counts a late duplicate the digest recognised, processed at least `age` before.
    pub(super) fn late_deleted(&self, consumer: &str, age: Duration) {
        let age_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
        self.update(consumer, |seen| {
            let counts = &mut seen.unwritten;
            counts.late_deleted += 1;
            counts.late_deleted_max_age_ms = counts.late_deleted_max_age_ms.max(age_ms);
        });
    }

    /// Adds what changed to each consumer's row of the day, and deletes the rows past the
    /// horizon once a day. Counts that could not be written are kept for the next time (a
    /// write whose success was lost on the way, a connection cut after its commit, counts
    /// twice).
    pub(super) async fn flush(&self, store: &Store, db: &DatabaseConnection) -> Result<(), DbErr> {
        let now = now_ms();
        let today = now - now.rem_euclid(DAY_MS);
        self.prune(store, db, today).await?;
        let changed: Vec<(String, Counts, Option<i64>)> = {
            let mut consumers = self.consumers.lock().unwrap_or_else(|e| e.into_inner());
            (consumers.iter_mut())
                .filter(|(_, seen)| seen.dirty)
                .map(|(consumer, seen)| {
                    seen.dirty = false;
                    let counts = std::mem::take(&mut seen.unwritten);
                    (consumer.clone(), counts, seen.retention_ms)
                })
                .collect()
        };
        let mut changed = changed.into_iter();
        while let Some((consumer, counts, retention_ms)) = changed.next() {
            let row = Row {
                consumer: &consumer,
                day_ms: today,
                now_ms: now,
                counts: &counts,
                retention_ms,
                window_ms: self.redelivery_ms,
            };
            if let Err(error) = row.add_to(store, db).await {
                // Kept for the next time, with the counts not tried yet.
                self.update(&consumer, |seen| seen.unwritten.add(&counts));
                for (consumer, counts, _) in changed {
                    self.update(&consumer, |seen| seen.unwritten.add(&counts));
                }
                return Err(error);
            }
        }
        Ok(())
    }

    /// Deletes the rows past the horizon, at the first flush of each day.
    async fn prune(&self, store: &Store, db: &DatabaseConnection, today: i64) -> Result<(), DbErr> {
        if *self.pruned_day.lock().unwrap_or_else(|e| e.into_inner()) == today {
            return Ok(());
        }
        let sql = store
            .dialect()
            .placeholders(&format!("DELETE FROM {} WHERE day_ms < ?", table(store)));
        let oldest = Value::from(today - HORIZON_MS);
        db.execute_raw(store.statement(&sql, vec![oldest])).await?;
        *self.pruned_day.lock().unwrap_or_else(|e| e.into_inner()) = today;
        Ok(())
    }
}

/// What is known of `consumer`, without a new key for each message.
fn seen_mut<'a>(consumers: &'a mut HashMap<String, Seen>, consumer: &str) -> &'a mut Seen {
    if !consumers.contains_key(consumer) {
        consumers.insert(consumer.to_owned(), Seen::default());
    }
    consumers.get_mut(consumer).expect("inserted above")
}

/// One process's counts of a consumer, for its row of the day.
struct Row<'a> {
    consumer: &'a str,
    day_ms: i64,
    now_ms: i64,
    counts: &'a Counts,
    retention_ms: Option<i64>,
    window_ms: Option<i64>,
}

impl Row<'_> {
    /// Adds the counts to the row, inserting it when it is not there (and adding to it after
    /// all when another process inserted it meanwhile).
    async fn add_to(&self, store: &Store, db: &DatabaseConnection) -> Result<(), DbErr> {
        if self.update(store, db).await? {
            return Ok(());
        }
        match self.insert(store, db).await {
            Err(error) if matches!(error.sql_err(), Some(SqlErr::UniqueConstraintViolation(_))) => {
                self.update(store, db).await.map(drop)
            }
            inserted => inserted,
        }
    }

    /// Whether the row was there.
    async fn update(&self, store: &Store, db: &DatabaseConnection) -> Result<bool, DbErr> {
        let counts = self.counts;
        let ages: Vec<String> = (0..AGES)
            .map(|i| format!("age_{i} = age_{i} + ?"))
            .collect();
        let larger =
            |column: &str| format!("{column} = CASE WHEN {column} < ? THEN ? ELSE {column} END");
        let sql = format!(
            "UPDATE {} SET updated_ms = ?, duplicates = duplicates + ?, {}, {}, \
             late_expired = late_expired + ?, {}, late_deleted = late_deleted + ?, {}, \
             expected_false_alarms = expected_false_alarms + ?, \
             retention_ms = COALESCE(?, retention_ms), \
             window_ms = CASE WHEN window_ms IS NULL OR window_ms < ? THEN ? ELSE window_ms END \
             WHERE consumer = ? AND day_ms = ?",
            table(store),
            ages.join(", "),
            larger("max_age_ms"),
            larger("late_expired_max_age_ms"),
            larger("late_deleted_max_age_ms"),
        );
        let mut values = vec![Value::from(self.now_ms), int(counts.duplicates)];
        values.extend(counts.ages.iter().map(|&count| int(count)));
        values.extend([int(counts.max_age_ms), int(counts.max_age_ms)]);
        values.push(int(counts.late_expired));
        let expired_age = counts.late_expired_max_age_ms;
        values.extend([int(expired_age), int(expired_age)]);
        values.push(int(counts.late_deleted));
        let deleted_age = counts.late_deleted_max_age_ms;
        values.extend([int(deleted_age), int(deleted_age)]);
        values.push(Value::from(counts.expected_false_alarms));
        values.push(Value::from(self.retention_ms));
        values.extend([Value::from(self.window_ms), Value::from(self.window_ms)]);
        values.extend([
            Value::from(self.consumer.to_owned()),
            Value::from(self.day_ms),
        ]);
        let sql = store.dialect().placeholders(&sql);
        let updated = db.execute_raw(store.statement(&sql, values)).await?;
        Ok(updated.rows_affected() > 0)
    }

    async fn insert(&self, store: &Store, db: &DatabaseConnection) -> Result<(), DbErr> {
        let counts = self.counts;
        let sql = format!(
            "INSERT INTO {} (consumer, day_ms, since_ms, updated_ms, duplicates, {AGE_COLUMNS}, \
             max_age_ms, late_expired, late_expired_max_age_ms, late_deleted, \
             late_deleted_max_age_ms, expected_false_alarms, retention_ms, window_ms) \
             VALUES ({})",
            table(store),
            vec!["?"; 13 + AGES].join(", ")
        );
        let mut values = vec![
            Value::from(self.consumer.to_owned()),
            Value::from(self.day_ms),
            Value::from(self.now_ms),
            Value::from(self.now_ms),
            int(counts.duplicates),
        ];
        values.extend(counts.ages.iter().map(|&count| int(count)));
        values.extend([
            int(counts.max_age_ms),
            int(counts.late_expired),
            int(counts.late_expired_max_age_ms),
            int(counts.late_deleted),
            int(counts.late_deleted_max_age_ms),
            Value::from(counts.expected_false_alarms),
            Value::from(self.retention_ms),
            Value::from(self.window_ms),
        ]);
        let sql = store.dialect().placeholders(&sql);
        db.execute_raw(store.statement(&sql, values)).await?;
        Ok(())
    }
}

fn int(n: u64) -> Value {
    Value::from(i64::try_from(n).unwrap_or(i64::MAX))
}

fn ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

fn table(store: &Store) -> String {
    store.companion(DUP_DAILY)
}

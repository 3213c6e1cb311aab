//! The digests of the keys the cleaner deleted: per consumer, a run of Bloom filters
//! (generations), each begun when the last one filled, kept while it was written to within the
//! window. The cleaner that holds the table's lock adds its deletions; every process reads them
//! back.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, QueryResult, Value};

use super::bloom::{Bloom, CAPACITY, Positions};
use super::summary::now_ms;
use crate::key::InboxKey;
use crate::store::table::{DIGEST, companion};
use crate::store::{Deleted, Store};

/// How far back a refresh reads again, for writers whose clocks run behind this one's.
const CLOCK_SLACK_MS: i64 = 300_000;

/// The most filters kept per consumer (4 MiB, 1.6 million deleted keys): past them the
/// oldest go, and the digest covers less than its window rather than err more (each filter
/// adds its false-positive rate to every check).
pub(crate) const MAX_FILTERS: usize = 32;

/// The keys of one consumer the cleaner deleted from `period_ms` on, until it filled.
#[derive(Debug, Clone)]
pub(crate) struct Generation {
    consumer: String,
    period_ms: i64,
    updated_ms: i64,
    key_count: u64,
    bloom: Bloom,
}

impl Generation {
    fn new(consumer: &str, period_ms: i64) -> Self {
        Self {
            consumer: consumer.to_owned(),
            period_ms,
            updated_ms: period_ms,
            key_count: 0,
            bloom: Bloom::default(),
        }
    }

    fn read(store: &Store, row: &QueryResult) -> Result<Self, DbErr> {
        let bits: Vec<u8> = row.try_get_by_index(3)?;
        Ok(Self {
            consumer: store.read_key(row, 0)?,
            period_ms: row.try_get_by_index(1)?,
            key_count: u64::try_from(row.try_get_by_index::<i64>(2)?).unwrap_or(0),
            bloom: Bloom::from_bytes(&bits)
                .ok_or_else(|| DbErr::Custom("a digest that is not one".into()))?,
            updated_ms: row.try_get_by_index(4)?,
        })
    }

    fn is_full(&self) -> bool {
        self.key_count >= CAPACITY
    }
}

const COLUMNS: &str = "consumer, period_ms, key_count, bits, updated_ms";

/// This process's copy of the digests, by consumer: at most [`MAX_FILTERS`] each.
#[derive(Debug)]
pub(super) struct Digests {
    window: Duration,
    by_consumer: RwLock<HashMap<String, Vec<Generation>>>,
    /// The latest write read back, by its writer's clock.
    seen_ms: Mutex<i64>,
}

/// What a check of a fresh key found.
#[derive(Debug, Clone, Copy)]
pub(super) struct Check {
    /// Whether a filter holds the key.
    pub(super) hit: bool,
    /// How many filters it was checked against.
    pub(super) filters: usize,
}

impl Digests {
    pub(super) fn new(window: Duration) -> Self {
        Self {
            window,
            by_consumer: RwLock::default(),
            seen_ms: Mutex::new(0),
        }
    }

    /// How long a generation is kept after its last write.
    pub(super) fn window(&self) -> Duration {
        self.window
    }

    /// Checks whether `key` may be among the deleted keys of its consumer (its key hashed
    /// once, whatever the number of filters).
    pub(super) fn check(&self, key: &InboxKey) -> Check {
        let consumer = key.consumer.as_str();
        let by_consumer = self.by_consumer.read().unwrap_or_else(|e| e.into_inner());
        let Some(generations) = by_consumer.get(consumer) else {
            return Check {
                hit: false,
                filters: 0,
            };
        };
        let positions = Positions::of(consumer, key.message_key.as_str());
        Check {
            hit: generations.iter().any(|g| g.bloom.contains(&positions)),
            filters: generations.len(),
        }
    }

    /// Reads the generations written since the last look, and forgets those past the window.
    pub(super) async fn refresh(
        &self,
        store: &Store,
        db: &DatabaseConnection,
    ) -> Result<(), DbErr> {
        let since = *self.seen_ms.lock().unwrap_or_else(|e| e.into_inner()) - CLOCK_SLACK_MS;
        let table = companion(store.backend(), store.table(), DIGEST);
        let sql = store.dialect().placeholders(&format!(
            "SELECT {COLUMNS} FROM {table} WHERE updated_ms > ?"
        ));
        let values = vec![Value::from(since)];
        let rows = db.query_all_raw(store.statement(&sql, values)).await?;
        let read: Vec<Generation> = (rows.iter())
            .map(|row| Generation::read(store, row))
            .collect::<Result<_, _>>()?;
        if let Some(latest) = read.iter().map(|g| g.updated_ms).max() {
            let mut seen = self.seen_ms.lock().unwrap_or_else(|e| e.into_inner());
            *seen = (*seen).max(latest);
        }
        self.keep(read);
        Ok(())
    }

    /// Keeps `generations`, replacing this process's copies of them, and forgets those past
    /// the window or beyond [`MAX_FILTERS`].
    pub(super) fn keep(&self, generations: Vec<Generation>) {
        let oldest = now_ms() - window_ms(self.window);
        let mut by_consumer = self.by_consumer.write().unwrap_or_else(|e| e.into_inner());
        for generation in generations {
            let kept = by_consumer.entry(generation.consumer.clone()).or_default();
            kept.retain(|g| g.period_ms != generation.period_ms);
            kept.push(generation);
        }
        for kept in by_consumer.values_mut() {
            kept.retain(|g| g.updated_ms >= oldest);
            kept.sort_by_key(|g| std::cmp::Reverse(g.period_ms));
            kept.truncate(MAX_FILTERS);
        }
        by_consumer.retain(|_, kept| !kept.is_empty());
    }
}

/// The deletions of one cleaner run, added as they come to each consumer's open generation
/// (read from the table at the consumer's first deletion); full generations are written at
/// once, the open ones by [`DigestRun::write`].
#[derive(Debug, Default)]
pub(crate) struct DigestRun {
    open: HashMap<String, Generation>,
    written: Vec<Generation>,
}

impl DigestRun {
    /// Adds the processed messages among `deleted`.
    pub(crate) async fn add(
        &mut self,
        store: &Store,
        db: &DatabaseConnection,
        deleted: &[Deleted],
    ) -> Result<(), DbErr> {
        for record in deleted.iter().filter(|record| record.completed) {
            if !self.open.contains_key(&record.consumer) {
                let open = latest(store, db, &record.consumer).await?;
                self.open.insert(record.consumer.clone(), open);
            }
            let open = self.open.get_mut(&record.consumer).expect("inserted above");
            if open.is_full() {
                let next = Generation::new(&record.consumer, (open.period_ms + 1).max(now_ms()));
                let full = std::mem::replace(open, next);
                write(store, db, &full).await?;
                self.written.push(full);
            }
            let open = self.open.get_mut(&record.consumer).expect("inserted above");
            open.bloom.insert(&record.consumer, &record.key);
            open.key_count += 1;
        }
        Ok(())
    }

    /// Writes the open generations, and drops those past the `window`; returns every
    /// generation this run wrote.
    pub(super) async fn write(
        mut self,
        store: &Store,
        db: &DatabaseConnection,
        window: Duration,
    ) -> Result<Vec<Generation>, DbErr> {
        for (consumer, open) in self.open.drain() {
            write(store, db, &open).await?;
            self.written.push(open);
            drop_beyond_cap(store, db, &consumer).await?;
        }
        let table = companion(store.backend(), store.table(), DIGEST);
        let sql = store
            .dialect()
            .placeholders(&format!("DELETE FROM {table} WHERE updated_ms < ?"));
        let oldest = Value::from(now_ms() - window_ms(window));
        db.execute_raw(store.statement(&sql, vec![oldest])).await?;
        Ok(self.written)
    }
}

/// Deletes the consumer's generations older than its [`MAX_FILTERS`] newest.
async fn drop_beyond_cap(
    store: &Store,
    db: &DatabaseConnection,
    consumer: &str,
) -> Result<(), DbErr> {
    let table = companion(store.backend(), store.table(), DIGEST);
    let dialect = store.dialect();
    let oldest_kept = dialect.placeholders(&format!(
        "SELECT period_ms FROM {table} WHERE consumer = ? ORDER BY period_ms DESC \
         LIMIT 1 OFFSET {}",
        MAX_FILTERS - 1
    ));
    let consumer = Value::from(consumer.to_owned());
    let row = db
        .query_one_raw(store.statement(&oldest_kept, vec![consumer.clone()]))
        .await?;
    let Some(row) = row else { return Ok(()) };
    let oldest: i64 = row.try_get_by_index(0)?;
    let delete = dialect.placeholders(&format!(
        "DELETE FROM {table} WHERE consumer = ? AND period_ms < ?"
    ));
    let values = vec![consumer, Value::from(oldest)];
    db.execute_raw(store.statement(&delete, values)).await?;
    Ok(())
}

/// The consumer's latest generation, or a new one when it has none or it is full.
async fn latest(
    store: &Store,
    db: &DatabaseConnection,
    consumer: &str,
) -> Result<Generation, DbErr> {
    let table = companion(store.backend(), store.table(), DIGEST);
    let sql = store.dialect().placeholders(&format!(
        "SELECT {COLUMNS} FROM {table} WHERE consumer = ? ORDER BY period_ms DESC LIMIT 1"
    ));
    let row = db
        .query_one_raw(store.statement(&sql, vec![Value::from(consumer.to_owned())]))
        .await?;
    let now = now_ms();
    Ok(
        match row.map(|row| Generation::read(store, &row)).transpose()? {
            Some(latest) if !latest.is_full() => latest,
            Some(full) => Generation::new(consumer, (full.period_ms + 1).max(now)),
            None => Generation::new(consumer, now),
        },
    )
}

/// Writes `generation` (its bits and count), inserting it when it is new.
async fn write(
    store: &Store,
    db: &DatabaseConnection,
    generation: &Generation,
) -> Result<(), DbErr> {
    let table = companion(store.backend(), store.table(), DIGEST);
    let dialect = store.dialect();
    let values = vec![
        Value::from(i64::try_from(generation.key_count).unwrap_or(i64::MAX)),
        Value::from(generation.bloom.to_bytes()),
        Value::from(now_ms()),
        Value::from(generation.consumer.clone()),
        Value::from(generation.period_ms),
    ];
    let update = dialect.placeholders(&format!(
        "UPDATE {table} SET key_count = ?, bits = ?, updated_ms = ? \
         WHERE consumer = ? AND period_ms = ?"
    ));
    let updated = db
        .execute_raw(store.statement(&update, values.clone()))
        .await?;
    if updated.rows_affected() == 0 {
        let insert = dialect.placeholders(&format!(
            "INSERT INTO {table} (key_count, bits, updated_ms, consumer, period_ms) \
             VALUES (?, ?, ?, ?, ?)"
        ));
        db.execute_raw(store.statement(&insert, values)).await?;
    }
    Ok(())
}

fn window_ms(window: Duration) -> i64 {
    i64::try_from(window.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{ConsumerName, MessageKey};

    fn key(consumer: &str, key: &str) -> InboxKey {
        InboxKey {
            consumer: ConsumerName::new(consumer).unwrap(),
            message_key: MessageKey::new(key).unwrap(),
        }
    }

    /// A digest at its full size (every filter kept full) takes at most one fresh key in
    /// 100 000 for a deleted one: over a million fresh keys, at most ten (about two expected).
    #[test]
    fn a_full_digest_takes_at_most_one_fresh_key_in_100_000_for_a_deleted_one() {
        let digests = Digests::new(Duration::from_secs(86_400));
        let now = now_ms();
        let generations = (0..MAX_FILTERS)
            .map(|g| {
                let mut generation = Generation::new("c", now + g as i64);
                for i in 0..CAPACITY {
                    generation.bloom.insert("c", &format!("deleted-{g}-{i}"));
                }
                generation.key_count = CAPACITY;
                generation
            })
            .collect();
        digests.keep(generations);
        let fresh = 1_000_000;
        let hits = (0..fresh)
            .filter(|i| digests.check(&key("c", &format!("fresh-{i}"))).hit)
            .count();
        assert!(
            hits <= fresh / 100_000,
            "{hits} of {fresh} fresh keys taken for deleted ones"
        );
    }
}

//! What one cleaner run adds to the digests: its deletions, gathered by consumer and piece, each
//! changed piece merged into its stored copy and written back, so that a run writes in
//! proportion to what it deleted (at most a filter's 128 pieces a consumer), not to the number
//! of consumers or the size of their filters.

use std::collections::HashMap;
use std::time::Duration;

use sea_orm::{DatabaseConnection, DbErr};

use super::super::bloom::{CAPACITY, Piece, Positions};
use super::super::counting::now_ms;
use super::stored::{
    MAX_FILTERS, StoredPiece, drop_beyond, drop_unwritten_since, latest_filter, window_ms,
};
use crate::store::{Deleted, Store};

/// The deletions of one cleaner run, added as they come to each consumer's open filter (its
/// latest, read from the table at the consumer's first deletion, or a new one); a filter that
/// fills is written at once, the open ones by [`DigestRun::write`].
#[derive(Debug, Default)]
pub(crate) struct DigestRun {
    open: HashMap<String, OpenFilter>,
    written: Vec<StoredPiece>,
}

/// A consumer's filter receiving this run's deletions.
#[derive(Debug)]
struct OpenFilter {
    period_ms: i64,
    /// The keys it holds, stored and added.
    key_count: u64,
    added: HashMap<usize, Added>,
}

/// What this run added to one piece.
#[derive(Debug, Default)]
struct Added {
    bits: Piece,
    keys: u64,
    newest_completed_ms: i64,
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
            let consumer = &record.consumer;
            if !self.open.contains_key(consumer) {
                let open = match latest_filter(store, db, consumer).await? {
                    Some((period_ms, key_count)) => OpenFilter::new(period_ms, key_count),
                    None => OpenFilter::new(now_ms(), 0),
                };
                self.open.insert(consumer.clone(), open);
            }
            let open = self.open.get_mut(consumer).expect("inserted above");
            if open.key_count >= CAPACITY {
                let next = OpenFilter::new((open.period_ms + 1).max(now_ms()), 0);
                let full = std::mem::replace(open, next);
                self.written.extend(full.save(store, db, consumer).await?);
            }
            // Unknown for a record without one: nothing is said of its age.
            let completed_at = record.completed_at.unwrap_or(i64::MAX);
            open.add(Positions::of(consumer, &record.key), completed_at);
        }
        Ok(())
    }

    /// Writes the open filters' changed pieces, and drops the filters beyond the cap or
    /// unwritten for the `window`; returns every piece this run wrote.
    pub(in super::super) async fn write(
        mut self,
        store: &Store,
        db: &DatabaseConnection,
        window: Duration,
    ) -> Result<Vec<StoredPiece>, DbErr> {
        for (consumer, open) in std::mem::take(&mut self.open) {
            self.written.extend(open.save(store, db, &consumer).await?);
            drop_beyond(store, db, &consumer, MAX_FILTERS).await?;
        }
        drop_unwritten_since(store, db, now_ms() - window_ms(window)).await?;
        Ok(self.written)
    }
}

impl OpenFilter {
    fn new(period_ms: i64, key_count: u64) -> Self {
        Self {
            period_ms,
            key_count,
            added: HashMap::new(),
        }
    }

    fn add(&mut self, positions: Positions, completed_at: i64) {
        let added = self.added.entry(positions.piece()).or_default();
        added.bits.insert(&positions);
        added.keys += 1;
        added.newest_completed_ms = added.newest_completed_ms.max(completed_at);
        self.key_count += 1;
    }

    /// Merges each changed piece into its stored copy and writes it; returns them as written.
    async fn save(
        self,
        store: &Store,
        db: &DatabaseConnection,
        consumer: &str,
    ) -> Result<Vec<StoredPiece>, DbErr> {
        let mut written = Vec::with_capacity(self.added.len());
        for (piece, added) in self.added {
            let stored = StoredPiece::find(store, db, consumer, self.period_ms, piece).await?;
            let exists = stored.is_some();
            let mut merged = stored.unwrap_or_else(|| StoredPiece {
                consumer: consumer.to_owned(),
                period_ms: self.period_ms,
                piece,
                key_count: 0,
                newest_completed_ms: i64::MIN,
                updated_ms: 0,
                bits: Piece::default(),
            });
            merged.bits.merge(&added.bits);
            merged.key_count += added.keys;
            merged.newest_completed_ms = merged.newest_completed_ms.max(added.newest_completed_ms);
            merged.updated_ms = now_ms();
            merged.save(store, db, exists).await?;
            written.push(merged);
        }
        Ok(written)
    }
}

//! The digests of the keys the cleaner deleted: per consumer, at most [`MAX_FILTERS`] Bloom
//! filters, each begun when the last one filled and kept while it was written to within the
//! window, each in pieces ([`bloom`](super::bloom)). The cleaner that holds the table's lock
//! adds its deletions ([`DigestRun`]), writing only the pieces they fall in; every process reads
//! the pieces written since its last look.

mod run;
mod stored;

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use sea_orm::{DatabaseConnection, DbErr};

use super::bloom::{PIECES, Piece, Positions, false_positive};
use super::counting::now_ms;
use crate::key::InboxKey;
use crate::store::Store;

pub(crate) use run::DigestRun;
use stored::{MAX_FILTERS, StoredPiece, window_ms};

/// How far back a refresh reads again, for writers whose clocks run behind this one's.
const CLOCK_SLACK_MS: i64 = 300_000;

/// One piece of a filter, as this process holds it.
#[derive(Debug)]
struct Held {
    bits: Piece,
    newest_completed_ms: i64,
    /// The probability that a check errs on this piece, from the keys it holds.
    false_positive: f64,
}

/// The keys of one consumer the cleaner deleted from `period_ms` on, until it filled.
#[derive(Debug)]
struct Filter {
    period_ms: i64,
    /// Its latest piece's write.
    updated_ms: i64,
    pieces: Vec<Option<Held>>,
}

impl Filter {
    fn new(period_ms: i64) -> Self {
        Self {
            period_ms,
            updated_ms: i64::MIN,
            pieces: (0..PIECES).map(|_| None).collect(),
        }
    }

    fn keep(&mut self, piece: StoredPiece) {
        self.updated_ms = self.updated_ms.max(piece.updated_ms);
        self.pieces[piece.piece] = Some(Held {
            false_positive: false_positive(piece.key_count),
            newest_completed_ms: piece.newest_completed_ms,
            bits: piece.bits,
        });
    }
}

/// This process's copy of the digests, by consumer, newest filter first.
#[derive(Debug)]
pub(super) struct Digests {
    window: Duration,
    by_consumer: RwLock<HashMap<String, Vec<Filter>>>,
    /// The latest write read back, by its writer's clock.
    seen_ms: Mutex<i64>,
}

/// What a check of a fresh key found.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Check {
    /// When a filter holds the key: the newest completion among the keys of the piece that
    /// holds it (the newest filter's), which the key's own came at or before.
    pub(super) completed_by_ms: Option<i64>,
    /// The probability that a fresh key is taken for a deleted one: the sum over the filters
    /// of their piece's rate.
    pub(super) false_alarm: f64,
}

impl Digests {
    pub(super) fn new(window: Duration) -> Self {
        Self {
            window,
            by_consumer: RwLock::default(),
            seen_ms: Mutex::new(0),
        }
    }

    /// How long a filter is kept after its last write.
    pub(super) fn window(&self) -> Duration {
        self.window
    }

    /// Checks whether `key` may be among the deleted keys of its consumer: its key hashed
    /// once, then one piece a filter, each left at its first bit unset.
    pub(super) fn check(&self, key: &InboxKey) -> Check {
        let consumer = key.consumer.as_str();
        let by_consumer = self.by_consumer.read().unwrap_or_else(|e| e.into_inner());
        let Some(filters) = by_consumer.get(consumer) else {
            return Check::default();
        };
        let positions = Positions::of(consumer, key.message_key.as_str());
        let mut check = Check::default();
        for filter in filters {
            let Some(held) = &filter.pieces[positions.piece()] else {
                continue;
            };
            check.false_alarm += held.false_positive;
            if check.completed_by_ms.is_none() && held.bits.contains(&positions) {
                check.completed_by_ms = Some(held.newest_completed_ms);
            }
        }
        check
    }

    /// Reads the pieces written since the last look, and forgets the filters past the window.
    pub(super) async fn refresh(
        &self,
        store: &Store,
        db: &DatabaseConnection,
    ) -> Result<(), DbErr> {
        let since = *self.seen_ms.lock().unwrap_or_else(|e| e.into_inner()) - CLOCK_SLACK_MS;
        let read = StoredPiece::written_since(store, db, since).await?;
        if let Some(latest) = read.iter().map(|piece| piece.updated_ms).max() {
            let mut seen = self.seen_ms.lock().unwrap_or_else(|e| e.into_inner());
            *seen = (*seen).max(latest);
        }
        self.keep(read);
        Ok(())
    }

    /// Keeps `pieces`, replacing this process's copies of them, and forgets the filters past
    /// the window or beyond [`MAX_FILTERS`].
    pub(super) fn keep(&self, pieces: Vec<StoredPiece>) {
        let oldest = now_ms() - window_ms(self.window);
        let mut by_consumer = self.by_consumer.write().unwrap_or_else(|e| e.into_inner());
        for piece in pieces {
            let filters = by_consumer.entry(piece.consumer.clone()).or_default();
            let at = match filters.iter().position(|f| f.period_ms == piece.period_ms) {
                Some(at) => at,
                None => {
                    filters.push(Filter::new(piece.period_ms));
                    filters.len() - 1
                }
            };
            filters[at].keep(piece);
        }
        for filters in by_consumer.values_mut() {
            filters.retain(|filter| filter.updated_ms >= oldest);
            filters.sort_by_key(|filter| std::cmp::Reverse(filter.period_ms));
            filters.truncate(MAX_FILTERS);
        }
        by_consumer.retain(|_, filters| !filters.is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::super::bloom::CAPACITY;
    use super::*;
    use crate::key::{ConsumerName, MessageKey};

    fn key(consumer: &str, key: &str) -> InboxKey {
        InboxKey {
            consumer: ConsumerName::new(consumer).unwrap(),
            message_key: MessageKey::new(key).unwrap(),
        }
    }

    /// The pieces of a filter of `consumer` begun at `period_ms`, holding `keys`, their
    /// messages processed at `completed_ms`.
    fn filter(
        consumer: &str,
        period_ms: i64,
        keys: impl Iterator<Item = String>,
        completed_ms: i64,
    ) -> Vec<StoredPiece> {
        let mut pieces: Vec<StoredPiece> = (0..PIECES)
            .map(|piece| StoredPiece {
                consumer: consumer.to_owned(),
                period_ms,
                piece,
                key_count: 0,
                newest_completed_ms: completed_ms,
                updated_ms: now_ms(),
                bits: Piece::default(),
            })
            .collect();
        for key in keys {
            let positions = Positions::of(consumer, &key);
            let piece = &mut pieces[positions.piece()];
            piece.bits.insert(&positions);
            piece.key_count += 1;
        }
        pieces.retain(|piece| piece.key_count > 0);
        pieces
    }

    /// A digest at its full size (every filter kept full) takes at most one fresh key in
    /// 100 000 for a deleted one: over a million fresh keys, at most ten (about 1.4 expected),
    /// and what it expected of them is within the same bound.
    #[test]
    fn a_full_digest_takes_at_most_one_fresh_key_in_100_000_for_a_deleted_one() {
        let digests = Digests::new(Duration::from_secs(86_400));
        let now = now_ms();
        for g in 0..MAX_FILTERS as i64 {
            let keys = (0..CAPACITY).map(|i| format!("deleted-{g}-{i}"));
            digests.keep(filter("c", now + g, keys, now));
        }
        let fresh = 1_000_000;
        let (mut hits, mut expected) = (0, 0.0);
        for i in 0..fresh {
            let check = digests.check(&key("c", &format!("fresh-{i}")));
            hits += usize::from(check.completed_by_ms.is_some());
            expected += check.false_alarm;
        }
        assert!(
            hits <= fresh / 100_000,
            "{hits} of {fresh} fresh keys taken for deleted ones"
        );
        assert!(
            (0.5..10.0).contains(&expected),
            "{expected} false alarms expected"
        );
    }

    /// Three deleted keys: each is recognised, with the newest completion of its piece, and a
    /// check of a fresh key expects next to no false alarm.
    #[test]
    fn a_nearly_empty_digest_recognises_its_keys_and_expects_no_false_alarm() {
        let digests = Digests::new(Duration::from_secs(86_400));
        let (now, completed) = (now_ms(), now_ms() - 8 * 86_400_000);
        let keys = ["o-1", "o-2", "o-3"].map(String::from);
        digests.keep(filter("c", now, keys.clone().into_iter(), completed));
        for deleted in &keys {
            assert_eq!(
                digests.check(&key("c", deleted)).completed_by_ms,
                Some(completed)
            );
        }
        let expected: f64 = (0..1000)
            .map(|i| digests.check(&key("c", &format!("fresh-{i}"))).false_alarm)
            .sum();
        assert!(expected < 1e-30, "{expected}");
        assert_eq!(digests.check(&key("other", "o-1")).completed_by_ms, None);
    }

    /// The newest filters are kept, at most [`MAX_FILTERS`], and none past the window.
    #[test]
    fn filters_beyond_the_cap_or_the_window_are_forgotten() {
        let digests = Digests::new(Duration::from_secs(3_600));
        let now = now_ms();
        for g in 0..10 {
            let keys = std::iter::once(format!("k-{g}"));
            digests.keep(filter("c", now + g, keys, now));
        }
        let found = |k: &str| digests.check(&key("c", k)).completed_by_ms.is_some();
        assert!(!found("k-0") && !found("k-1"), "the two oldest went");
        assert!((2..10).all(|g| found(&format!("k-{g}"))));
        let mut stale = filter("old", now, std::iter::once("k".into()), now);
        stale[0].updated_ms = now - 7_200_000;
        digests.keep(stale);
        assert_eq!(digests.check(&key("old", "k")).completed_by_ms, None);
    }
}

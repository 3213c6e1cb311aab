//! The digests as their table stores them (`<inbox>_key_digest`): a row per consumer, filter
//! (named by its period, when it was begun) and piece, with the keys it holds and the newest
//! completion among them.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, QueryResult, Value};

use super::super::bloom::{PIECES, Piece};
use crate::store::Store;
use crate::store::table::KEY_DIGEST;

/// The most filters kept per consumer: 8 × 512 KiB = 4 MiB, a million deleted keys. Past them
/// the oldest go, and the digest covers less than its window rather than err more: each filter
/// adds its rate to every check, about 8 × 2 × 10⁻⁷ when all are full.
pub(crate) const MAX_FILTERS: usize = 8;

/// A window in milliseconds.
pub(super) fn window_ms(window: Duration) -> i64 {
    i64::try_from(window.as_millis()).unwrap_or(i64::MAX)
}

const COLUMNS: &str =
    "consumer, period_ms, piece, key_count, newest_completed_ms, updated_ms, bits";

/// One piece of a consumer's filter.
#[derive(Debug, Clone)]
pub(crate) struct StoredPiece {
    pub(super) consumer: String,
    /// The filter's period: when it was begun (epoch ms).
    pub(super) period_ms: i64,
    pub(super) piece: usize,
    /// Keys added to this piece.
    pub(super) key_count: u64,
    /// The latest completion (epoch ms, the database's clock) of a key added to this piece:
    /// a key it holds was processed at that time or earlier.
    pub(super) newest_completed_ms: i64,
    /// When it was last written (epoch ms, its writer's clock).
    pub(super) updated_ms: i64,
    pub(super) bits: Piece,
}

impl StoredPiece {
    fn read(store: &Store, row: &QueryResult) -> Result<Self, DbErr> {
        let count = |index| -> Result<u64, DbErr> {
            Ok(u64::try_from(row.try_get_by_index::<i64>(index)?).unwrap_or(0))
        };
        let bits: Vec<u8> = row.try_get_by_index(6)?;
        let piece = usize::try_from(count(2)?).unwrap_or(usize::MAX);
        let not_one = || DbErr::Custom("a digest piece that is not one".into());
        Ok(Self {
            consumer: store.read_key(row, 0)?,
            period_ms: row.try_get_by_index(1)?,
            piece: (piece < PIECES).then_some(piece).ok_or_else(not_one)?,
            key_count: count(3)?,
            newest_completed_ms: row.try_get_by_index(4)?,
            updated_ms: row.try_get_by_index(5)?,
            bits: Piece::from_bytes(&bits).ok_or_else(not_one)?,
        })
    }

    /// Every piece written after `since_ms`.
    pub(super) async fn written_since(
        store: &Store,
        db: &DatabaseConnection,
        since_ms: i64,
    ) -> Result<Vec<Self>, DbErr> {
        let sql = store.dialect().placeholders(&format!(
            "SELECT {COLUMNS} FROM {} WHERE updated_ms > ?",
            table(store)
        ));
        let rows = (db.query_all_raw(store.statement(&sql, vec![Value::from(since_ms)]))).await?;
        rows.iter().map(|row| Self::read(store, row)).collect()
    }

    /// The piece `piece` of `consumer`'s filter of `period_ms`, if it holds keys.
    pub(super) async fn find(
        store: &Store,
        db: &DatabaseConnection,
        consumer: &str,
        period_ms: i64,
        piece: usize,
    ) -> Result<Option<Self>, DbErr> {
        let sql = store.dialect().placeholders(&format!(
            "SELECT {COLUMNS} FROM {} WHERE consumer = ? AND period_ms = ? AND piece = ?",
            table(store)
        ));
        let values = vec![
            Value::from(consumer.to_owned()),
            Value::from(period_ms),
            Value::from(piece as i64),
        ];
        let row = db.query_one_raw(store.statement(&sql, values)).await?;
        row.map(|row| Self::read(store, &row)).transpose()
    }

    /// Writes the piece: an update when `stored` (it was read from the table), or an insert.
    pub(super) async fn save(
        &self,
        store: &Store,
        db: &DatabaseConnection,
        stored: bool,
    ) -> Result<(), DbErr> {
        let values = vec![
            Value::from(i64::try_from(self.key_count).unwrap_or(i64::MAX)),
            Value::from(self.newest_completed_ms),
            Value::from(self.updated_ms),
            Value::from(self.bits.to_bytes()),
            Value::from(self.consumer.clone()),
            Value::from(self.period_ms),
            Value::from(self.piece as i64),
        ];
        let sql = if stored {
            "UPDATE {t} SET key_count = ?, newest_completed_ms = ?, updated_ms = ?, bits = ? \
             WHERE consumer = ? AND period_ms = ? AND piece = ?"
        } else {
            "INSERT INTO {t} (key_count, newest_completed_ms, updated_ms, bits, consumer, \
             period_ms, piece) VALUES (?, ?, ?, ?, ?, ?, ?)"
        };
        let sql = store
            .dialect()
            .placeholders(&sql.replace("{t}", &table(store)));
        db.execute_raw(store.statement(&sql, values)).await?;
        Ok(())
    }
}

/// The period of `consumer`'s latest filter and the keys it holds, if it has one.
pub(super) async fn latest_filter(
    store: &Store,
    db: &DatabaseConnection,
    consumer: &str,
) -> Result<Option<(i64, u64)>, DbErr> {
    let t = table(store);
    let sql = store.dialect().placeholders(&format!(
        "SELECT period_ms, key_count FROM {t} WHERE consumer = ? AND period_ms = \
         (SELECT MAX(period_ms) FROM {t} WHERE consumer = ?)"
    ));
    let consumer = Value::from(consumer.to_owned());
    let rows = (db.query_all_raw(store.statement(&sql, vec![consumer.clone(), consumer]))).await?;
    let mut latest = None;
    for row in &rows {
        let period_ms: i64 = row.try_get_by_index(0)?;
        let keys = u64::try_from(row.try_get_by_index::<i64>(1)?).unwrap_or(0);
        let (_, total) = latest.get_or_insert((period_ms, 0));
        *total += keys;
    }
    Ok(latest)
}

/// Deletes `consumer`'s filters older than its `kept` newest.
pub(super) async fn drop_beyond(
    store: &Store,
    db: &DatabaseConnection,
    consumer: &str,
    kept: usize,
) -> Result<(), DbErr> {
    let t = table(store);
    let dialect = store.dialect();
    let oldest_kept = dialect.placeholders(&format!(
        "SELECT DISTINCT period_ms FROM {t} WHERE consumer = ? ORDER BY period_ms DESC \
         LIMIT 1 OFFSET {}",
        kept - 1
    ));
    let consumer = Value::from(consumer.to_owned());
    let row = db
        .query_one_raw(store.statement(&oldest_kept, vec![consumer.clone()]))
        .await?;
    let Some(row) = row else { return Ok(()) };
    let oldest: i64 = row.try_get_by_index(0)?;
    let delete = dialect.placeholders(&format!(
        "DELETE FROM {t} WHERE consumer = ? AND period_ms < ?"
    ));
    let values = vec![consumer, Value::from(oldest)];
    db.execute_raw(store.statement(&delete, values)).await?;
    Ok(())
}

/// Deletes the filters none of whose pieces was written since `oldest_ms`: those with a piece
/// that old are found through the index on `updated_ms`, then each is read whole.
pub(super) async fn drop_unwritten_since(
    store: &Store,
    db: &DatabaseConnection,
    oldest_ms: i64,
) -> Result<(), DbErr> {
    let t = table(store);
    let dialect = store.dialect();
    let aged = dialect.placeholders(&format!(
        "SELECT DISTINCT consumer, period_ms FROM {t} WHERE updated_ms < ?"
    ));
    let rows = (db.query_all_raw(store.statement(&aged, vec![Value::from(oldest_ms)]))).await?;
    let latest = dialect.placeholders(&format!(
        "SELECT MAX(updated_ms) FROM {t} WHERE consumer = ? AND period_ms = ?"
    ));
    let delete = dialect.placeholders(&format!(
        "DELETE FROM {t} WHERE consumer = ? AND period_ms = ?"
    ));
    for row in &rows {
        let values = vec![
            Value::from(store.read_key(row, 0)?),
            Value::from(row.try_get_by_index::<i64>(1)?),
        ];
        let written = db
            .query_one_raw(store.statement(&latest, values.clone()))
            .await?;
        let written_ms = match written {
            Some(row) => row.try_get_by_index::<Option<i64>>(0)?,
            None => None,
        };
        if written_ms.is_some_and(|written_ms| written_ms < oldest_ms) {
            db.execute_raw(store.statement(&delete, values)).await?;
        }
    }
    Ok(())
}

fn table(store: &Store) -> String {
    store.companion(KEY_DIGEST)
}

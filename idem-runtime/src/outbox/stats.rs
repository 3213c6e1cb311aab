//! What an operator reads of the outbox table as a whole: what waits to be published, what is
//! held back and for which exchange, what the cleaner has yet to delete.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DbErr, QueryResult, Value};

use super::shared::Shared;
use crate::clock::duration_ms;

/// The outbox table's messages, counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxStats {
    /// Messages not published yet, held ones included.
    pub pending: u64,
    /// How long ago the oldest of them was staged.
    pub oldest_pending_age: Option<Duration>,
    /// Of the pending messages, those a relay holds back (a missing exchange, a message the
    /// broker refused, the rest of their runs), by exchange.
    pub held: Vec<HeldExchange>,
    /// Messages published.
    pub sent: u64,
    /// Of them, those past the outbox's retention, which the cleaner has not deleted yet.
    pub sent_expired: u64,
}

/// The messages to one exchange that a relay holds back.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldExchange {
    /// The exchange (empty: the default exchange).
    pub exchange: String,
    /// How many messages to it are held.
    pub messages: u64,
    /// How many runs they belong to (messages of no run not counted).
    pub runs: u64,
    /// How long until the last of their holds runs out (zero when it has).
    pub longest_hold: Duration,
}

/// The messages of an outbox not published yet ([`Relaying::pending`](crate::outbox::Relaying::pending)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pending {
    /// How many, held ones included.
    pub count: u64,
    /// How long the oldest has waited since it was staged; none when none waits.
    pub oldest_age: Option<Duration>,
}

/// Counts the table's messages by the database's clock: two scans of the table, for an
/// operator (the `idem` command), not for a service's hot path.
///
/// # Errors
///
/// The database failed.
pub(super) async fn stats(shared: &Shared) -> Result<OutboxStats, DbErr> {
    let dialect = shared.dialect;
    let (now, t) = (
        dialect.now_ms(),
        shared.dialect.quote(shared.table.as_str()),
    );
    let totals = dialect.placeholders(&format!(
        "SELECT COUNT(CASE WHEN sent_at IS NULL THEN 1 END), \
         MIN(CASE WHEN sent_at IS NULL THEN staged_at END), \
         COUNT(CASE WHEN sent_at IS NOT NULL THEN 1 END), \
         COUNT(CASE WHEN sent_at < {now} - ? THEN 1 END), {now} FROM {t}"
    ));
    let retention = Value::from(duration_ms(shared.retention));
    let row = (shared.db)
        .query_one_raw(shared.statement(&totals, vec![retention]))
        .await?
        .ok_or_else(|| DbErr::Custom("no row from a count".into()))?;
    let now: i64 = row.try_get_by_index(4)?;
    let oldest: Option<i64> = row.try_get_by_index(1)?;
    let held = format!(
        "SELECT exchange, COUNT(*), COUNT(DISTINCT origin), MAX(held_until), {now} FROM {t} \
         WHERE sent_at IS NULL AND held_until IS NOT NULL GROUP BY exchange ORDER BY exchange"
    );
    let rows = (shared.db)
        .query_all_raw(shared.statement(&held, Vec::new()))
        .await?;
    Ok(OutboxStats {
        pending: count(&row, 0)?,
        oldest_pending_age: oldest.map(|staged| since(staged, now)),
        held: rows
            .iter()
            .map(|row| read_held(shared, row))
            .collect::<Result<_, _>>()?,
        sent: count(&row, 2)?,
        sent_expired: count(&row, 3)?,
    })
}

/// The messages not published yet, held ones included: how many, and how long the oldest
/// has waited, by the database's clock. One range of the table's pending index, cheap enough
/// for a relay to gauge now and then, whether or not it reaches the broker.
///
/// # Errors
///
/// The database failed.
pub(super) async fn pending(shared: &Shared) -> Result<Pending, DbErr> {
    let (now, t) = (
        shared.dialect.now_ms(),
        shared.dialect.quote(shared.table.as_str()),
    );
    let sql = format!("SELECT COUNT(*), MIN(staged_at), {now} FROM {t} WHERE sent_at IS NULL");
    let row = (shared.db)
        .query_one_raw(shared.statement(&sql, Vec::new()))
        .await?
        .ok_or_else(|| DbErr::Custom("no row from a count".into()))?;
    let oldest: Option<i64> = row.try_get_by_index(1)?;
    let now: i64 = row.try_get_by_index(2)?;
    Ok(Pending {
        count: count(&row, 0)?,
        oldest_age: oldest.map(|staged| since(staged, now)),
    })
}

fn read_held(shared: &Shared, row: &QueryResult) -> Result<HeldExchange, DbErr> {
    let until: i64 = row.try_get_by_index(3)?;
    let now: i64 = row.try_get_by_index(4)?;
    Ok(HeldExchange {
        exchange: shared.read_text(row, 0, "exchange")?,
        messages: count(row, 1)?,
        runs: count(row, 2)?,
        longest_hold: since(now, until),
    })
}

fn count(row: &QueryResult, index: usize) -> Result<u64, DbErr> {
    Ok(u64::try_from(row.try_get_by_index::<i64>(index)?).unwrap_or(0))
}

/// From `from` to `to` (epoch ms), zero when `to` is earlier.
fn since(from: i64, to: i64) -> Duration {
    Duration::from_millis(u64::try_from(to - from).unwrap_or(0))
}

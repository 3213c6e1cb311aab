//! An operator's hand on the holds: the runs the relays hold back, one run's pending messages,
//! and a hold lifted before it runs out (the missing exchange created, the refusing policy
//! fixed).

use std::time::Duration;

use sea_orm::{ConnectionTrait, DbErr, QueryResult, Value};

use super::shared::Shared;

/// A run the relays hold back (or a message of no run).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldRun {
    /// What is held: a run, or a message of no run.
    pub held: HeldSubject,
    /// The exchange of its held messages (the first by name when they go to several).
    pub exchange: String,
    /// How many of its messages are held.
    pub messages: u64,
    /// How long ago the oldest of them was staged.
    pub oldest_staged_age: Duration,
    /// How long until its hold runs out (zero when it has, and a relay is about to release it).
    pub hold_left: Duration,
}

/// A run, or a message of no run: what a hold applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeldSubject {
    /// A run: the handler run of an inbox key (`<length>:<consumer>/<key>`) or a named run
    /// (`run:<name>`, [`OutboxMessage::in_run`](crate::OutboxMessage::in_run)).
    Run(String),
    /// A message of no run, by its id.
    Message(String),
}

/// A pending message, for an operator.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingRow {
    /// Its place in the table's order.
    pub seq: i64,
    /// Its message id.
    pub message_id: String,
    /// The exchange it goes to.
    pub exchange: String,
    /// Its routing key.
    pub routing_key: String,
    /// How long ago it was staged.
    pub staged_age: Duration,
    /// How long it is still held back, if it is.
    pub hold_left: Option<Duration>,
}

/// The runs and messages of no run the relays hold back, the oldest first, at most `limit`
/// of each kind.
///
/// # Errors
///
/// The database failed.
pub(super) async fn held_runs(shared: &Shared, limit: u32) -> Result<Vec<HeldRun>, DbErr> {
    let dialect = shared.dialect;
    let (now, t) = (dialect.now_ms(), dialect.quote(shared.table.as_str()));
    let held = "sent_at IS NULL AND held_until IS NOT NULL";
    // Runs are told apart by their bytes, as the relay tells them (MySQL's collation would
    // merge `a` and `A`).
    let run = dialect.origin_bytes();
    let runs = format!(
        "SELECT MIN(origin), MIN(exchange), COUNT(*), MIN(staged_at), MAX(held_until), \
         {now} FROM {t} WHERE {held} AND origin IS NOT NULL GROUP BY {run} \
         ORDER BY MIN(seq) LIMIT {limit}"
    );
    let singles = format!(
        "SELECT message_id, exchange, seq, staged_at, held_until, {now} FROM {t} \
         WHERE {held} AND origin IS NULL ORDER BY seq LIMIT {limit}"
    );
    let mut all = Vec::new();
    for (sql, run) in [(runs, true), (singles, false)] {
        let rows = (shared.db)
            .query_all_raw(shared.statement(&sql, Vec::new()))
            .await?;
        for row in &rows {
            all.push(read_held_run(shared, row, run)?);
        }
    }
    Ok(all)
}

fn read_held_run(shared: &Shared, row: &QueryResult, run: bool) -> Result<HeldRun, DbErr> {
    let name = shared.read_text(row, 0, if run { "run" } else { "message id" })?;
    let (staged, until, now): (i64, i64, i64) = (
        row.try_get_by_index(3)?,
        row.try_get_by_index(4)?,
        row.try_get_by_index(5)?,
    );
    Ok(HeldRun {
        held: if run {
            HeldSubject::Run(name)
        } else {
            HeldSubject::Message(name)
        },
        exchange: shared.read_text(row, 1, "exchange")?,
        // A message of no run is one (its third column is its seq).
        messages: match run {
            true => u64::try_from(row.try_get_by_index::<i64>(2)?).unwrap_or(0),
            false => 1,
        },
        oldest_staged_age: millis(now - staged),
        hold_left: millis(until - now),
    })
}

/// The pending messages of `subject` in the table's order (a run's, from its first unsent
/// one), at most `limit`.
///
/// # Errors
///
/// The database failed.
pub(super) async fn pending_of(
    shared: &Shared,
    subject: &HeldSubject,
    limit: u32,
) -> Result<Vec<PendingRow>, DbErr> {
    let dialect = shared.dialect;
    let (now, t) = (dialect.now_ms(), dialect.quote(shared.table.as_str()));
    let (which, values) = subject_filter(shared, subject);
    let sql = dialect.placeholders(&format!(
        "SELECT seq, message_id, exchange, routing_key, staged_at, held_until, {now} \
         FROM {t} WHERE sent_at IS NULL AND {which} ORDER BY seq LIMIT {limit}"
    ));
    let rows = (shared.db)
        .query_all_raw(shared.statement(&sql, values))
        .await?;
    rows.iter()
        .map(|row| {
            let (staged, until, now): (i64, Option<i64>, i64) = (
                row.try_get_by_index(4)?,
                row.try_get_by_index(5)?,
                row.try_get_by_index(6)?,
            );
            Ok(PendingRow {
                seq: row.try_get_by_index(0)?,
                message_id: shared.read_text(row, 1, "message id")?,
                exchange: shared.read_text(row, 2, "exchange")?,
                routing_key: shared.read_text(row, 3, "routing key")?,
                staged_age: millis(now - staged),
                hold_left: until.filter(|until| *until > now).map(|u| millis(u - now)),
            })
        })
        .collect()
}

/// Lifts the holds of `subject` now: the relays take its messages at their next look at
/// the table (woken at once on PostgreSQL, within their poll interval elsewhere). Returns
/// how many messages were held. A relay that found the messages' exchange itself missing
/// also holds messages to it on sight, until its own hold of the exchange runs out.
///
/// # Errors
///
/// The database failed.
pub(super) async fn lift_holds(shared: &Shared, subject: &HeldSubject) -> Result<u64, DbErr> {
    let dialect = shared.dialect;
    let t = dialect.quote(shared.table.as_str());
    let (which, values) = subject_filter(shared, subject);
    let sql = dialect.placeholders(&format!(
        "UPDATE {t} SET held_until = NULL \
         WHERE sent_at IS NULL AND held_until IS NOT NULL AND {which}"
    ));
    let lifted = (shared.db)
        .execute_raw(shared.statement(&sql, values))
        .await?
        .rows_affected();
    if lifted > 0
        && let Some(wake) = dialect.notify()
    {
        let channel = vec![Value::from(shared.channel())];
        (shared.db)
            .execute_raw(shared.statement(wake, channel))
            .await?;
    }
    Ok(lifted)
}

/// The condition on the rows of `subject`, and its values.
fn subject_filter(shared: &Shared, subject: &HeldSubject) -> (String, Vec<Value>) {
    match subject {
        // Where the backend compares by the column's collation (through its index), then by
        // its bytes, the run is bound twice.
        HeldSubject::Run(run) => {
            let same_run = shared.dialect.same_run();
            let binds = same_run.matches('?').count();
            let values = (0..binds).map(|_| Value::from(run.clone())).collect();
            (same_run.to_owned(), values)
        }
        HeldSubject::Message(id) => (
            "message_id = ? AND origin IS NULL".into(),
            vec![Value::from(id.clone())],
        ),
    }
}

/// `ms` milliseconds, zero when negative.
fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

//! What a relay takes from the outbox: committed, unsent messages ready to publish, locked so
//! that relays in other processes skip them, held back while the broker does not take them, and
//! marked sent once their publishes are confirmed.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr, QueryResult, Value};
use tokio::sync::OwnedMutexGuard;

use super::pending_message::PendingMessage;
use super::run_order::{Unsent, wait_of};
use super::shared::Shared;
use super::statements::{Bound, RELEASE_BATCH};
use crate::clock::duration_ms;
use crate::store::dialect::begin_detached;

/// Pending messages taken by one relay, in the order they were staged, locked until
/// [`PendingBatch::mark_sent`] or until dropped (another relay may then take them).
#[derive(Debug)]
pub struct PendingBatch {
    /// The transaction whose row locks hold the messages (PostgreSQL, MySQL/MariaDB).
    tx: Option<DatabaseTransaction>,
    /// On SQLite, the turn of this outbox's relays in this process.
    _turn: Option<OwnedMutexGuard<()>>,
    messages: Vec<PendingMessage>,
    /// How many rows the statement took, and the last one's seq, before the runs waiting for
    /// an earlier message were left out.
    scanned: (usize, Option<i64>),
    shared: Arc<Shared>,
}

/// [`Relaying::take_pending`](crate::outbox::Relaying::take_pending) from the message after seq `after` on: a relay whose whole
/// batch waited for earlier messages takes the next ones.
pub(super) async fn take_pending_after(
    shared: &Arc<Shared>,
    limit: u32,
    after: Option<i64>,
) -> Result<PendingBatch, DbErr> {
    let values = vec![
        Value::from(after.unwrap_or(0)),
        Value::from(i64::from(limit)),
    ];
    let statements = &shared.statements;
    // Where one process owns the database, its relays take turns here; elsewhere a
    // transaction's row locks hold the batch.
    let (tx, turn) = match shared.dialect.relay_transaction() {
        None => (
            None,
            Some(Arc::clone(&shared.relay_turn).lock_owned().await),
        ),
        Some(options) => (Some(begin_detached(&shared.db, options).await?), None),
    };
    let rows = match &tx {
        Some(tx) => {
            tx.query_all_raw(shared.statement(&statements.take, values))
                .await?
        }
        None => {
            let take = shared.statement(&statements.take_unlocked, values);
            shared.db.query_all_raw(take).await?
        }
    };
    let taken = rows
        .iter()
        .map(|row| read_pending(shared, row))
        .collect::<Result<Vec<_>, _>>()?;
    let scanned = (taken.len(), taken.last().map(|m| m.seq));
    let batch = PendingBatch {
        tx,
        _turn: turn,
        messages: Vec::new(),
        scanned,
        shared: Arc::clone(shared),
    };
    batch.keep_runs_in_order(taken).await
}

/// Releases the holds that ran out, whoever set them (a relay that stopped meanwhile);
/// returns how many messages it released.
///
/// # Errors
///
/// The database failed.
pub(super) async fn release_holds(shared: &Shared) -> Result<u64, DbErr> {
    let mut released = 0;
    loop {
        let release = shared.statement(&shared.statements.release, Vec::new());
        let batch = shared.db.execute_raw(release).await?.rows_affected();
        released += batch;
        if batch < RELEASE_BATCH {
            return Ok(released);
        }
    }
}

fn read_pending(shared: &Shared, row: &QueryResult) -> Result<PendingMessage, DbErr> {
    let message_id = shared.read_text(row, 1, "message id")?;
    let headers: Option<String> = row.try_get_by_index(5)?;
    let headers = match headers {
        Some(json) => serde_json::from_str(&json)
            .map_err(|error| DbErr::Custom(format!("unreadable outbox headers: {error}")))?,
        None => BTreeMap::new(),
    };
    let staged_at: i64 = row.try_get_by_index(8)?;
    let now: i64 = row.try_get_by_index(9)?;
    Ok(PendingMessage {
        seq: row.try_get_by_index(0)?,
        message_id,
        exchange: row.try_get_by_index(2)?,
        routing_key: row.try_get_by_index(3)?,
        content_type: row.try_get_by_index(4)?,
        headers,
        payload: row.try_get_by_index(6)?,
        age: Duration::from_millis(u64::try_from(now - staged_at).unwrap_or(0)),
        run: row.try_get_by_index(7)?,
    })
}

impl PendingBatch {
    /// Keeps the messages of `taken` that no unsent message of their run outside the batch
    /// comes before: another relay has that one in hand (the later ones wait for the next
    /// batch), or it is held back (they are held back with it, for as long).
    async fn keep_runs_in_order(mut self, taken: Vec<PendingMessage>) -> Result<Self, DbErr> {
        let mut runs: HashMap<&str, Vec<i64>> = HashMap::new();
        for message in &taken {
            if let Some(run) = &message.run {
                runs.entry(run.as_str()).or_default().push(message.seq);
            }
        }
        let mut unsent = self.unsent_of(&runs).await?;
        let mut waiting: HashMap<String, i64> = HashMap::new();
        for (run, seqs) in &runs {
            let rows = unsent.remove(*run).unwrap_or_default();
            let Some(wait) = wait_of(seqs, &rows) else {
                continue;
            };
            if let Some(pause) = wait.held_for {
                self.hold_run(run, wait.from, pause).await?;
            }
            waiting.insert((*run).to_owned(), wait.from);
        }
        self.messages = taken
            .into_iter()
            .filter(|m| {
                let from = m.run.as_ref().and_then(|run| waiting.get(run));
                from.is_none_or(|from| m.seq < *from)
            })
            .collect();
        Ok(self)
    }

    /// The unsent rows of each of `runs` (with the seqs the batch took of it) after the seq up
    /// to which the run is known sent and up to the last the batch took, in order.
    async fn unsent_of(
        &self,
        runs: &HashMap<&str, Vec<i64>>,
    ) -> Result<HashMap<String, Vec<Unsent>>, DbErr> {
        if runs.is_empty() {
            return Ok(HashMap::new());
        }
        let outbox = &self.shared;
        let known = &outbox.sent_through;
        let bounds: HashMap<&str, (i64, i64)> = (runs.iter())
            .map(|(run, seqs)| (*run, (known.of(run), seqs.last().copied().unwrap_or(0))))
            .collect();
        let ranges: Vec<(&str, i64, i64)> = (bounds.iter())
            .map(|(run, (after, upto))| (*run, *after, *upto))
            .collect();
        let (sql, values) = outbox.statements.unsent_of_runs(&ranges);
        let rows = self.query(&sql, values).await?;
        let mut unsent: HashMap<String, Vec<Unsent>> = HashMap::new();
        for row in rows {
            let run = outbox.read_text(&row, 0, "run")?;
            let seq: i64 = row.try_get_by_index(1)?;
            let Some((after, upto)) = bounds.get(run.as_str()) else {
                continue;
            };
            if seq <= *after || seq > *upto {
                continue;
            }
            let held_until: Option<i64> = row.try_get_by_index(2)?;
            let now: i64 = row.try_get_by_index(3)?;
            let held_for = held_until
                .map(|until| until - now)
                .filter(|left| *left > 0)
                .map(|left| Duration::from_millis(u64::try_from(left).unwrap_or(1)));
            unsent
                .entry(run)
                .or_default()
                .push(Unsent { seq, held_for });
        }
        for rows in unsent.values_mut() {
            rows.sort_by_key(|row| row.seq);
        }
        Ok(unsent)
    }

    /// The messages, in the order they were staged.
    pub fn messages(&self) -> &[PendingMessage] {
        &self.messages
    }

    /// How many unsent rows the batch's statement took, those of runs waiting for an earlier
    /// message included (they are not among [`PendingBatch::messages`]): a batch as large as
    /// its limit may have more behind it.
    pub fn rows_taken(&self) -> usize {
        self.scanned.0
    }

    /// The seq of the last row the batch's statement took, to take the next ones after it.
    pub fn last_seq_taken(&self) -> Option<i64> {
        self.scanned.1
    }

    /// Holds `message` back for `pause`, by the database's clock, and the rest of its run with
    /// it (from it on): no relay takes them until the hold runs out
    /// ([`Relaying::release_holds`](crate::outbox::Relaying::release_holds)), and messages the run stages meanwhile are held back with
    /// them. A message of no run is held back alone. Written with the batch
    /// ([`PendingBatch::mark_sent`]).
    ///
    /// # Errors
    ///
    /// The database failed.
    pub async fn hold(&self, message: &PendingMessage, pause: Duration) -> Result<(), DbErr> {
        match &message.run {
            Some(run) => self.hold_run(run, message.seq, pause).await,
            None => {
                let values = vec![Value::from(pause_ms(pause)), Value::from(message.seq)];
                let sql = &self.shared.statements.hold_message;
                self.execute(sql, values).await.map(drop)
            }
        }
    }

    /// Holds back the messages of `run` from `seq` on.
    async fn hold_run(&self, run: &str, seq: i64, pause: Duration) -> Result<(), DbErr> {
        let statements = &self.shared.statements;
        let values = statements.hold_run_values(pause_ms(pause), run, seq);
        let sql = &self.shared.statements.hold_run;
        self.execute(sql, values).await.map(drop)
    }

    /// Holds back every pending message to `exchange` for `pause`, and the runs they are in
    /// (every unsent message of those runs): a broker that refused the exchange (it does not
    /// exist, or the relay may not write to it) refuses them all. Returns how many messages it
    /// held back.
    ///
    /// # Errors
    ///
    /// The database failed.
    pub async fn hold_exchange(&self, exchange: &str, pause: Duration) -> Result<u64, DbErr> {
        let mut held = 0;
        for (sql, binds) in self.shared.statements.hold_exchange() {
            let values = (binds.iter())
                .map(|bound| match bound {
                    Bound::Pause => Value::from(pause_ms(pause)),
                    Bound::Exchange => Value::from(exchange.to_owned()),
                })
                .collect();
            held += self.execute(sql, values).await?;
        }
        Ok(held)
    }

    /// Marks the messages of `seqs` sent (their publishes were confirmed) and releases the
    /// rest, in one commit, with the holds written meanwhile. Should the commit fail, they are
    /// all published again later, with the same ids: the next hop's inbox recognises them.
    pub async fn mark_sent(self, seqs: &[i64]) -> Result<(), DbErr> {
        if !seqs.is_empty() {
            let (sql, values) = self.shared.statements.mark_sent(seqs);
            self.execute(&sql, values).await?;
        }
        if let Some(tx) = self.tx {
            tx.commit().await?;
        }
        // SQLite: each statement was atomic by itself.
        let known = &self.shared.sent_through;
        known.learn(&self.messages, seqs);
        Ok(())
    }

    /// Runs a statement of the batch, in its transaction where it has one; returns the rows
    /// it changed.
    async fn execute(&self, sql: &str, values: Vec<Value>) -> Result<u64, DbErr> {
        let statement = self.shared.statement(sql, values);
        let result = match &self.tx {
            Some(tx) => tx.execute_raw(statement).await?,
            None => self.shared.db.execute_raw(statement).await?,
        };
        Ok(result.rows_affected())
    }

    /// Runs a query of the batch, in its transaction where it has one.
    async fn query(&self, sql: &str, values: Vec<Value>) -> Result<Vec<QueryResult>, DbErr> {
        let statement = self.shared.statement(sql, values);
        match &self.tx {
            Some(tx) => tx.query_all_raw(statement).await,
            None => self.shared.db.query_all_raw(statement).await,
        }
    }
}

/// A hold's length in milliseconds, at least one.
fn pause_ms(pause: Duration) -> i64 {
    duration_ms(pause).max(1)
}

//! What a relay takes from the outbox: committed, unsent messages, locked so that relays in
//! other processes skip them, and marked sent once their publishes are confirmed.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use sea_orm::{
    ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, IsolationLevel, QueryResult, Statement,
    TransactionTrait, Value,
};

use tokio::sync::OwnedMutexGuard;

use super::Outbox;

/// A staged message waiting to be published.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingMessage {
    /// Its place in the order of staging.
    pub seq: i64,
    /// The message id to publish it with.
    pub message_id: String,
    /// The destination exchange.
    pub exchange: String,
    /// The routing key.
    pub routing_key: String,
    /// The payload's content type.
    pub content_type: Option<String>,
    /// Its headers.
    pub headers: BTreeMap<String, String>,
    /// The payload.
    pub payload: Vec<u8>,
    /// How long ago it was staged, by the database's clock.
    pub age: Duration,
    /// The handler run that staged it (its consumer and message key), whose messages go out in
    /// the order it staged them; `None` for a message staged outside handlers
    /// ([`Outbox::stage`]).
    pub run: Option<String>,
}

/// A message a relay holds back for a while (the broker did not take it), and with it the rest
/// of its run: [`Outbox::take_pending_except`] leaves them out.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldBack {
    /// Its run, as [`PendingMessage::run`] says.
    pub run: Option<String>,
    /// Its place in the order of staging: its run's messages from it on are left out.
    pub seq: i64,
}

impl HeldBack {
    /// The message at `seq` of `run` held back.
    pub fn new(run: Option<String>, seq: i64) -> Self {
        Self { run, seq }
    }
}

/// Pending messages taken by one relay, in the order they were staged, locked until
/// [`PendingBatch::mark_sent`] or until dropped (another relay may then take them).
#[derive(Debug)]
pub struct PendingBatch {
    /// The transaction whose row locks hold the messages (PostgreSQL, MySQL/MariaDB).
    tx: Option<DatabaseTransaction>,
    /// On SQLite, the turn of this outbox's relays in this process.
    _turn: Option<OwnedMutexGuard<()>>,
    messages: Vec<PendingMessage>,
    /// How many rows the statement took, and the last one's seq, before the runs another relay
    /// holds were left out.
    scanned: (usize, Option<i64>),
    outbox: Outbox,
}

impl Outbox {
    /// Takes up to `limit` committed, unsent messages, oldest first, skipping those another
    /// relay holds (`FOR UPDATE SKIP LOCKED` on PostgreSQL and MySQL/MariaDB). Messages staged
    /// by one handler run go out in their order: a run whose earlier message another relay
    /// holds is left for later.
    ///
    /// SQLite serves one process, whose relays of this outbox (this value and its clones) take
    /// turns: a batch waits for the one in hand to be marked sent or dropped. No transaction is
    /// held meanwhile, so handlers can write while the batch is published: a write lock held
    /// across the broker's confirms would stop every handler for as long.
    pub async fn take_pending(&self, limit: u32) -> Result<PendingBatch, DbErr> {
        self.take_pending_except(limit, &[], None).await
    }

    /// Like [`Outbox::take_pending`], leaving out the runs of `held` from each held message on,
    /// and, with `after`, every message up to that seq: messages a relay holds back do not fill
    /// its batches, and what was staged after them still goes out.
    pub async fn take_pending_except(
        &self,
        limit: u32,
        held: &[HeldBack],
        after: Option<i64>,
    ) -> Result<PendingBatch, DbErr> {
        if self.backend() == DbBackend::Sqlite {
            let turn = Arc::clone(&self.inner.relay_turn).lock_owned().await;
            let rows = self
                .inner
                .db
                .query_all_raw(self.pending_statement(limit, held, after, ""))
                .await?;
            let messages: Vec<PendingMessage> = rows
                .iter()
                .map(|row| self.read_pending(row))
                .collect::<Result<_, _>>()?;
            return Ok(PendingBatch {
                tx: None,
                _turn: Some(turn),
                scanned: (messages.len(), messages.last().map(|m| m.seq)),
                messages,
                outbox: self.clone(),
            });
        }
        let tx = if self.backend() == DbBackend::MySql {
            // Without gap locks: under REPEATABLE READ, marking rows sent would wait for the
            // gaps another relay's skip-locked scan holds.
            self.inner
                .db
                .begin_with_config(Some(IsolationLevel::ReadCommitted), None)
                .await?
        } else {
            self.inner.dialect.begin(&self.inner.db).await?
        };
        let rows = tx
            .query_all_raw(self.pending_statement(limit, held, after, " FOR UPDATE SKIP LOCKED"))
            .await?;
        let mut taken = Vec::with_capacity(rows.len());
        for row in &rows {
            taken.push(self.read_pending(row)?);
        }
        let held_back = self.runs_held_elsewhere(&tx, &taken).await?;
        let scanned = (taken.len(), taken.last().map(|m| m.seq));
        let messages = taken
            .into_iter()
            .filter(|message| !held_back.contains_key(&message.run))
            .collect();
        Ok(PendingBatch {
            tx: Some(tx),
            _turn: None,
            messages,
            scanned,
            outbox: self.clone(),
        })
    }

    /// The oldest `limit` unsent messages after seq `after`, but those of `held`'s runs from
    /// each on, with `lock`.
    fn pending_statement(
        &self,
        limit: u32,
        held: &[HeldBack],
        after: Option<i64>,
        lock: &str,
    ) -> Statement {
        let t = self.quoted();
        let now = self.inner.dialect.now_ms();
        let mut values = Vec::with_capacity(2 * held.len() + 1);
        let mut left_out = String::new();
        for held in held {
            match &held.run {
                Some(run) => {
                    // `origin = ?` is unknown for a NULL origin, which `NOT` would leave out.
                    let origin = self.origin_bytes();
                    left_out.push_str(&format!(
                        " AND NOT (origin IS NOT NULL AND {origin} = ? AND seq >= ?)"
                    ));
                    values.push(Value::from(run.clone()));
                }
                None => left_out.push_str(" AND NOT (origin IS NULL AND seq >= ?)"),
            }
            values.push(Value::from(held.seq));
        }
        if let Some(after) = after {
            left_out.push_str(" AND seq > ?");
            values.push(Value::from(after));
        }
        values.push(Value::from(i64::from(limit)));
        let sql = format!(
            "SELECT seq, message_id, exchange, routing_key, content_type, headers, payload, \
             origin, staged_at, {now} FROM {t} WHERE sent_at IS NULL{left_out} \
             ORDER BY seq LIMIT ?{lock}"
        );
        self.statement(&sql, values)
    }

    /// The runs among `taken` (handler runs, and `None` for the messages staged outside
    /// handlers) whose earlier messages are still unsent and not taken here: another relay
    /// holds them, and these must wait for them.
    async fn runs_held_elsewhere(
        &self,
        tx: &DatabaseTransaction,
        taken: &[PendingMessage],
    ) -> Result<HashMap<Option<String>, i64>, DbErr> {
        let mut held = HashMap::new();
        // The messages staged outside handlers, one run.
        if let Some(ours) = taken.iter().find(|m| m.run.is_none()).map(|m| m.seq) {
            let sql = format!(
                "SELECT MIN(seq) FROM {} WHERE sent_at IS NULL AND origin IS NULL",
                self.quoted()
            );
            let row = tx.query_one_raw(self.statement(&sql, Vec::new())).await?;
            let earliest: Option<i64> = match row {
                Some(row) => row.try_get_by_index(0)?,
                None => None,
            };
            if let Some(earliest) = earliest.filter(|earliest| *earliest < ours) {
                held.insert(None, earliest);
            }
        }
        let mut first: HashMap<String, i64> = HashMap::new();
        for message in taken {
            if let Some(origin) = &message.run {
                first.entry(origin.clone()).or_insert(message.seq);
            }
        }
        if first.is_empty() {
            return Ok(held);
        }
        let origins: Vec<&String> = first.keys().collect();
        let list = vec!["?"; origins.len()].join(", ");
        let origin = self.origin_bytes();
        let sql = format!(
            "SELECT {origin}, MIN(seq) FROM {} WHERE sent_at IS NULL AND {origin} IN ({list}) \
             GROUP BY {origin}",
            self.quoted()
        );
        let values = origins.iter().map(|o| Value::from((*o).clone())).collect();
        let rows = tx.query_all_raw(self.statement(&sql, values)).await?;
        for row in rows {
            let origin = self.read_text(&row, 0, "run")?;
            let earliest: i64 = row.try_get_by_index(1)?;
            if first.get(&origin).is_some_and(|ours| earliest < *ours) {
                held.insert(Some(origin), earliest);
            }
        }
        Ok(held)
    }

    /// The origin column compared by its bytes: MySQL/MariaDB's default collation takes runs
    /// that differ in case, accents or trailing spaces (`c/a`, `c/A`) for one.
    fn origin_bytes(&self) -> &'static str {
        if self.backend() == DbBackend::MySql {
            // Converted first: an origin column created latin1 by an older version.
            "CAST(CONVERT(origin USING utf8mb4) AS BINARY)"
        } else {
            "origin"
        }
    }

    /// A text column, which MySQL/MariaDB hands over as bytes when it is binary.
    fn read_text(&self, row: &QueryResult, index: usize, what: &str) -> Result<String, DbErr> {
        if self.backend() != DbBackend::MySql {
            return row.try_get_by_index(index);
        }
        let bytes: Vec<u8> = row.try_get_by_index(index)?;
        String::from_utf8(bytes).map_err(|_| DbErr::Custom(format!("a {what} that is not UTF-8")))
    }

    fn read_pending(&self, row: &QueryResult) -> Result<PendingMessage, DbErr> {
        let message_id = self.read_text(row, 1, "message id")?;
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
}

impl PendingBatch {
    /// The messages, in the order they were staged.
    pub fn messages(&self) -> &[PendingMessage] {
        &self.messages
    }

    /// How many unsent rows the batch's statement took, those of runs another relay holds
    /// included (they are not among [`PendingBatch::messages`]): a batch as large as its limit
    /// may have more behind it.
    pub fn rows_taken(&self) -> usize {
        self.scanned.0
    }

    /// The seq of the last row the batch's statement took, to take the next ones after it.
    pub fn last_seq_taken(&self) -> Option<i64> {
        self.scanned.1
    }

    /// Marks the messages of `seqs` sent (their publishes were confirmed) and releases the
    /// rest, in one commit. Should the commit fail, they are all published again later, with
    /// the same ids: the next hop's inbox recognises them.
    pub async fn mark_sent(self, seqs: &[i64]) -> Result<(), DbErr> {
        let outbox = &self.outbox;
        let now = outbox.inner.dialect.now_ms();
        let list = vec!["?"; seqs.len()].join(", ");
        let sql = format!(
            "UPDATE {} SET sent_at = {now} WHERE seq IN ({list})",
            outbox.quoted()
        );
        let values: Vec<Value> = seqs.iter().map(|seq| Value::from(*seq)).collect();
        let update = Statement::from_sql_and_values(
            outbox.backend(),
            outbox.inner.dialect.placeholders(&sql),
            values,
        );
        match self.tx {
            Some(tx) => {
                if !seqs.is_empty() {
                    tx.execute_raw(update).await?;
                }
                tx.commit().await
            }
            // SQLite: one statement, atomic by itself.
            None if !seqs.is_empty() => outbox.inner.db.execute_raw(update).await.map(drop),
            None => Ok(()),
        }
    }
}

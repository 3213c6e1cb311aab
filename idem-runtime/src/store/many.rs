//! Statements over many keys of one consumer at once, for batches: one multi-row claim that
//! tells which keys are fresh, one read of the known ones, one completion, one release.
//!
//! Here, their text depends on how many keys they carry, so each is written for the next power
//! of two ([`rows_for`]), padded with rows that change nothing: batches of any size share a few
//! texts. Each connection prepares every text it runs and keeps the last hundred, and
//! MySQL/MariaDB count them against `max_prepared_stmt_count` across all their clients, after
//! which every statement fails. PostgreSQL's bind arrays instead (`many_pg`).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, DbErr, QueryResult, Statement,
    TransactionOptions, Value,
};

use super::cleanup::Deleted;
use super::dialect::begin_detached;
use super::statements::READ_COLUMNS;
use super::{MAX_BATCH, Row, Status, Store, opt_text, text};
use crate::clock::duration_ms;
use crate::fingerprint::Fingerprint;
use crate::key::{ConsumerName, MessageKey};

/// A fresh claim of a batch: its key and the fingerprint recorded with it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchClaim<'a> {
    pub(crate) key: &'a MessageKey,
    pub(crate) fingerprint: Option<&'a Fingerprint>,
}

/// What a batch's claim statement did: the keys it inserted, and where the database tells it
/// (PostgreSQL), the id of the transaction that holds them.
#[derive(Debug)]
pub(crate) struct Claims {
    pub(crate) fresh: HashSet<String>,
    pub(crate) transaction_id: Option<i64>,
}

/// A derived table of `n` rows binding a key `k` each, and an output `o` when `outputs`:
/// `(SELECT ? AS k UNION ALL SELECT ? ...)`.
fn key_table(n: usize, outputs: bool) -> String {
    let first = if outputs {
        "SELECT ? AS k, ? AS o"
    } else {
        "SELECT ? AS k"
    };
    let rest = if outputs {
        " UNION ALL SELECT ?, ?"
    } else {
        " UNION ALL SELECT ?"
    };
    let mut table = String::with_capacity(n * rest.len() + 2);
    table.push('(');
    table.push_str(first);
    for _ in 1..n {
        table.push_str(rest);
    }
    table.push(')');
    table
}

/// How many rows a statement over `n` keys is written for: the next power of two.
fn rows_for(n: usize) -> usize {
    n.max(1).next_power_of_two()
}

/// `keys`, then the last of them again up to [`rows_for`] of them: a key of the list changes
/// nothing a second time, where a key no record has would make MySQL/MariaDB lock the gap
/// where it would be, holding up other consumers' claims for as long as the batch runs.
fn padded_keys(keys: &[&MessageKey]) -> impl Iterator<Item = Value> {
    let padding = rows_for(keys.len()) - keys.len();
    let last = keys.last().into_iter().cycle().take(padding);
    keys.iter().chain(last).map(|key| text(key.as_str()))
}

/// `?, ?, ...`: `n` placeholders.
fn placeholders(n: usize) -> String {
    let mut list = String::with_capacity(n * 3);
    for i in 0..n {
        if i > 0 {
            list.push_str(", ");
        }
        list.push('?');
    }
    list
}

/// The most bytes one completion statement of a batch carries, counted as [`completion_bytes`]
/// (well under MySQL 5.7's default `max_allowed_packet`, 4 MiB).
const COMPLETE_BYTES: usize = 1 << 20;

/// What one message's completion adds to a statement, at most: its key twice (the MySQL/MariaDB
/// statement binds it twice), its output, and the framing of each.
fn completion_bytes(key: &MessageKey, output: Option<&str>) -> usize {
    2 * key.as_str().len() + output.map_or(0, str::len) + 64
}

impl Store {
    /// Names the key's index where MySQL/MariaDB must look many keys up through it: an `IN`
    /// list may otherwise be read by a scan that locks the whole consumer's records.
    fn key_index_hint(&self) -> &str {
        self.key_index.as_deref().unwrap_or("")
    }

    /// Claims every key of `claims` for `consumer` in one statement, each recorded in progress
    /// with `token`, unless a record exists; returns the keys this statement inserted. A
    /// concurrent claim of a key that has not committed is waited for at most the claim wait
    /// (on PostgreSQL until [`Store::end_claim_wait`]). Callers pass the keys sorted, so that
    /// batches sharing keys take their locks in one order.
    pub(crate) async fn insert_claims(
        &self,
        conn: &impl ConnectionTrait,
        consumer: &ConsumerName,
        claims: &[BatchClaim<'_>],
        token: i64,
        retention: Duration,
    ) -> Result<Claims, DbErr> {
        #[cfg(feature = "postgres")]
        if self.backend() == DbBackend::Postgres {
            return self
                .pg_insert_claims(conn, consumer, claims, token, retention)
                .await;
        }
        let padded = rows_for(claims.len());
        let sql = self.insert_claims_sql(padded);
        let values = claim_values(consumer, claims, padded, token, retention);
        let statement = self.statement(&self.dialect.placeholders(&sql), values);
        if !self.dialect.has_insert_returning() {
            // MySQL proper has no `INSERT ... RETURNING`: the keys this statement inserted are
            // the ones that now carry its token.
            conn.execute_raw(statement).await?;
            let keys: Vec<&MessageKey> = claims.iter().map(|claim| claim.key).collect();
            let rows = self.find_many(conn, consumer, &keys).await?;
            let fresh = rows
                .into_iter()
                .filter(|(_, row)| row.claim_token == token)
                .map(|(key, _)| key)
                .collect();
            return Ok(Claims {
                fresh,
                transaction_id: None,
            });
        }
        let inserted = conn.query_all_raw(statement).await?;
        let fresh = inserted
            .iter()
            .map(|row| self.read_key(row, 0))
            .collect::<Result<_, _>>()?;
        Ok(Claims {
            fresh,
            transaction_id: None,
        })
    }

    /// The statement of [`Store::insert_claims`] for `padded` rows (placeholders `?`).
    fn insert_claims_sql(&self, padded: usize) -> String {
        let t = &self.quoted;
        let now = self.dialect.now_ms();
        let row = format!("(?, ?, ?, ?, 1, ?, {now}, {now}, NULL, NULL, {now} + ?)");
        let rows = vec![row.as_str(); padded].join(", ");
        let columns = "consumer, message_key, status, fingerprint, attempts, claim_token, \
                       created_at, claimed_at, lease_until, completed_at, expires_at";
        match self.backend() {
            DbBackend::MySql => {
                let returning = if self.dialect.has_insert_returning() {
                    " RETURNING message_key"
                } else {
                    ""
                };
                let insert = format!("INSERT IGNORE INTO {t} ({columns}) VALUES {rows}{returning}");
                self.dialect.with_lock_wait(&insert, self.claim_wait)
            }
            _ => format!(
                "INSERT INTO {t} ({columns}) VALUES {rows} \
                 ON CONFLICT (consumer, message_key) DO NOTHING RETURNING message_key"
            ),
        }
    }

    /// Reads the records of `keys` for `consumer`, with the database's clock, by message key.
    pub(crate) async fn find_many(
        &self,
        conn: &impl ConnectionTrait,
        consumer: &ConsumerName,
        keys: &[&MessageKey],
    ) -> Result<HashMap<String, Row>, DbErr> {
        #[cfg(feature = "postgres")]
        if self.backend() == DbBackend::Postgres {
            return self.pg_find_many(conn, consumer, keys).await;
        }
        let t = &self.quoted;
        let now = self.dialect.now_ms();
        let mut values = Vec::with_capacity(keys.len() + 1);
        let sql = if self.backend() == DbBackend::MySql && self.key_index.is_none() {
            // No unique index on the key to name (a table provisioned without one): joined from
            // a table of the keys, which MySQL/MariaDB may still read by a scan that locks the
            // whole consumer's records.
            values.extend(padded_keys(keys));
            values.push(text(consumer.as_str()));
            let columns = READ_COLUMNS
                .split(", ")
                .map(|column| format!("r.{column}"))
                .collect::<Vec<_>>()
                .join(", ");
            self.dialect.with_lock_wait(
                &format!(
                    "SELECT r.message_key, {columns}, {now} FROM {} AS v JOIN {t} AS r \
                     ON r.consumer = ? AND r.message_key = v.k LOCK IN SHARE MODE",
                    key_table(rows_for(keys.len()), false)
                ),
                self.claim_wait,
            )
        } else {
            values.push(text(consumer.as_str()));
            values.extend(padded_keys(keys));
            let select = format!(
                "SELECT message_key, {READ_COLUMNS}, {now} FROM {t}{} \
                 WHERE consumer = ? AND message_key IN ({})",
                self.key_index_hint(),
                placeholders(rows_for(keys.len()))
            );
            if self.backend() == DbBackend::MySql {
                self.dialect
                    .with_lock_wait(&format!("{select} LOCK IN SHARE MODE"), self.claim_wait)
            } else {
                select
            }
        };
        let rows = conn
            .query_all_raw(self.statement(&self.dialect.placeholders(&sql), values))
            .await?;
        rows.iter()
            .map(|row| Ok((self.read_key(row, 0)?, Row::read(row, 1)?)))
            .collect()
    }

    /// Completes the claims `token` holds on `outputs`' keys, each with its output, in as few
    /// statements as keep each under [`COMPLETE_BYTES`] (a MySQL/MariaDB server refuses a
    /// statement larger than its `max_allowed_packet` and closes the connection); returns how
    /// many it completed (fewer than asked when the transaction lost some of them). With the
    /// batch's `transaction_id` (PostgreSQL), only in that transaction.
    pub(crate) async fn complete_many(
        &self,
        conn: &impl ConnectionTrait,
        consumer: &ConsumerName,
        token: i64,
        outputs: &[(&MessageKey, Option<&str>)],
        retention: Duration,
        transaction_id: Option<i64>,
    ) -> Result<u64, DbErr> {
        let mut completed = 0;
        let mut rest = outputs;
        let limit = self.completion_limit();
        while !rest.is_empty() {
            let mut bytes = 0;
            let taken = rest
                .iter()
                .take_while(|(key, output)| {
                    bytes += completion_bytes(key, *output);
                    bytes <= limit
                })
                .count()
                .max(1);
            let (chunk, after) = rest.split_at(taken);
            completed += self
                .complete_chunk(conn, consumer, token, chunk, retention, transaction_id)
                .await?;
            rest = after;
        }
        Ok(completed)
    }

    /// The most bytes one completion statement of a batch carries: [`COMPLETE_BYTES`], and
    /// within what the server takes in one packet (MySQL/MariaDB). Where the statement joins a
    /// table of keys and outputs (no key index to name), its padding repeats the last output:
    /// half as much, so that it may.
    fn completion_limit(&self) -> usize {
        let limit = self.packet_limit.map_or(COMPLETE_BYTES, |packet| {
            COMPLETE_BYTES.min(packet.saturating_sub(super::PACKET_ROOM))
        });
        if self.backend() == DbBackend::MySql && self.key_index.is_none() {
            limit / 2
        } else {
            limit
        }
    }

    /// [`Store::complete_many`] in one statement.
    async fn complete_chunk(
        &self,
        conn: &impl ConnectionTrait,
        consumer: &ConsumerName,
        token: i64,
        outputs: &[(&MessageKey, Option<&str>)],
        retention: Duration,
        transaction_id: Option<i64>,
    ) -> Result<u64, DbErr> {
        #[cfg(feature = "postgres")]
        if self.backend() == DbBackend::Postgres {
            return self
                .pg_complete_many(conn, consumer, token, outputs, retention, transaction_id)
                .await;
        }
        // Elsewhere the database does not tell the transaction's id.
        let _ = transaction_id;
        let rows = rows_for(outputs.len());
        let joined = self.backend() == DbBackend::MySql && self.key_index.is_none();
        // Padded with the last key again (see `padded_keys`), a record completed once: with its
        // output where the statement joins a table of them (either row may set it), with none
        // where a `CASE` takes the first match (no output carried twice).
        let last = outputs
            .last()
            .map(|(key, output)| (*key, if joined { *output } else { None }));
        let padding = last.into_iter().cycle().take(rows - outputs.len());
        let padded: Vec<(&str, Option<&str>)> = outputs
            .iter()
            .copied()
            .chain(padding)
            .map(|(key, output)| (key.as_str(), output))
            .collect();
        let completion = Completion {
            consumer,
            token,
            retention: Value::from(duration_ms(retention)),
            all_null: outputs.iter().all(|(_, output)| output.is_none()),
        };
        let (sql, values) = if joined {
            self.joined_completion(&padded, completion)
        } else {
            self.case_completion(&padded, completion)
        };
        let result = conn
            .execute_raw(self.statement(&self.dialect.placeholders(&sql), values))
            .await?;
        Ok(result.rows_affected())
    }

    /// A completion joined from a table of keys and outputs (MySQL/MariaDB without a key index
    /// to name, see `find_many`): its statement and values.
    fn joined_completion(
        &self,
        padded: &[(&str, Option<&str>)],
        completion: Completion<'_>,
    ) -> (String, Vec<Value>) {
        let (t, now) = (&self.quoted, self.dialect.now_ms());
        let mut values = Vec::with_capacity(padded.len() * 2 + 3);
        for (key, output) in padded {
            values.push(text(key));
            if !completion.all_null {
                values.push(opt_text(*output));
            }
        }
        values.extend([
            text(completion.consumer.as_str()),
            completion.retention,
            Value::from(completion.token),
        ]);
        let output = if completion.all_null { "NULL" } else { "v.o" };
        let sql = format!(
            "UPDATE {t} AS r JOIN {} AS v ON r.consumer = ? AND r.message_key = v.k \
             SET r.status = 'completed', r.output = {output}, r.completed_at = {now}, \
             r.expires_at = {now} + ?, r.lease_until = NULL \
             WHERE r.claim_token = ? AND r.status = 'in_progress'",
            key_table(padded.len(), !completion.all_null)
        );
        (sql, values)
    }

    /// A completion whose outputs are chosen by a `CASE` on the key, of keys listed in `IN`:
    /// its statement and values.
    fn case_completion(
        &self,
        padded: &[(&str, Option<&str>)],
        completion: Completion<'_>,
    ) -> (String, Vec<Value>) {
        let (t, now) = (&self.quoted, self.dialect.now_ms());
        let mut values = Vec::with_capacity(padded.len() * 3 + 3);
        let output = if completion.all_null {
            "NULL".to_owned()
        } else {
            let mut case = "CASE message_key".to_owned();
            for (key, output) in padded {
                case.push_str(" WHEN ? THEN ?");
                values.extend([text(key), opt_text(*output)]);
            }
            case + " END"
        };
        values.extend([
            completion.retention,
            text(completion.consumer.as_str()),
            Value::from(completion.token),
        ]);
        values.extend(padded.iter().map(|(key, _)| text(key)));
        let sql = format!(
            "UPDATE {t}{} SET status = 'completed', output = {output}, \
             completed_at = {now}, expires_at = {now} + ?, lease_until = NULL \
             WHERE consumer = ? AND claim_token = ? AND status = 'in_progress' \
             AND message_key IN ({})",
            self.key_index_hint(),
            placeholders(padded.len())
        );
        (sql, values)
    }

    /// Deletes the claims `token` holds on `keys`, so their redeliveries can retry.
    pub(crate) async fn release_many(
        &self,
        conn: &impl ConnectionTrait,
        consumer: &ConsumerName,
        token: i64,
        keys: &[&MessageKey],
    ) -> Result<u64, DbErr> {
        #[cfg(feature = "postgres")]
        if self.backend() == DbBackend::Postgres {
            return self.pg_release_many(conn, consumer, token, keys).await;
        }
        let t = &self.quoted;
        let mut values = Vec::with_capacity(keys.len() + 2);
        let sql = if self.backend() == DbBackend::MySql && self.key_index.is_none() {
            // Joined from a table of the keys: see `find_many`.
            values.extend(padded_keys(keys));
            values.extend([text(consumer.as_str()), Value::from(token)]);
            format!(
                "DELETE r FROM {t} AS r JOIN {} AS v ON r.consumer = ? AND r.message_key = v.k \
                 WHERE r.claim_token = ?",
                key_table(rows_for(keys.len()), false)
            )
        } else if self.backend() == DbBackend::MySql {
            // Only the multi-table form of `DELETE` takes an index hint.
            values.extend([text(consumer.as_str()), Value::from(token)]);
            values.extend(padded_keys(keys));
            format!(
                "DELETE r FROM {t} AS r{} WHERE r.consumer = ? AND r.claim_token = ? \
                 AND r.message_key IN ({})",
                self.key_index_hint(),
                placeholders(rows_for(keys.len()))
            )
        } else {
            values.extend([text(consumer.as_str()), Value::from(token)]);
            values.extend(padded_keys(keys));
            format!(
                "DELETE FROM {t} WHERE consumer = ? AND claim_token = ? AND message_key IN ({})",
                placeholders(rows_for(keys.len()))
            )
        };
        let result = conn
            .execute_raw(self.statement(&self.dialect.placeholders(&sql), values))
            .await?;
        Ok(result.rows_affected())
    }

    /// MySQL/MariaDB: in one short transaction, takes the keys `select` gives (expired records
    /// no other transaction holds, locked), then deletes their records by key. The table of keys
    /// is read first and each record found by its key: read through an `IN` list, the records
    /// of a consumer whose keys are most of them are scanned, and the delete waits for every one
    /// held elsewhere.
    pub(crate) async fn delete_unheld(
        &self,
        db: &DatabaseConnection,
        select: Statement,
    ) -> Result<Vec<Deleted>, DbErr> {
        let tx = begin_detached(db, TransactionOptions::default()).await?;
        let rows = tx.query_all_raw(select).await?;
        let t = &self.quoted;
        // A statement binds at most 65 535 values.
        for rows in rows.chunks(MAX_BATCH) {
            let padded = rows_for(rows.len());
            let mut values = Vec::with_capacity(padded * 2);
            for row in rows {
                values.push(text(&self.read_key(row, 0)?));
                values.push(text(&self.read_key(row, 1)?));
            }
            // Padded with the last key again (see `padded_keys`).
            let last = values[values.len() - 2..].to_vec();
            for _ in rows.len()..padded {
                values.extend(last.iter().cloned());
            }
            let mut keys = String::from("(SELECT ? AS c, ? AS k");
            keys.push_str(&" UNION ALL SELECT ?, ?".repeat(padded - 1));
            keys.push(')');
            let sql = format!(
                "DELETE r FROM {keys} AS v STRAIGHT_JOIN {t} AS r{} \
                 ON r.consumer = v.c AND r.message_key = v.k",
                self.key_index_hint()
            );
            tx.execute_raw(self.statement(&sql, values)).await?;
        }
        tx.commit().await?;
        // Every row read is locked by this transaction: each is deleted.
        rows.iter().map(|row| self.read_deleted(row)).collect()
    }

    /// A message key read back from column `index`: MySQL/MariaDB store keys as bytes.
    pub(crate) fn read_key(&self, row: &QueryResult, index: usize) -> Result<String, DbErr> {
        if self.backend() != DbBackend::MySql {
            return row.try_get_by_index(index);
        }
        let bytes: Vec<u8> = row.try_get_by_index(index)?;
        String::from_utf8(bytes)
            .map_err(|_| DbErr::Custom("a message key that is not UTF-8".to_owned()))
    }
}

/// What every record of one completion statement gets besides its output.
#[derive(Debug)]
struct Completion<'a> {
    consumer: &'a ConsumerName,
    token: i64,
    retention: Value,
    /// Whether no record stores an output: the statement sets none.
    all_null: bool,
}

/// The values of [`Store::insert_claims`]'s statement: six per claim, padded to `padded` rows
/// with repeats of the last claim, which conflict with it and insert nothing.
fn claim_values(
    consumer: &ConsumerName,
    claims: &[BatchClaim<'_>],
    padded: usize,
    token: i64,
    retention: Duration,
) -> Vec<Value> {
    let expiry = Value::from(duration_ms(retention));
    let mut values = Vec::with_capacity(padded * 6);
    let last = claims
        .last()
        .into_iter()
        .cycle()
        .take(padded - claims.len());
    for claim in claims.iter().chain(last) {
        values.extend([
            text(consumer.as_str()),
            text(claim.key.as_str()),
            text(Status::InProgress.as_str()),
            Value::from(claim.fingerprint.map(|print| print.as_bytes().to_vec())),
            Value::from(token),
            expiry.clone(),
        ]);
    }
    values
}

//! Statements over many keys of one consumer at once, for batches: one multi-row claim that
//! tells which keys are fresh, one read of the known ones, one completion, one release. Each
//! backend's room writes them (`sql/`); here they run.

use std::collections::HashMap;
use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, QueryResult, TransactionOptions};

use super::access::{MAX_BATCH, PACKET_ROOM, Store};
use super::dialect::begin_detached;
use super::sql::{ClaimsReturn, Completion, InboxTable, WithValues};
use super::values::{BatchClaim, Claims, Deleted, Row, text};
use crate::key::{ConsumerName, MessageKey};

/// The most bytes of keys and outputs one completion statement carries: larger outputs are
/// completed in several statements of a batch's transaction.
const COMPLETE_BYTES: usize = 1 << 20;

/// The bytes a key and its output take in a completion statement, with room for its framing.
fn completion_bytes(key: &MessageKey, output: Option<&str>) -> usize {
    2 * key.as_str().len() + output.map_or(0, str::len) + 64
}

impl Store {
    /// The table as the statements over many keys see it.
    fn inbox_table(&self) -> InboxTable<'_> {
        InboxTable {
            quoted: &self.quoted,
            key_index: self.key_index.as_deref(),
            claim_wait: self.claim_wait,
            lock_timeout: &self.lock_timeout,
        }
    }

    /// Runs a statement of the room, its values bound, for its rows.
    async fn rows_of(
        &self,
        conn: &impl ConnectionTrait,
        (sql, values): WithValues,
    ) -> Result<Vec<QueryResult>, DbErr> {
        conn.query_all_raw(self.statement(&sql, values)).await
    }

    /// Runs a statement of the room, its values bound, for the rows it changed.
    async fn changed_by(
        &self,
        conn: &impl ConnectionTrait,
        (sql, values): WithValues,
    ) -> Result<u64, DbErr> {
        let result = conn.execute_raw(self.statement(&sql, values)).await?;
        Ok(result.rows_affected())
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
        let statement =
            (self.dialect).insert_claims(&self.inbox_table(), consumer, claims, token, retention);
        let returned = self.dialect.claims_return();
        if returned == ClaimsReturn::Nothing {
            // No `INSERT ... RETURNING`: the keys this statement inserted are the ones that now
            // carry its token.
            self.changed_by(conn, statement).await?;
            let keys: Vec<&MessageKey> = claims.iter().map(|claim| claim.key).collect();
            let rows = self.find_many(conn, consumer, &keys).await?;
            let fresh = (rows.into_iter())
                .filter(|(_, row)| row.claim_token == token)
                .map(|(key, _)| key)
                .collect();
            return Ok(Claims {
                fresh,
                transaction_id: None,
                waits_bounded: self.sql.restore_lock_timeout.is_some(),
            });
        }
        let inserted = self.rows_of(conn, statement).await?;
        let transaction_id = match inserted.first() {
            Some(row) if returned == ClaimsReturn::KeysAndTransaction => {
                Some(row.try_get_by_index(1)?)
            }
            _ => None,
        };
        let fresh = (inserted.iter())
            .map(|row| self.read_key(row, 0))
            .collect::<Result<_, _>>()?;
        Ok(Claims {
            fresh,
            transaction_id,
            waits_bounded: returned != ClaimsReturn::KeysAndTransaction
                && self.sql.restore_lock_timeout.is_some(),
        })
    }

    /// Reads the records of `keys` for `consumer`, with the database's clock, by message key.
    pub(crate) async fn find_many(
        &self,
        conn: &impl ConnectionTrait,
        consumer: &ConsumerName,
        keys: &[&MessageKey],
    ) -> Result<HashMap<String, Row>, DbErr> {
        let statement = self.dialect.find_many(&self.inbox_table(), consumer, keys);
        let rows = self.rows_of(conn, statement).await?;
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
            let taken = (rest.iter())
                .take_while(|(key, output)| {
                    bytes += completion_bytes(key, *output);
                    bytes <= limit
                })
                .count()
                .max(1);
            let (chunk, after) = rest.split_at(taken);
            let completion = Completion {
                consumer,
                token,
                outputs: chunk,
                retention,
                transaction_id,
            };
            let statement = self.dialect.complete_many(&self.inbox_table(), &completion);
            completed += self.changed_by(conn, statement).await?;
            rest = after;
        }
        Ok(completed)
    }

    /// The most bytes one completion statement of a batch carries: [`COMPLETE_BYTES`], and
    /// within what the server takes in one packet (MySQL/MariaDB), as the room counts them.
    fn completion_limit(&self) -> usize {
        let limit = self.packet_limit.map_or(COMPLETE_BYTES, |packet| {
            COMPLETE_BYTES.min(packet.saturating_sub(PACKET_ROOM))
        });
        self.dialect.completion_bytes(&self.inbox_table(), limit)
    }

    /// Deletes the claims `token` holds on `keys`, so their redeliveries can retry.
    pub(crate) async fn release_many(
        &self,
        conn: &impl ConnectionTrait,
        consumer: &ConsumerName,
        token: i64,
        keys: &[&MessageKey],
    ) -> Result<u64, DbErr> {
        let statement = (self.dialect).release_many(&self.inbox_table(), consumer, token, keys);
        self.changed_by(conn, statement).await
    }

    /// In one short transaction, takes the keys `select` gives (expired records no other
    /// transaction holds, locked), then deletes their records by key with `delete`'s statement
    /// (MySQL/MariaDB).
    pub(crate) async fn delete_unheld(
        &self,
        db: &DatabaseConnection,
        select: sea_orm::Statement,
        delete: fn(&InboxTable<'_>, usize) -> String,
    ) -> Result<Vec<Deleted>, DbErr> {
        let tx = begin_detached(db, TransactionOptions::default()).await?;
        let rows = tx.query_all_raw(select).await?;
        // A statement binds at most 65 535 values.
        for rows in rows.chunks(MAX_BATCH) {
            let padded = rows.len().max(1).next_power_of_two();
            let mut values = Vec::with_capacity(padded * 2);
            for row in rows {
                values.push(text(&self.read_key(row, 0)?));
                values.push(text(&self.read_key(row, 1)?));
            }
            // Padded with the last key again, which deletes nothing more.
            let last = values[values.len() - 2..].to_vec();
            for _ in rows.len()..padded {
                values.extend(last.iter().cloned());
            }
            let sql = delete(&self.inbox_table(), padded);
            tx.execute_raw(self.statement(&sql, values)).await?;
        }
        tx.commit().await?;
        // Every row read is locked by this transaction: each is deleted.
        rows.iter().map(|row| self.read_deleted(row)).collect()
    }

    /// A message key read back from column `index`: MySQL/MariaDB store keys as bytes.
    pub(crate) fn read_key(&self, row: &QueryResult, index: usize) -> Result<String, DbErr> {
        if !self.dialect.binary_keys() {
            return row.try_get_by_index(index);
        }
        let bytes: Vec<u8> = row.try_get_by_index(index)?;
        String::from_utf8(bytes)
            .map_err(|_| DbErr::Custom("a message key that is not UTF-8".to_owned()))
    }
}

//! Statements over many keys of one consumer at once, for batches: one multi-row claim that
//! tells which keys are fresh, one read of the known ones, one completion, one release. Each
//! backend's room writes them (`sql/`); here they run.

use std::collections::HashMap;
use std::time::Duration;

use sea_orm::{ConnectionTrait, DbErr, QueryResult};

use super::access::{PACKET_ROOM, Store};
use super::sql::{ClaimsReturn, Completion, WithValues};
use super::values::{BatchClaim, Claims, Row};
use crate::key::{ConsumerName, MessageKey};

/// The most bytes of keys and outputs one completion statement carries: larger outputs are
/// completed in several statements of a batch's transaction.
const COMPLETE_BYTES: usize = 1 << 20;

/// The bytes a key and its output take in a completion statement, with room for its framing.
fn completion_bytes(key: &MessageKey, output: Option<&str>) -> usize {
    2 * key.as_str().len() + output.map_or(0, str::len) + 64
}

/// The statements over many keys of a batch, on an inbox's [`Store`].
pub(crate) struct Batches<'s>(&'s Store);

impl<'s> Batches<'s> {
    /// The room of `store`.
    pub(crate) fn of(store: &'s Store) -> Self {
        Self(store)
    }

    /// Runs a statement of the room, its values bound, for its rows.
    async fn rows_of(
        &self,
        conn: &impl ConnectionTrait,
        (sql, values): WithValues,
    ) -> Result<Vec<QueryResult>, DbErr> {
        conn.query_all_raw(self.0.statement(&sql, values)).await
    }

    /// Runs a statement of the room, its values bound, for the rows it changed.
    async fn changed_by(
        &self,
        conn: &impl ConnectionTrait,
        (sql, values): WithValues,
    ) -> Result<u64, DbErr> {
        let result = conn.execute_raw(self.0.statement(&sql, values)).await?;
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
        let statement = (self.0.dialect).insert_claims(
            &self.0.inbox_table(),
            consumer,
            claims,
            token,
            retention,
        );
        let returned = self.0.dialect.claims_return();
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
                waits_bounded: self.0.sql.restore_lock_timeout.is_some(),
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
            .map(|row| self.0.read_key(row, 0))
            .collect::<Result<_, _>>()?;
        Ok(Claims {
            fresh,
            transaction_id,
            waits_bounded: returned != ClaimsReturn::KeysAndTransaction
                && self.0.sql.restore_lock_timeout.is_some(),
        })
    }

    /// Reads the records of `keys` for `consumer`, with the database's clock, by message key.
    pub(crate) async fn find_many(
        &self,
        conn: &impl ConnectionTrait,
        consumer: &ConsumerName,
        keys: &[&MessageKey],
    ) -> Result<HashMap<String, Row>, DbErr> {
        let statement = self
            .0
            .dialect
            .find_many(&self.0.inbox_table(), consumer, keys);
        let rows = self.rows_of(conn, statement).await?;
        rows.iter()
            .map(|row| Ok((self.0.read_key(row, 0)?, Row::read(row, 1)?)))
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
            let statement = self
                .0
                .dialect
                .complete_many(&self.0.inbox_table(), &completion);
            completed += self.changed_by(conn, statement).await?;
            rest = after;
        }
        Ok(completed)
    }

    /// The most bytes one completion statement of a batch carries: [`COMPLETE_BYTES`], and
    /// within what the server takes in one packet (MySQL/MariaDB), as the room counts them.
    fn completion_limit(&self) -> usize {
        let limit = self.0.packet_limit.map_or(COMPLETE_BYTES, |packet| {
            COMPLETE_BYTES.min(packet.saturating_sub(PACKET_ROOM))
        });
        self.0
            .dialect
            .completion_bytes(&self.0.inbox_table(), limit)
    }

    /// Deletes the claims `token` holds on `keys`, so their redeliveries can retry.
    pub(crate) async fn release_many(
        &self,
        conn: &impl ConnectionTrait,
        consumer: &ConsumerName,
        token: i64,
        keys: &[&MessageKey],
    ) -> Result<u64, DbErr> {
        let statement = (self.0.dialect).release_many(&self.0.inbox_table(), consumer, token, keys);
        self.changed_by(conn, statement).await
    }
}

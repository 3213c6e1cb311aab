//! PostgreSQL's statements over many keys: each binds the keys (and what goes with them) as
//! arrays and reads them with `unnest`, so that its text is the same whatever the batch's size.
//! The server then parses and plans it once per connection, where a statement with a row of
//! placeholders per key is planned anew for each size, which costs more than running it.

use std::collections::HashMap;
use std::time::Duration;

use sea_orm::sea_query::ArrayType;
use sea_orm::{ConnectionTrait, DbErr, Value};

use super::statements::READ_COLUMNS;
use super::{BatchClaim, Claims, Row, Status, Store, text};
use crate::clock::duration_ms;
use crate::key::{ConsumerName, MessageKey};

/// A `text[]` value.
fn texts(items: impl Iterator<Item = String>) -> Value {
    Value::Array(
        ArrayType::String,
        Some(Box::new(items.map(Value::from).collect())),
    )
}

/// A `bytea[]` value; arrays bind no NULL elements, so an absent value is empty bytes, which a
/// fingerprint never is, read back with `NULLIF(.., '')`.
fn byteas(items: impl Iterator<Item = Option<Vec<u8>>>) -> Value {
    Value::Array(
        ArrayType::Bytes,
        Some(Box::new(
            items
                .map(|item| Value::from(item.unwrap_or_default()))
                .collect(),
        )),
    )
}

/// A `boolean[]` value.
fn bools(items: impl Iterator<Item = bool>) -> Value {
    Value::Array(
        ArrayType::Bool,
        Some(Box::new(items.map(Value::from).collect())),
    )
}

fn keys_array<'a>(keys: impl Iterator<Item = &'a MessageKey>) -> Value {
    texts(keys.map(|key| key.as_str().to_owned()))
}

impl Store {
    /// [`Store::insert_claims`] on PostgreSQL.
    pub(super) async fn pg_insert_claims(
        &self,
        conn: &impl ConnectionTrait,
        consumer: &ConsumerName,
        claims: &[BatchClaim<'_>],
        token: i64,
        retention: Duration,
    ) -> Result<Claims, DbErr> {
        let t = &self.quoted;
        let now = self.dialect.now_ms();
        // The claim wait is bounded (for the rest of the transaction, until
        // `Store::end_claim_wait`) before the first row is inserted, in the statement itself:
        // the subquery that sets it runs once, before any row it joins. The transaction's id
        // comes back with each claim inserted.
        let sql = format!(
            "INSERT INTO {t} (consumer, message_key, status, fingerprint, attempts, claim_token, \
             created_at, claimed_at, lease_until, completed_at, expires_at) \
             SELECT $1, u.k, $2, NULLIF(u.f, ''::bytea), 1, $3, c.n, c.n, NULL, NULL, c.n + $4 \
             FROM (SELECT {now} AS n, set_config('lock_timeout', $7, true) AS bounded) AS c, \
             unnest($5::text[], $6::bytea[]) AS u(k, f) \
             ON CONFLICT (consumer, message_key) DO NOTHING \
             RETURNING message_key, txid_current()"
        );
        let values = vec![
            text(consumer.as_str()),
            text(Status::InProgress.as_str()),
            Value::from(token),
            Value::from(duration_ms(retention)),
            keys_array(claims.iter().map(|claim| claim.key)),
            byteas(
                claims
                    .iter()
                    .map(|claim| claim.fingerprint.map(|print| print.as_bytes().to_vec())),
            ),
            text(&self.claim_wait.as_millis().max(1).to_string()),
        ];
        let inserted = conn.query_all_raw(self.statement(&sql, values)).await?;
        let transaction_id = match inserted.first() {
            Some(row) => Some(row.try_get_by_index(1)?),
            None => None,
        };
        let fresh = inserted
            .iter()
            .map(|row| row.try_get_by_index(0))
            .collect::<Result<_, _>>()?;
        Ok(Claims {
            fresh,
            transaction_id,
        })
    }

    /// [`Store::find_many`] on PostgreSQL.
    pub(super) async fn pg_find_many(
        &self,
        conn: &impl ConnectionTrait,
        consumer: &ConsumerName,
        keys: &[&MessageKey],
    ) -> Result<HashMap<String, Row>, DbErr> {
        let t = &self.quoted;
        let now = self.dialect.now_ms();
        let sql = format!(
            "SELECT message_key, {READ_COLUMNS}, {now} FROM {t} \
             WHERE consumer = $1 AND message_key = ANY($2::text[])"
        );
        let values = vec![text(consumer.as_str()), keys_array(keys.iter().copied())];
        let rows = conn.query_all_raw(self.statement(&sql, values)).await?;
        rows.iter()
            .map(|row| Ok((row.try_get_by_index(0)?, Row::read(row, 1)?)))
            .collect()
    }

    /// [`Store::complete_many`] on PostgreSQL.
    pub(super) async fn pg_complete_many(
        &self,
        conn: &impl ConnectionTrait,
        consumer: &ConsumerName,
        token: i64,
        outputs: &[(&MessageKey, Option<&str>)],
        retention: Duration,
        transaction_id: Option<i64>,
    ) -> Result<u64, DbErr> {
        let t = &self.quoted;
        let now = self.dialect.now_ms();
        // In the batch's transaction only, when its id is known: a statement run after a
        // handler ended the transaction commits on its own, under another id, and completes
        // nothing.
        let guard = if transaction_id.is_some() {
            " AND txid_current() = $7"
        } else {
            ""
        };
        let sql = format!(
            "UPDATE {t} AS r SET status = 'completed', output = CASE WHEN v.h THEN v.o END, \
             completed_at = c.n, expires_at = c.n + $1, lease_until = NULL \
             FROM (SELECT {now} AS n) AS c, unnest($2::text[], $3::text[], $4::boolean[]) \
             AS v(k, o, h) \
             WHERE r.consumer = $5 AND r.message_key = v.k AND r.claim_token = $6 \
             AND r.status = 'in_progress'{guard}"
        );
        let mut values = vec![
            Value::from(duration_ms(retention)),
            keys_array(outputs.iter().map(|(key, _)| *key)),
            texts(
                outputs
                    .iter()
                    .map(|(_, output)| output.unwrap_or_default().to_owned()),
            ),
            bools(outputs.iter().map(|(_, output)| output.is_some())),
            text(consumer.as_str()),
            Value::from(token),
        ];
        if let Some(id) = transaction_id {
            values.push(Value::from(id));
        }
        let result = conn.execute_raw(self.statement(&sql, values)).await?;
        Ok(result.rows_affected())
    }

    /// [`Store::release_many`] on PostgreSQL.
    pub(super) async fn pg_release_many(
        &self,
        conn: &impl ConnectionTrait,
        consumer: &ConsumerName,
        token: i64,
        keys: &[&MessageKey],
    ) -> Result<u64, DbErr> {
        let t = &self.quoted;
        let sql = format!(
            "DELETE FROM {t} WHERE consumer = $1 AND claim_token = $2 \
             AND message_key = ANY($3::text[])"
        );
        let values = vec![
            text(consumer.as_str()),
            Value::from(token),
            keys_array(keys.iter().copied()),
        ];
        let result = conn.execute_raw(self.statement(&sql, values)).await?;
        Ok(result.rows_affected())
    }
}

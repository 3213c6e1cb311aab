//! PostgreSQL's SQL.
//!
//! Lock waits are bounded for the rest of a transaction (`lock_timeout`), set by a claim's own
//! statement and restored after it. Cross-process locks are advisory locks on a hash of their
//! name, held until the transaction ends. Statements over many keys bind them as arrays and
//! read them with `unnest` (with its driver), so that their text is the same whatever the
//! batch's size: the server then parses and plans it once per connection, where a statement with
//! a row of placeholders per key is planned anew for each size, which costs more than running
//! it.

use std::time::Duration;

use sea_orm::{DbBackend, DbErr, QueryResult, TransactionOptions, Value};

use super::inbox::{ClaimsReturn, Completion, ExpiredDelete, InboxSql, InboxTable};
use super::outbox::{self, Bound, OutboxSql, RunBounds, Staging};
use super::schema::{self, InboxTypes, OutboxTypes, SchemaSql};
use super::syntax::{Syntax, WithValues};
use crate::key::{ConsumerName, MessageKey};
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
use crate::store::failure::Failure;
use crate::store::values::{BatchClaim, CLAIM_COLUMNS};

/// PostgreSQL.
#[derive(Debug)]
pub(crate) struct Postgres;

impl Syntax for Postgres {
    fn backend(&self) -> DbBackend {
        DbBackend::Postgres
    }

    fn quote(&self, name: &str) -> String {
        format!("\"{name}\"")
    }

    fn now_ms(&self) -> &'static str {
        "FLOOR(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT"
    }

    /// Numbered: `$1`, `$2`, ...
    fn placeholders(&self, sql: &str) -> String {
        let mut out = String::with_capacity(sql.len() + 16);
        let mut n = 0;
        for c in sql.chars() {
            if c == '?' {
                n += 1;
                out.push('$');
                out.push_str(&n.to_string());
            } else {
                out.push(c);
            }
        }
        out
    }

    /// Bounded for the transaction instead ([`Syntax::set_lock_timeout`]).
    fn with_lock_wait(&self, statement: &str, _: Duration) -> String {
        statement.to_owned()
    }

    fn set_lock_timeout(&self) -> Option<&'static str> {
        Some("SELECT set_config('lock_timeout', ?, true)")
    }

    fn read_lock_timeout(&self) -> Option<&'static str> {
        Some("SELECT current_setting('lock_timeout')")
    }

    fn skip_locked(&self) -> &'static str {
        " FOR UPDATE SKIP LOCKED"
    }

    fn locking_read(&self) -> &'static str {
        ""
    }

    fn force_index(&self, _: &[String]) -> String {
        String::new()
    }

    fn transaction_options(&self) -> TransactionOptions {
        TransactionOptions::default()
    }

    fn one_process(&self) -> bool {
        false
    }

    fn database_file(&self) -> Option<&'static str> {
        None
    }

    fn on_open(&self) -> Option<&'static str> {
        None
    }

    fn aborts_on_error(&self) -> bool {
        true
    }

    fn open_transaction(&self) -> Option<&'static str> {
        None
    }

    fn still_open(&self) -> &'static str {
        "SELECT 1"
    }

    fn transaction_id(&self) -> Option<&'static str> {
        Some("SELECT txid_current_if_assigned()")
    }

    fn conflicts_as_errors(&self) -> bool {
        false
    }

    fn collations_merge_keys(&self) -> bool {
        false
    }

    fn binary_keys(&self) -> bool {
        false
    }

    fn try_lock(&self, name: &str) -> WithValues {
        (
            "SELECT pg_try_advisory_xact_lock(hashtextextended(current_schema() || '.' || $1, 0))"
                .to_owned(),
            vec![Value::from(name.to_owned())],
        )
    }

    fn lock_taken(&self, row: &QueryResult) -> Result<bool, DbErr> {
        row.try_get_by_index::<bool>(0)
    }

    fn unlock(&self, _: &str) -> Option<WithValues> {
        None
    }

    fn schema_lock(&self, name: &str) -> Option<WithValues> {
        Some((
            "SELECT pg_advisory_xact_lock(hashtextextended(current_schema() || '.' || $1, 0))"
                .to_owned(),
            vec![Value::from(name.to_owned())],
        ))
    }
}

impl InboxSql for Postgres {
    /// The claim sets `lock_timeout` for its transaction before it may wait for a concurrent
    /// insert of the key, and restores it once it has inserted, so the handler's own statements
    /// are not bounded by it. A claim that did not insert keeps it for the takeover that may
    /// follow, and restores it with [`Syntax::set_lock_timeout`].
    fn insert_claim(&self, t: &str, values: &str, wait: Duration) -> String {
        format!(
            "INSERT INTO {t} ({}) SELECT {values} \
             FROM (SELECT set_config('lock_timeout', '{}', true)) AS bounded WHERE true \
             ON CONFLICT (consumer, message_key) DO NOTHING \
             RETURNING set_config('lock_timeout', ?, true)",
            CLAIM_COLUMNS,
            wait.as_millis().max(1)
        )
    }

    fn counting_probe(&self, _: &str) -> Option<String> {
        None
    }

    /// Rows a claim is taking over right now are skipped, not waited for.
    fn delete_expired(&self, t: &str) -> ExpiredDelete {
        ExpiredDelete::Returning(format!(
            "DELETE FROM {t} WHERE (consumer, message_key) IN (SELECT consumer, message_key \
             FROM {t} WHERE expires_at < ? LIMIT ? FOR UPDATE SKIP LOCKED) \
             RETURNING consumer, message_key, status, completed_at"
        ))
    }

    fn key_index_query(&self) -> Option<&'static str> {
        None
    }

    fn key_index_hint(&self, _: &str) -> String {
        String::new()
    }

    fn packet_limit_query(&self) -> Option<&'static str> {
        None
    }

    fn claims_return(&self) -> ClaimsReturn {
        if cfg!(feature = "postgres") {
            ClaimsReturn::KeysAndTransaction
        } else {
            ClaimsReturn::Keys
        }
    }

    fn insert_claims(
        &self,
        at: &InboxTable<'_>,
        consumer: &ConsumerName,
        claims: &[BatchClaim<'_>],
        token: i64,
        retention: Duration,
    ) -> WithValues {
        #[cfg(feature = "postgres")]
        return arrays::insert_claims(self.now_ms(), at, consumer, claims, token, retention);
        #[cfg(not(feature = "postgres"))]
        self.numbered(super::lists::insert_claims(
            at,
            self.now_ms(),
            consumer,
            claims,
            token,
            retention,
        ))
    }

    fn find_many(
        &self,
        at: &InboxTable<'_>,
        consumer: &ConsumerName,
        keys: &[&MessageKey],
    ) -> WithValues {
        #[cfg(feature = "postgres")]
        return arrays::find_many(self.now_ms(), at, consumer, keys);
        #[cfg(not(feature = "postgres"))]
        self.numbered(super::lists::find_many(
            at,
            self.now_ms(),
            at.hint(),
            consumer,
            keys,
        ))
    }

    fn completion_bytes(&self, _: &InboxTable<'_>, limit: usize) -> usize {
        limit
    }

    fn complete_many(&self, at: &InboxTable<'_>, completion: &Completion<'_>) -> WithValues {
        #[cfg(feature = "postgres")]
        return arrays::complete_many(self.now_ms(), at, completion);
        #[cfg(not(feature = "postgres"))]
        self.numbered(super::lists::case_completion(
            at,
            self.now_ms(),
            at.hint(),
            completion,
        ))
    }

    fn release_many(
        &self,
        at: &InboxTable<'_>,
        consumer: &ConsumerName,
        token: i64,
        keys: &[&MessageKey],
    ) -> WithValues {
        #[cfg(feature = "postgres")]
        return arrays::release_many(at, consumer, token, keys);
        #[cfg(not(feature = "postgres"))]
        self.numbered(super::lists::release_many(at, consumer, token, keys))
    }
}

impl Postgres {
    /// A statement with a placeholder per value, its placeholders numbered.
    #[cfg(not(feature = "postgres"))]
    fn numbered(&self, (sql, values): WithValues) -> WithValues {
        (self.placeholders(&sql), values)
    }
}

/// Statements over many keys that bind arrays.
#[cfg(feature = "postgres")]
mod arrays {
    use std::time::Duration;

    use sea_orm::Value;
    use sea_orm::sea_query::ArrayType;

    use super::super::inbox::{Completion, InboxTable};
    use super::super::syntax::WithValues;
    use crate::clock::duration_ms;
    use crate::key::{ConsumerName, MessageKey};
    use crate::store::values::{BatchClaim, CLAIM_COLUMNS, READ_COLUMNS, Status, text};

    /// A `text[]` value.
    pub(super) fn texts(items: impl Iterator<Item = String>) -> Value {
        Value::Array(
            ArrayType::String,
            Some(Box::new(items.map(Value::from).collect())),
        )
    }

    /// A `bytea[]` value; arrays bind no NULL elements, so an absent value is empty bytes,
    /// which a fingerprint never is, read back with `NULLIF(.., '')`.
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

    /// A `bigint[]` value.
    pub(super) fn bigints(items: impl Iterator<Item = i64>) -> Value {
        Value::Array(
            ArrayType::BigInt,
            Some(Box::new(items.map(Value::from).collect())),
        )
    }

    fn keys_array<'a>(keys: impl Iterator<Item = &'a MessageKey>) -> Value {
        texts(keys.map(|key| key.as_str().to_owned()))
    }

    /// The claim wait is bounded (for the rest of the transaction, until the claim wait ends)
    /// before the first row is inserted, in the statement itself: the subquery that sets it
    /// runs once, before any row it joins. The transaction's id comes back with each claim
    /// inserted, and the wait the application configured is restored once the last key is
    /// claimed: the scalar subquery that restores it counts every inserted row first. (When
    /// nothing is inserted it stays bounded, and no handler runs.)
    pub(super) fn insert_claims(
        now: &str,
        at: &InboxTable<'_>,
        consumer: &ConsumerName,
        claims: &[BatchClaim<'_>],
        token: i64,
        retention: Duration,
    ) -> WithValues {
        let sql = format!(
            "WITH claimed AS (INSERT INTO {} ({CLAIM_COLUMNS}) \
             SELECT $1, u.k, $2, NULLIF(u.f, ''::bytea), 1, $3, c.n, c.n, NULL, NULL, c.n + $4 \
             FROM (SELECT {now} AS n, set_config('lock_timeout', $7, true) AS bounded) AS c, \
             unnest($5::text[], $6::bytea[]) AS u(k, f) \
             ON CONFLICT (consumer, message_key) DO NOTHING \
             RETURNING message_key) \
             SELECT message_key, txid_current(), (SELECT set_config('lock_timeout', $8, true) \
             FROM (SELECT count(*) FROM claimed) AS every) FROM claimed",
            at.quoted
        );
        let prints = claims
            .iter()
            .map(|claim| claim.fingerprint.map(|print| print.as_bytes().to_vec()));
        let values = vec![
            text(consumer.as_str()),
            text(Status::InProgress.as_str()),
            Value::from(token),
            Value::from(duration_ms(retention)),
            keys_array(claims.iter().map(|claim| claim.key)),
            byteas(prints),
            text(&at.claim_wait.as_millis().max(1).to_string()),
            text(at.lock_timeout),
        ];
        (sql, values)
    }

    pub(super) fn find_many(
        now: &str,
        at: &InboxTable<'_>,
        consumer: &ConsumerName,
        keys: &[&MessageKey],
    ) -> WithValues {
        let sql = format!(
            "SELECT message_key, {READ_COLUMNS}, {now} FROM {} \
             WHERE consumer = $1 AND message_key = ANY($2::text[])",
            at.quoted
        );
        let values = vec![text(consumer.as_str()), keys_array(keys.iter().copied())];
        (sql, values)
    }

    /// In the batch's transaction only, when its id is known: a statement run after a handler
    /// ended the transaction commits on its own, under another id, and completes nothing.
    pub(super) fn complete_many(
        now: &str,
        at: &InboxTable<'_>,
        completion: &Completion<'_>,
    ) -> WithValues {
        let guard = if completion.transaction_id.is_some() {
            " AND txid_current() = $7"
        } else {
            ""
        };
        let sql = format!(
            "UPDATE {} AS r SET status = 'completed', output = CASE WHEN v.h THEN v.o END, \
             completed_at = c.n, expires_at = c.n + $1, lease_until = NULL \
             FROM (SELECT {now} AS n) AS c, unnest($2::text[], $3::text[], $4::boolean[]) \
             AS v(k, o, h) \
             WHERE r.consumer = $5 AND r.message_key = v.k AND r.claim_token = $6 \
             AND r.status = 'in_progress'{guard}",
            at.quoted
        );
        let outputs = completion.outputs;
        let mut values = vec![
            Value::from(duration_ms(completion.retention)),
            keys_array(outputs.iter().map(|(key, _)| *key)),
            texts(
                outputs
                    .iter()
                    .map(|(_, output)| output.unwrap_or_default().to_owned()),
            ),
            bools(outputs.iter().map(|(_, output)| output.is_some())),
            text(completion.consumer.as_str()),
            Value::from(completion.token),
        ];
        values.extend(completion.transaction_id.map(Value::from));
        (sql, values)
    }

    pub(super) fn release_many(
        at: &InboxTable<'_>,
        consumer: &ConsumerName,
        token: i64,
        keys: &[&MessageKey],
    ) -> WithValues {
        let sql = format!(
            "DELETE FROM {} WHERE consumer = $1 AND claim_token = $2 \
             AND message_key = ANY($3::text[])",
            at.quoted
        );
        let values = vec![
            text(consumer.as_str()),
            Value::from(token),
            keys_array(keys.iter().copied()),
        ];
        (sql, values)
    }
}

impl OutboxSql for Postgres {
    /// Returns a row when it inserted; announced, it is one statement: an insert that commits
    /// on its own (outside a transaction) announces itself in the same statement, or not at
    /// all.
    fn staging(&self, t: &str, guard: &str) -> Staging {
        let insert = outbox::insert_or_nothing(t, self.now_ms(), guard);
        Staging {
            plain: self.placeholders(&format!("{insert} RETURNING 1")),
            announced: Some(self.placeholders(&format!(
                "WITH staged AS ({insert} RETURNING 1) SELECT pg_notify(?, '') FROM staged"
            ))),
            returns_rows: true,
        }
    }

    fn origin_bytes(&self) -> &'static str {
        "origin"
    }

    fn same_run(&self) -> &'static str {
        "origin = ?"
    }

    /// The runs as an array, between the lowest start and the highest end: rows outside a run's
    /// own bounds are left to the caller.
    fn unsent_of_runs(&self, t: &str, hint: &str, runs: &[RunBounds<'_>]) -> WithValues {
        #[cfg(feature = "postgres")]
        {
            let _ = hint;
            let sql = self.placeholders(&format!(
                "SELECT origin, seq, held_until, {} FROM {t} \
                 WHERE sent_at IS NULL AND origin = ANY(?::text[]) AND seq > ? AND seq <= ?",
                self.now_ms()
            ));
            let names = arrays::texts(runs.iter().map(|(run, _, _)| (*run).to_owned()));
            let after = runs.iter().map(|(_, after, _)| *after).min();
            let upto = runs.iter().map(|(_, _, upto)| *upto).max();
            (sql, vec![names, after.into(), upto.into()])
        }
        #[cfg(not(feature = "postgres"))]
        {
            let pieces = (self.origin_bytes(), hint);
            let (sql, values) = super::lists::unsent_of_runs(t, self.now_ms(), pieces, runs);
            (self.placeholders(&sql), values)
        }
    }

    fn hold_exchange(&self, t: &str) -> Vec<(String, &'static [Bound])> {
        let sql = outbox::hold_exchange_at_once(t, self.now_ms());
        let binds: &'static [Bound] = &[Bound::Pause, Bound::Exchange, Bound::Exchange];
        vec![(self.placeholders(&sql), binds)]
    }

    fn mark_sent(&self, t: &str, seqs: &[i64]) -> WithValues {
        let now = self.now_ms();
        #[cfg(feature = "postgres")]
        return (
            format!("UPDATE {t} SET sent_at = {now} WHERE seq = ANY($1::bigint[])"),
            vec![arrays::bigints(seqs.iter().copied())],
        );
        #[cfg(not(feature = "postgres"))]
        {
            let (sql, values) = super::lists::mark_sent(t, now, seqs);
            (self.placeholders(&sql), values)
        }
    }

    fn delete_sent(&self, t: &str) -> String {
        self.placeholders(&outbox::delete_sent_by_seq(t, self.now_ms()))
    }

    fn release_holds(&self, t: &str, limit: u64) -> String {
        outbox::release_by_seq(t, self.now_ms(), limit)
    }

    fn relay_transaction(&self) -> Option<TransactionOptions> {
        Some(self.transaction_options())
    }

    fn notify(&self) -> Option<&'static str> {
        Some("SELECT pg_notify($1, '')")
    }

    fn column_exists(&self, column: &str) -> String {
        format!(
            "SELECT 1 FROM information_schema.columns WHERE \
             table_schema = current_schema() AND table_name = $1 AND column_name = '{column}'"
        )
    }
}

impl SchemaSql for Postgres {
    fn inbox_tables(&self, table: &str) -> Vec<String> {
        let types = InboxTypes {
            key: "VARCHAR(255)",
            consumer: "VARCHAR(128)",
            output: "TEXT",
            hash: "BYTEA",
            blob: "BYTEA",
            double: "DOUBLE PRECISION",
        };
        schema::inbox_tables(self, table, &types)
    }

    fn outbox_table(&self, table: &str) -> Vec<String> {
        let types = OutboxTypes {
            seq: "BIGSERIAL PRIMARY KEY",
            id: "VARCHAR(255)",
            payload: "BYTEA",
            text: "TEXT",
        };
        schema::outbox_table(self, table, &types)
    }

    /// It may run again: every statement is `IF NOT EXISTS`.
    fn outbox_upgrade(&self, table: &str) -> Vec<String> {
        let mut statements = vec![format!(
            "ALTER TABLE {} ADD COLUMN IF NOT EXISTS held_until BIGINT NULL",
            self.quote(table)
        )];
        statements.extend(schema::create_outbox_indexes(self, table));
        statements
    }
}

/// What a PostgreSQL error's SQLSTATE means; the classification of any driver that reports
/// SQLSTATEs only.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) fn failure(code: &str) -> Failure {
    match code {
        // Serialization failure, deadlock.
        "40001" | "40P01" => Failure::Deadlock,
        // lock_not_available: `lock_timeout` ran out.
        "55P03" => Failure::LockTimeout,
        // in_failed_sql_transaction.
        "25P02" => Failure::Aborted,
        // Connection exceptions (class 08), shutdown, crash shutdown, cannot connect now,
        // the session ended for idling in its transaction.
        code if code.starts_with("08") => Failure::Unreachable,
        "57P01" | "57P02" | "57P03" | "25P03" => Failure::Unreachable,
        // A full disk.
        "53100" => Failure::Unreachable,
        _ => Failure::Refused,
    }
}

/// Whether an error's SQLSTATE says the server takes no writes for now: a read-only
/// transaction, no connection slot left. (Other insufficient resources, such as too many locks,
/// come from the statement itself.)
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) fn takes_no_writes(code: Option<&str>) -> bool {
    matches!(code, Some("25006" | "53300"))
}

/// Whether an error's SQLSTATE refuses a value: data exceptions (class 22: too long, invalid or
/// untranslatable characters), integrity constraints (23), program limits (54: a row or a value
/// too large).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) fn refuses_value(code: &str) -> bool {
    code.starts_with("22") || code.starts_with("23") || code.starts_with("54")
}

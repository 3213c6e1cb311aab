//! MySQL's and MariaDB's SQL.
//!
//! MariaDB bounds a statement's lock wait itself (`SET STATEMENT ... FOR`), tells whether a
//! transaction is open (`@@in_transaction`) and has `INSERT ... RETURNING`; MySQL has none of
//! them. Both compare keys by their bytes only in `VARBINARY` columns, read the latest committed
//! row in a `REPEATABLE READ` transaction only under a lock, and may scan (and lock) a whole
//! consumer's records for an `IN` list unless told the key's index: statements over many keys
//! name it, or join a derived table of the keys where the table has none to name.

use std::time::Duration;

use sea_orm::{DbBackend, DbErr, IsolationLevel, QueryResult, TransactionOptions, Value};

use super::inbox::{ClaimsReturn, Completion, ExpiredDelete, InboxSql, InboxTable};
use super::lists::{self, key_table, padded_keys, padded_outputs, placeholders, rows_for};
use super::outbox::{self, Bound, OutboxSql, RunBounds, Staging};
use super::schema::KEY_DIGEST;
use super::schema::{self, InboxTypes, OutboxTypes, SchemaSql, derived_name};
use super::syntax::{Syntax, WithValues};
use crate::clock::duration_ms;
use crate::key::{ConsumerName, MessageKey};
use crate::store::values::{BatchClaim, CLAIM_COLUMNS, READ_COLUMNS, opt_text, text};

/// MySQL or MariaDB.
#[derive(Debug)]
pub(crate) struct MySql {
    /// MariaDB rather than MySQL.
    mariadb: bool,
}

/// MariaDB, and the MySQL family's room until the server says otherwise.
pub(crate) static MARIADB: MySql = MySql { mariadb: true };

/// MySQL proper: no per-statement lock wait (claims wait for the server's
/// `innodb_lock_wait_timeout`), no `RETURNING`, no `@@in_transaction`.
pub(crate) static MYSQL: MySql = MySql { mariadb: false };

/// The room of the server whose `VERSION()` is `version`.
pub(crate) fn of_version(version: &str) -> &'static MySql {
    if version.contains("MariaDB") {
        &MARIADB
    } else {
        &MYSQL
    }
}

/// The query that tells MariaDB from MySQL ([`of_version`]).
pub(crate) const VERSION_QUERY: &str = "SELECT VERSION()";

/// A lock name for the bound name: at most 64 characters, qualified by the database.
const LOCK_NAME: &str = "CONCAT('idem:', LEFT(SHA2(CONCAT(DATABASE(), '.', ?), 256), 40))";

/// What every table is created with.
const TABLE_OPTIONS: &str = " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4";

impl Syntax for MySql {
    fn backend(&self) -> DbBackend {
        DbBackend::MySql
    }

    fn quote(&self, name: &str) -> String {
        format!("`{name}`")
    }

    /// sqlx sets the session's time zone to UTC, so the conversion is exact.
    fn now_ms(&self) -> &'static str {
        "CAST(FLOOR(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED)"
    }

    fn placeholders(&self, sql: &str) -> String {
        sql.to_owned()
    }

    /// MariaDB's per-statement variable, in whole seconds: a wait is rounded up to one, and zero
    /// fails at once when the lock is held. MySQL waits for the server's own bound.
    fn with_lock_wait(&self, statement: &str, wait: Duration) -> String {
        if !self.mariadb {
            return statement.to_owned();
        }
        format!(
            "SET STATEMENT innodb_lock_wait_timeout = {} FOR {statement}",
            wait.as_secs_f64().ceil() as u64
        )
    }

    fn set_lock_timeout(&self) -> Option<&'static str> {
        None
    }

    fn read_lock_timeout(&self) -> Option<&'static str> {
        None
    }

    fn skip_locked(&self) -> &'static str {
        " FOR UPDATE SKIP LOCKED"
    }

    fn locking_read(&self) -> &'static str {
        " LOCK IN SHARE MODE"
    }

    fn force_index(&self, indexes: &[String]) -> String {
        format!(" FORCE INDEX ({})", indexes.join(", "))
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
        false
    }

    fn open_transaction(&self) -> Option<&'static str> {
        self.mariadb.then_some("@@in_transaction = 1")
    }

    fn still_open(&self) -> &'static str {
        if self.mariadb {
            "SELECT 1 FROM DUAL WHERE @@in_transaction = 1"
        } else {
            "SELECT 1"
        }
    }

    fn transaction_id(&self) -> Option<&'static str> {
        None
    }

    fn conflicts_as_errors(&self) -> bool {
        true
    }

    fn collations_merge_keys(&self) -> bool {
        true
    }

    fn binary_keys(&self) -> bool {
        true
    }

    fn try_lock(&self, name: &str) -> WithValues {
        (
            format!("SELECT GET_LOCK({LOCK_NAME}, 0)"),
            vec![Value::from(name.to_owned())],
        )
    }

    fn lock_taken(&self, row: &QueryResult) -> Result<bool, DbErr> {
        Ok(row.try_get_by_index::<Option<i64>>(0)? == Some(1))
    }

    fn unlock(&self, name: &str) -> Option<WithValues> {
        Some((
            format!("SELECT RELEASE_LOCK({LOCK_NAME})"),
            vec![Value::from(name.to_owned())],
        ))
    }

    fn schema_lock(&self, _: &str) -> Option<WithValues> {
        None
    }
}

impl InboxSql for MySql {
    /// `INSERT IGNORE` reports 0 rows for a duplicate whatever the client flags; the
    /// `ON DUPLICATE KEY UPDATE` no-op counts as a found row under `CLIENT_FOUND_ROWS`.
    fn insert_claim(&self, t: &str, values: &str, wait: Duration) -> String {
        let insert = format!("INSERT IGNORE INTO {t} ({CLAIM_COLUMNS}) VALUES ({values})");
        self.with_lock_wait(&insert, wait)
    }

    fn counting_probe(&self, insert_claim: &str) -> Option<String> {
        Some(format!(
            "{insert_claim} ON DUPLICATE KEY UPDATE claim_token = claim_token + 1"
        ))
    }

    fn delete_expired(&self, t: &str) -> ExpiredDelete {
        ExpiredDelete::SelectThenDelete {
            select: format!(
                "SELECT consumer, message_key, status, completed_at FROM {t} WHERE expires_at < ? \
                 ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED"
            ),
            delete: delete_by_keys,
        }
    }

    /// Column names compare without case; an index on a prefix of a column does not count.
    fn key_index_query(&self) -> Option<&'static str> {
        Some(
            "SELECT CAST(index_name AS CHAR), \
             CAST(GROUP_CONCAT(LOWER(column_name) ORDER BY seq_in_index) AS CHAR), \
             CAST(MAX(sub_part IS NOT NULL) AS SIGNED) \
             FROM information_schema.statistics \
             WHERE table_schema = DATABASE() AND table_name = ? AND non_unique = 0 \
             GROUP BY index_name ORDER BY index_name <> 'PRIMARY', index_name",
        )
    }

    fn key_index_hint(&self, index: &str) -> String {
        self.force_index(&[format!("`{}`", index.replace('`', "``"))])
    }

    fn packet_limit_query(&self) -> Option<&'static str> {
        Some("SELECT CAST(@@max_allowed_packet AS SIGNED)")
    }

    fn claims_return(&self) -> ClaimsReturn {
        if self.mariadb {
            ClaimsReturn::Keys
        } else {
            ClaimsReturn::Nothing
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
        let padded = rows_for(claims.len());
        let returning = if self.mariadb {
            " RETURNING message_key"
        } else {
            ""
        };
        let insert = format!(
            "INSERT IGNORE INTO {} ({CLAIM_COLUMNS}) VALUES {}{returning}",
            at.quoted,
            lists::claim_rows(self.now_ms(), padded)
        );
        let values = lists::claim_values(consumer, claims, padded, token, retention);
        (self.with_lock_wait(&insert, at.claim_wait), values)
    }

    /// With no unique index on the key to name (a table provisioned without one), joined from
    /// a table of the keys, which may still be read by a scan that locks the whole consumer's
    /// records.
    fn find_many(
        &self,
        at: &InboxTable<'_>,
        consumer: &ConsumerName,
        keys: &[&MessageKey],
    ) -> WithValues {
        let now = self.now_ms();
        if at.key_index.is_some() {
            let (select, values) = lists::find_many(at, now, at.hint(), consumer, keys);
            let sql = format!("{select}{}", self.locking_read());
            return (self.with_lock_wait(&sql, at.claim_wait), values);
        }
        let mut values: Vec<Value> = padded_keys(keys).collect();
        values.push(text(consumer.as_str()));
        let columns = READ_COLUMNS
            .split(", ")
            .map(|column| format!("r.{column}"))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "SELECT r.message_key, {columns}, {now} FROM {} AS v JOIN {} AS r \
             ON r.consumer = ? AND r.message_key = v.k{}",
            key_table(rows_for(keys.len()), false),
            at.quoted,
            self.locking_read()
        );
        (self.with_lock_wait(&sql, at.claim_wait), values)
    }

    /// A server refuses a statement larger than its `max_allowed_packet` and closes the
    /// connection; joined from a table of keys and outputs, a completion's padding repeats the
    /// last output.
    fn completion_bytes(&self, at: &InboxTable<'_>, limit: usize) -> usize {
        if at.key_index.is_none() {
            limit / 2
        } else {
            limit
        }
    }

    fn complete_many(&self, at: &InboxTable<'_>, completion: &Completion<'_>) -> WithValues {
        if at.key_index.is_some() {
            return lists::case_completion(at, self.now_ms(), at.hint(), completion);
        }
        joined_completion(self.now_ms(), at, completion)
    }

    /// Only the multi-table form of `DELETE` takes an index hint.
    fn release_many(
        &self,
        at: &InboxTable<'_>,
        consumer: &ConsumerName,
        token: i64,
        keys: &[&MessageKey],
    ) -> WithValues {
        let t = at.quoted;
        if at.key_index.is_some() {
            let mut values = vec![text(consumer.as_str()), Value::from(token)];
            values.extend(padded_keys(keys));
            let sql = format!(
                "DELETE r FROM {t} AS r{} WHERE r.consumer = ? AND r.claim_token = ? \
                 AND r.message_key IN ({})",
                at.hint(),
                placeholders(rows_for(keys.len()))
            );
            return (sql, values);
        }
        // Joined from a table of the keys: see `find_many`.
        let mut values: Vec<Value> = padded_keys(keys).collect();
        values.extend([text(consumer.as_str()), Value::from(token)]);
        let sql = format!(
            "DELETE r FROM {t} AS r JOIN {} AS v ON r.consumer = ? AND r.message_key = v.k \
             WHERE r.claim_token = ?",
            key_table(rows_for(keys.len()), false)
        );
        (sql, values)
    }
}

/// The delete of `rows` records by their consumer and key (bound in pairs), each found by its
/// key: read through an `IN` list, the records of a consumer whose keys are most of them are
/// scanned, and the delete waits for every one held elsewhere.
fn delete_by_keys(at: &InboxTable<'_>, rows: usize) -> String {
    let mut keys = String::from("(SELECT ? AS c, ? AS k");
    keys.push_str(&" UNION ALL SELECT ?, ?".repeat(rows - 1));
    keys.push(')');
    format!(
        "DELETE r FROM {keys} AS v STRAIGHT_JOIN {} AS r{} \
         ON r.consumer = v.c AND r.message_key = v.k",
        at.quoted,
        at.hint()
    )
}

/// A completion joined from a table of keys and outputs (no key index to name, see
/// `find_many`).
fn joined_completion(now: &str, at: &InboxTable<'_>, completion: &Completion<'_>) -> WithValues {
    let all_null = completion.all_null();
    let padded = padded_outputs(completion, true);
    let mut values = Vec::with_capacity(padded.len() * 2 + 3);
    for (key, output) in &padded {
        values.push(text(key));
        if !all_null {
            values.push(opt_text(*output));
        }
    }
    values.extend([
        text(completion.consumer.as_str()),
        Value::from(duration_ms(completion.retention)),
        Value::from(completion.token),
    ]);
    let output = if all_null { "NULL" } else { "v.o" };
    let sql = format!(
        "UPDATE {} AS r JOIN {} AS v ON r.consumer = ? AND r.message_key = v.k \
         SET r.status = 'completed', r.output = {output}, r.completed_at = {now}, \
         r.expires_at = {now} + ?, r.lease_until = NULL \
         WHERE r.claim_token = ? AND r.status = 'in_progress'",
        at.quoted,
        key_table(padded.len(), !all_null)
    );
    (sql, values)
}

impl OutboxSql for MySql {
    fn staging(&self, t: &str, guard: &str) -> Staging {
        Staging {
            plain: outbox::insert_or_keep(t, self.now_ms(), guard),
            announced: None,
            returns_rows: false,
        }
    }

    /// Converted first: an origin column created latin1 by an older version.
    fn origin_bytes(&self) -> &'static str {
        "CAST(CONVERT(origin USING utf8mb4) AS BINARY)"
    }

    fn same_run(&self) -> &'static str {
        "origin = ? AND CAST(CONVERT(origin USING utf8mb4) AS BINARY) = ?"
    }

    fn unsent_of_runs(&self, t: &str, hint: &str, runs: &[RunBounds<'_>]) -> WithValues {
        lists::unsent_of_runs(t, self.now_ms(), (self.origin_bytes(), hint), runs)
    }

    /// MySQL/MariaDB update a table they read in a join only. Those of no run: the first holds
    /// the others (writing them twice doubled the cost of holding a large backlog).
    fn hold_exchange(&self, t: &str) -> Vec<(String, &'static [Bound])> {
        let now = self.now_ms();
        vec![
            (
                format!(
                    "UPDATE {t} AS r JOIN (SELECT DISTINCT origin FROM {t} \
                     WHERE sent_at IS NULL AND exchange = ? AND origin IS NOT NULL) AS h \
                     ON r.origin = h.origin SET r.held_until = {now} + ? \
                     WHERE r.sent_at IS NULL"
                ),
                &[Bound::Exchange, Bound::Pause],
            ),
            (
                format!(
                    "UPDATE {t} SET held_until = {now} + ? \
                     WHERE sent_at IS NULL AND exchange = ? AND origin IS NULL"
                ),
                &[Bound::Pause, Bound::Exchange],
            ),
        ]
    }

    fn mark_sent(&self, t: &str, seqs: &[i64]) -> WithValues {
        lists::mark_sent(t, self.now_ms(), seqs)
    }

    fn delete_sent(&self, t: &str) -> String {
        format!(
            "DELETE FROM {t} WHERE sent_at < {} - ? ORDER BY sent_at LIMIT ?",
            self.now_ms()
        )
    }

    fn release_holds(&self, t: &str, limit: u64) -> String {
        format!(
            "UPDATE {t} SET held_until = NULL WHERE held_until IS NOT NULL \
             AND held_until <= {} ORDER BY held_until LIMIT {limit}",
            self.now_ms()
        )
    }

    /// Without gap locks: under `REPEATABLE READ`, marking rows sent would wait for the gaps
    /// another relay's skip-locked scan holds.
    fn relay_transaction(&self) -> Option<TransactionOptions> {
        Some(TransactionOptions {
            isolation_level: Some(IsolationLevel::ReadCommitted),
            ..TransactionOptions::default()
        })
    }

    fn notify(&self) -> Option<&'static str> {
        None
    }

    fn column_exists(&self, column: &str) -> String {
        format!(
            "SELECT 1 FROM information_schema.columns WHERE \
             table_schema = DATABASE() AND table_name = ? AND column_name = '{column}'"
        )
    }
}

/// The outbox's indexes, without the partial indexes MySQL/MariaDB lack (see
/// [`schema::PARTIAL_OUTBOX_INDEXES`]).
const OUTBOX_INDEXES: [(&str, &str); 4] = [
    ("pending", "(sent_at, seq)"),
    ("ready", "(sent_at, held_until, seq)"),
    ("runs", "(origin, sent_at, seq)"),
    ("held", "(held_until)"),
];

impl MySql {
    /// The outbox's indexes, each declared as `kind`: `KEY` in a table, `ADD INDEX` in a change.
    fn outbox_indexes<'a>(
        &'a self,
        table: &'a str,
        kind: &'a str,
    ) -> impl Iterator<Item = String> + 'a {
        OUTBOX_INDEXES.iter().map(move |(suffix, definition)| {
            let index = derived_name(self, table, suffix);
            format!("{kind} {index} {definition}")
        })
    }
}

impl SchemaSql for MySql {
    /// Every index declared in its table's statement.
    fn inbox_tables(&self, table: &str) -> Vec<String> {
        let types = InboxTypes {
            key: "VARBINARY(255)",
            consumer: "VARBINARY(128)",
            output: "MEDIUMTEXT",
            hash: "BINARY(32)",
            blob: "BLOB",
            double: "DOUBLE",
        };
        let (digest_index, digest_index_columns) = schema::digest_index(table);
        vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {} ({}, INDEX {} (expires_at)){TABLE_OPTIONS}",
                self.quote(table),
                schema::inbox_columns(&types),
                derived_name(self, table, "expires_at")
            ),
            schema::daily_table(self, table, &types, TABLE_OPTIONS),
            format!(
                "CREATE TABLE IF NOT EXISTS {} ({}, \
                 INDEX {} {digest_index_columns}){TABLE_OPTIONS}",
                derived_name(self, table, KEY_DIGEST),
                schema::digest_columns(&types),
                self.quote(&digest_index)
            ),
        ]
    }

    fn outbox_table(&self, table: &str) -> Vec<String> {
        let types = OutboxTypes {
            seq: "BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY",
            id: "VARBINARY(255)",
            payload: "LONGBLOB",
            text: "MEDIUMTEXT",
        };
        let keys: Vec<String> = self.outbox_indexes(table, "KEY").collect();
        vec![format!(
            "CREATE TABLE IF NOT EXISTS {} ({}, UNIQUE KEY {} (message_id), \
             {}){TABLE_OPTIONS}",
            self.quote(table),
            schema::outbox_columns(&types),
            derived_name(self, table, "message_id"),
            keys.join(", ")
        )]
    }

    /// One `ALTER TABLE`, to run once: MySQL has no `IF NOT EXISTS` for columns. The index of
    /// pending rows is as old as the table.
    fn outbox_upgrade(&self, table: &str) -> Vec<String> {
        let mut clauses = vec!["ADD COLUMN held_until BIGINT NULL".to_owned()];
        clauses.extend(self.outbox_indexes(table, "ADD INDEX").skip(1));
        vec![format!(
            "ALTER TABLE {} {}",
            self.quote(table),
            clauses.join(", ")
        )]
    }
}

/// What a MySQL/MariaDB error number means. They share SQLSTATEs between connection and
/// statement errors (08S01 is also a packet too large, 70100 also a killed query): their error
/// numbers tell.
#[cfg(feature = "mysql")]
pub(crate) fn failure(number: u16) -> crate::store::failure::Failure {
    use crate::store::failure::Failure;
    match number {
        // Server shutdown, connection killed; a Galera node outside the cluster's quorum (1047)
        // answers every statement so; out of disk.
        1053 | 1927 | 1047 | 1021 => Failure::Unreachable,
        1213 => Failure::Deadlock,
        1205 => Failure::LockTimeout,
        _ => Failure::Refused,
    }
}

/// Whether an error number says the server takes no writes for now: `read_only`, a read-only
/// transaction, read-only server mode; every statement the server may prepare prepared
/// already (`max_prepared_stmt_count`, across its clients).
#[cfg(feature = "mysql")]
pub(crate) fn takes_no_writes(number: u16) -> bool {
    matches!(number, 1290 | 1792 | 1836 | 1461)
}

/// Whether an error number refuses a value: data too long, incorrect string value, packet too
/// large, row size too large, a `CHECK` constraint (MariaDB, MySQL), a column that cannot be
/// null.
#[cfg(feature = "mysql")]
pub(crate) fn refuses_value(number: u16) -> bool {
    matches!(
        number,
        1406 | 1366 | 1153 | 1301 | 1118 | 4025 | 3819 | 1048
    )
}

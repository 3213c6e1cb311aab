//! The SQL text of every inbox statement, built once per inbox for its dialect and table.
//!
//! Every time a statement compares or writes is the database's clock ([`Syntax::now_ms`](super::sql::Syntax::now_ms)):
//! leases and expiries mean the same to every process, whatever their hosts' clocks say.
//! Durations are bound as milliseconds and added to it.

use std::time::Duration;

use super::dialect::Dialect;
use super::sql::ExpiredDelete;
use super::table::TableName;
use super::values::{CLAIM_COLUMNS, READ_COLUMNS};

const KEY: &str = "consumer = ? AND message_key = ?";

#[derive(Debug)]
pub(super) struct Statements {
    /// Binds consumer, message key, status, fingerprint, attempts, claim token, lease (ms or
    /// NULL), expiry (ms from now); on PostgreSQL also the `lock_timeout` to restore, and it
    /// returns a row when it inserted.
    pub(super) insert_claim: String,
    /// Binds consumer, message key and every column.
    pub(super) insert_probe: String,
    /// Binds the key; reads [`READ_COLUMNS`] and the database's clock.
    pub(super) select: String,
    /// Reads every column and no row: the schema check of a read-only inbox.
    pub(super) check_columns: String,
    /// As `select`, taking no lock and waiting for none: an operator's look at a record.
    pub(super) peek: String,
    /// Binds status, fingerprint, attempts, claim token, created at (or NULL for now), lease (ms
    /// or NULL), expiry (ms from now), the key and the previous claim token.
    pub(super) take_over: String,
    /// Binds output, expiry (ms from now), the key and the claim token.
    pub(super) complete: String,
    /// Binds lease (ms), expiry (ms from now), the key and the claim token.
    pub(super) renew: String,
    /// Binds the key and the claim token.
    pub(super) release: String,
    /// Binds the key and the claim token; ends the claim's lease at once, keeping its record.
    pub(super) hand_on: String,
    /// Binds a new claim token, the key and the claim token; ends the claim's lease at once and
    /// takes its token away, so that its worker can neither renew nor complete it.
    pub(super) revoke: String,
    /// As `revoke`, only once the claim's lease has run out by the database's clock.
    pub(super) revoke_expired: String,
    /// Binds the key.
    pub(super) delete: String,
    /// As `delete`, sparing a claim whose lease still runs by the database's clock.
    pub(super) delete_unless_live: String,
    /// Binds the time before which records expired and the batch size.
    pub(super) delete_expired: ExpiredDelete,
    /// Reads the database's clock.
    pub(super) now: String,
    /// Restores PostgreSQL's `lock_timeout` after a claim that did not insert; binds its value.
    pub(super) restore_lock_timeout: Option<String>,
}

impl Statements {
    pub(super) fn new(dialect: Dialect, table: &TableName, claim_wait: Duration) -> Self {
        let t = dialect.quote(table.as_str());
        let (claims, records) = (
            Claims::new(dialect, &t, claim_wait),
            Records::new(dialect, &t),
        );
        let sql = |text: String| dialect.placeholders(&text);
        Self {
            insert_claim: sql(claims.insert_claim),
            insert_probe: sql(claims.insert_probe),
            select: sql(claims.select),
            check_columns: records.check_columns,
            peek: sql(records.peek),
            take_over: sql(claims.take_over),
            complete: sql(claims.complete),
            renew: sql(claims.renew),
            release: sql(claims.release),
            hand_on: sql(claims.hand_on),
            revoke: sql(claims.revoke),
            revoke_expired: sql(claims.revoke_expired),
            delete: sql(records.delete),
            delete_unless_live: sql(records.delete_unless_live),
            delete_expired: dialect.delete_expired(&t).map(sql),
            now: format!("SELECT {}", dialect.now_ms()),
            restore_lock_timeout: dialect.set_lock_timeout().map(|text| sql(text.to_owned())),
        }
    }
}

/// The statements of a claim's life, `?` placeholders.
struct Claims {
    insert_claim: String,
    insert_probe: String,
    select: String,
    take_over: String,
    complete: String,
    renew: String,
    release: String,
    hand_on: String,
    revoke: String,
    revoke_expired: String,
}

impl Claims {
    fn new(dialect: Dialect, t: &str, claim_wait: Duration) -> Self {
        let now = dialect.now_ms();
        let bounded = |sql: String| dialect.with_lock_wait(&sql, claim_wait);
        let claim_values = format!("?, ?, ?, ?, ?, ?, {now}, {now}, {now} + ?, NULL, {now} + ?");
        // A locking read on MySQL/MariaDB sees the latest committed row even inside a
        // REPEATABLE READ transaction; PostgreSQL and SQLite read it anyway.
        let lock = dialect.locking_read();
        let revoke = format!(
            "UPDATE {t} SET lease_until = {now}, claim_token = ? \
             WHERE {KEY} AND claim_token = ? AND status = 'in_progress'"
        );
        Self {
            insert_claim: dialect.insert_claim(t, &claim_values, claim_wait),
            // A plain insert: MySQL's `INSERT IGNORE` would turn a value that does not fit the
            // column into a warning and store it truncated.
            insert_probe: format!(
                "INSERT INTO {t} ({CLAIM_COLUMNS}, output) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            ),
            select: bounded(format!(
                "SELECT {READ_COLUMNS}, {now} FROM {t} WHERE {KEY}{lock}"
            )),
            take_over: bounded(format!(
                "UPDATE {t} SET status = ?, fingerprint = ?, attempts = ?, claim_token = ?, \
                 created_at = COALESCE(?, {now}), claimed_at = {now}, lease_until = {now} + ?, \
                 completed_at = NULL, expires_at = {now} + ?, output = NULL \
                 WHERE {KEY} AND claim_token = ? AND (expires_at <= {now} \
                 OR status = 'in_progress' AND COALESCE(lease_until, 0) <= {now})"
            )),
            complete: format!(
                "UPDATE {t} SET status = 'completed', output = ?, completed_at = {now}, \
                 expires_at = {now} + ?, lease_until = NULL \
                 WHERE {KEY} AND claim_token = ? AND status = 'in_progress'"
            ),
            // A renewal extends the lease of a claim only while its token holds it in
            // progress, and keeps the record for the retention after the new lease, as a
            // claim does.
            renew: format!(
                "UPDATE {t} SET lease_until = {now} + ?, expires_at = {now} + ? \
                 WHERE {KEY} AND claim_token = ? AND status = 'in_progress'"
            ),
            release: format!("DELETE FROM {t} WHERE {KEY} AND claim_token = ?"),
            // The lease ended now: the next claim takes the record over at once.
            hand_on: format!(
                "UPDATE {t} SET lease_until = {now} \
                 WHERE {KEY} AND claim_token = ? AND status = 'in_progress'"
            ),
            revoke_expired: format!("{revoke} AND {}", expired_lease(now)),
            revoke,
        }
    }
}

/// A claim's lease has run out by the database's clock.
fn expired_lease(now: &str) -> String {
    format!("COALESCE(lease_until, 0) <= {now}")
}

/// The statements an operator's look and reset run, `?` placeholders.
struct Records {
    check_columns: String,
    peek: String,
    delete: String,
    delete_unless_live: String,
}

impl Records {
    fn new(dialect: Dialect, t: &str) -> Self {
        let now = dialect.now_ms();
        let delete = format!("DELETE FROM {t} WHERE {KEY}");
        Self {
            check_columns: format!(
                "SELECT consumer, message_key, {READ_COLUMNS} FROM {t} WHERE 1 = 0"
            ),
            peek: format!("SELECT {READ_COLUMNS}, {now} FROM {t} WHERE {KEY}"),
            delete_unless_live: format!(
                "{delete} AND (status <> 'in_progress' OR {})",
                expired_lease(now)
            ),
            delete,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statements(backend: &str) -> Statements {
        Statements::new(
            Dialect::named(backend),
            &TableName::default(),
            Duration::from_secs(5),
        )
    }

    #[test]
    fn postgres_placeholders_are_numbered() {
        let s = statements("postgres");
        assert!(s.release.ends_with("claim_token = $3"), "{}", s.release);
        assert!(
            s.renew
                .ends_with("claim_token = $5 AND status = 'in_progress'"),
            "{}",
            s.renew
        );
        assert!(!s.insert_claim.contains('?'));
        assert!(s.insert_claim.contains("$9"), "{}", s.insert_claim);
        assert!(
            s.insert_claim
                .contains("set_config('lock_timeout', '5000', true)")
        );
    }

    #[test]
    fn mariadb_claims_with_insert_ignore_and_a_bounded_wait() {
        let s = statements("mariadb");
        assert!(
            s.insert_claim.starts_with(
                "SET STATEMENT innodb_lock_wait_timeout = 5 FOR INSERT IGNORE INTO `idem_inbox`"
            ),
            "{}",
            s.insert_claim
        );
        assert!(s.select.ends_with("LOCK IN SHARE MODE"));
    }

    #[test]
    fn claims_without_a_wait_fail_at_once_when_the_key_is_held() {
        let none = |backend| {
            Statements::new(
                Dialect::named(backend),
                &TableName::default(),
                Duration::ZERO,
            )
        };
        let mariadb = none("mariadb");
        for statement in [&mariadb.insert_claim, &mariadb.select, &mariadb.take_over] {
            assert!(
                statement.starts_with("SET STATEMENT innodb_lock_wait_timeout = 0 FOR"),
                "{statement}"
            );
        }
        // PostgreSQL's zero turns the bound off: the least is a millisecond.
        let postgres = none("postgres");
        assert!(
            postgres
                .insert_claim
                .contains("set_config('lock_timeout', '1', true)")
        );
        let waiting = statements("mariadb");
        assert!(
            waiting
                .insert_claim
                .contains("innodb_lock_wait_timeout = 5 FOR")
        );
    }
}

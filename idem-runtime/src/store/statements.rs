//! The SQL text of every inbox statement, built once per inbox for its dialect and table.
//!
//! Every time a statement compares or writes is the database's clock ([`Dialect::now_ms`]):
//! leases and expiries mean the same to every process, whatever their hosts' clocks say.
//! Durations are bound as milliseconds and added to it.

use std::time::Duration;

use sea_orm::DbBackend;

use super::dialect::Dialect;
use super::table::TableName;

const KEY: &str = "consumer = ? AND message_key = ?";

/// The columns a record is read with, in the order `Store::find` reads them; the database's
/// clock comes last.
pub(super) const READ_COLUMNS: &str = "status, fingerprint, output, attempts, claim_token, created_at, \
                            claimed_at, lease_until, completed_at, expires_at";

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
    /// Binds the time before which records expired and the batch size. On MySQL/MariaDB it
    /// selects their keys, skipping records other transactions hold, for a delete by key.
    pub(super) delete_expired: String,
    /// Reads the database's clock.
    pub(super) now: String,
    /// Restores PostgreSQL's `lock_timeout` after a claim that did not insert; binds its value.
    pub(super) restore_lock_timeout: Option<String>,
}

impl Statements {
    pub(super) fn new(dialect: Dialect, table: &TableName, claim_wait: Duration) -> Self {
        let t = dialect.quote(table.as_str());
        let now = dialect.now_ms();
        let bounded = |sql: String| dialect.with_lock_wait(&sql, claim_wait);
        let columns = "consumer, message_key, status, fingerprint, attempts, claim_token, \
                       created_at, claimed_at, lease_until, completed_at, expires_at";
        let claim_values = format!("?, ?, ?, ?, ?, ?, {now}, {now}, {now} + ?, NULL, {now} + ?");
        let insert_claim = match dialect.backend() {
            // `INSERT IGNORE` reports 0 rows for a duplicate whatever the client flags; the
            // `ON DUPLICATE KEY UPDATE` no-op counts as a found row under CLIENT_FOUND_ROWS.
            DbBackend::MySql => bounded(format!(
                "INSERT IGNORE INTO {t} ({columns}) VALUES ({claim_values})"
            )),
            // PostgreSQL has no per-statement lock wait: the claim sets `lock_timeout` for its
            // transaction before it may wait for a concurrent insert of the key, and restores it
            // once it has inserted, so the handler's own statements are not bounded by it. A
            // claim that did not insert keeps it for the takeover that may follow, and restores
            // it with `restore_lock_timeout`.
            DbBackend::Postgres => format!(
                "INSERT INTO {t} ({columns}) SELECT {claim_values} \
                 FROM (SELECT set_config('lock_timeout', '{}', true)) AS bounded WHERE true \
                 ON CONFLICT (consumer, message_key) DO NOTHING \
                 RETURNING set_config('lock_timeout', ?, true)",
                claim_wait.as_millis().max(1)
            ),
            _ => format!(
                "INSERT INTO {t} ({columns}) VALUES ({claim_values}) \
                 ON CONFLICT (consumer, message_key) DO NOTHING"
            ),
        };
        // A plain insert: MySQL's `INSERT IGNORE` would turn a value that does not fit the
        // column into a warning and store it truncated.
        let insert_probe = format!(
            "INSERT INTO {t} ({columns}, output) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        );
        // A locking read on MySQL/MariaDB sees the latest committed row even inside a
        // REPEATABLE READ transaction; PostgreSQL and SQLite read it anyway.
        let lock = if dialect.backend() == DbBackend::MySql {
            " LOCK IN SHARE MODE"
        } else {
            ""
        };
        let select = bounded(format!(
            "SELECT {READ_COLUMNS}, {now} FROM {t} WHERE {KEY}{lock}"
        ));
        let check_columns =
            format!("SELECT consumer, message_key, {READ_COLUMNS} FROM {t} WHERE 1 = 0");
        let peek = format!("SELECT {READ_COLUMNS}, {now} FROM {t} WHERE {KEY}");
        let take_over = bounded(format!(
            "UPDATE {t} SET status = ?, fingerprint = ?, attempts = ?, claim_token = ?, \
             created_at = COALESCE(?, {now}), claimed_at = {now}, lease_until = {now} + ?, \
             completed_at = NULL, expires_at = {now} + ?, output = NULL \
             WHERE {KEY} AND claim_token = ? AND (expires_at <= {now} \
             OR status = 'in_progress' AND COALESCE(lease_until, 0) <= {now})"
        ));
        let complete = format!(
            "UPDATE {t} SET status = 'completed', output = ?, completed_at = {now}, \
             expires_at = {now} + ?, lease_until = NULL \
             WHERE {KEY} AND claim_token = ? AND status = 'in_progress'"
        );
        // A renewal extends the lease of a claim only while its token holds it in progress, and
        // keeps the record for the retention after the new lease, as a claim does.
        let renew = format!(
            "UPDATE {t} SET lease_until = {now} + ?, expires_at = {now} + ? \
             WHERE {KEY} AND claim_token = ? AND status = 'in_progress'"
        );
        let release = format!("DELETE FROM {t} WHERE {KEY} AND claim_token = ?");
        // The lease ended now: the next claim takes the record over at once.
        let hand_on = format!(
            "UPDATE {t} SET lease_until = {now} \
             WHERE {KEY} AND claim_token = ? AND status = 'in_progress'"
        );
        let revoke = format!(
            "UPDATE {t} SET lease_until = {now}, claim_token = ? \
             WHERE {KEY} AND claim_token = ? AND status = 'in_progress'"
        );
        let expired_lease = format!("COALESCE(lease_until, 0) <= {now}");
        let revoke_expired = format!("{revoke} AND {expired_lease}");
        let delete = format!("DELETE FROM {t} WHERE {KEY}");
        let delete_unless_live =
            format!("{delete} AND (status <> 'in_progress' OR {expired_lease})");
        let delete_expired = match dialect.backend() {
            // A delete waits for every record it meets that another transaction holds.
            DbBackend::MySql => format!(
                "SELECT consumer, message_key, status, completed_at FROM {t} WHERE expires_at < ? \
                 ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED"
            ),
            // Rows a claim is taking over right now are skipped, not waited for.
            DbBackend::Postgres => format!(
                "DELETE FROM {t} WHERE (consumer, message_key) IN (SELECT consumer, message_key \
                 FROM {t} WHERE expires_at < ? LIMIT ? FOR UPDATE SKIP LOCKED) \
                 RETURNING consumer, message_key, status, completed_at"
            ),
            _ => format!(
                "DELETE FROM {t} WHERE rowid IN (SELECT rowid FROM {t} WHERE expires_at < ? LIMIT ?) \
                 RETURNING consumer, message_key, status, completed_at"
            ),
        };
        let restore_lock_timeout = (dialect.backend() == DbBackend::Postgres)
            .then(|| "SELECT set_config('lock_timeout', ?, true)".to_owned());
        let sql = |text: String| dialect.placeholders(&text);
        Self {
            insert_claim: sql(insert_claim),
            insert_probe: sql(insert_probe),
            select: sql(select),
            check_columns,
            peek: sql(peek),
            take_over: sql(take_over),
            complete: sql(complete),
            renew: sql(renew),
            release: sql(release),
            hand_on: sql(hand_on),
            revoke: sql(revoke),
            revoke_expired: sql(revoke_expired),
            delete: sql(delete),
            delete_unless_live: sql(delete_unless_live),
            delete_expired: sql(delete_expired),
            now: format!("SELECT {now}"),
            restore_lock_timeout: restore_lock_timeout.map(sql),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statements(backend: DbBackend) -> Statements {
        Statements::new(
            Dialect::new(backend),
            &TableName::default(),
            Duration::from_secs(5),
        )
    }

    #[test]
    fn postgres_placeholders_are_numbered() {
        let s = statements(DbBackend::Postgres);
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
        let s = statements(DbBackend::MySql);
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
        let none =
            |backend| Statements::new(Dialect::new(backend), &TableName::default(), Duration::ZERO);
        let mariadb = none(DbBackend::MySql);
        for statement in [&mariadb.insert_claim, &mariadb.select, &mariadb.take_over] {
            assert!(
                statement.starts_with("SET STATEMENT innodb_lock_wait_timeout = 0 FOR"),
                "{statement}"
            );
        }
        // PostgreSQL's zero turns the bound off: the least is a millisecond.
        let postgres = none(DbBackend::Postgres);
        assert!(
            postgres
                .insert_claim
                .contains("set_config('lock_timeout', '1', true)")
        );
        let waiting = statements(DbBackend::MySql);
        assert!(
            waiting
                .insert_claim
                .contains("innodb_lock_wait_timeout = 5 FOR")
        );
    }
}

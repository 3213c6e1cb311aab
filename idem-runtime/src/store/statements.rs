//! The SQL text of every inbox statement, built once per inbox for its backend and table.

use sea_orm::{DbBackend, Value};
use sha2::{Digest, Sha256};

use super::table::TableName;

/// The columns a claim writes, in the order [`super::claim_values`] binds them.
const CLAIM_COLUMNS: [&str; 9] = [
    "status",
    "fingerprint",
    "attempts",
    "claim_token",
    "created_at",
    "claimed_at",
    "lease_until",
    "completed_at",
    "expires_at",
];

const KEY: &str = "consumer = ? AND message_key = ?";

#[derive(Debug)]
pub(super) struct Statements {
    backend: DbBackend,
    pub(super) insert_claim: String,
    pub(super) insert_probe: String,
    pub(super) select: String,
    pub(super) take_over: String,
    pub(super) set_output: String,
    pub(super) complete: String,
    pub(super) release: String,
    pub(super) delete: String,
    pub(super) delete_expired: String,
}

impl Statements {
    pub(super) fn new(backend: DbBackend, table: &TableName) -> Self {
        let t = table.quoted(backend);
        let insert_columns = format!("consumer, message_key, {}", CLAIM_COLUMNS.join(", "));
        let insert_values = vec!["?"; CLAIM_COLUMNS.len() + 2].join(", ");
        let insert_claim = match backend {
            // `INSERT IGNORE` reports 0 rows for a duplicate whatever the client flags; the
            // `ON DUPLICATE KEY UPDATE` no-op counts as a found row under CLIENT_FOUND_ROWS.
            DbBackend::MySql => {
                format!("INSERT IGNORE INTO {t} ({insert_columns}) VALUES ({insert_values})")
            }
            _ => format!(
                "INSERT INTO {t} ({insert_columns}) VALUES ({insert_values}) \
                 ON CONFLICT (consumer, message_key) DO NOTHING"
            ),
        };
        // A plain insert: MySQL's `INSERT IGNORE` would turn a value that does not fit the
        // column into a warning and store it truncated.
        let insert_probe = format!("INSERT INTO {t} ({insert_columns}) VALUES ({insert_values})");
        // A locking read on MySQL/MariaDB sees the latest committed row even inside a
        // REPEATABLE READ transaction; PostgreSQL and SQLite read it anyway.
        let lock = if backend == DbBackend::MySql {
            " LOCK IN SHARE MODE"
        } else {
            ""
        };
        let select = format!(
            "SELECT status, fingerprint, output, attempts, claim_token, created_at, claimed_at, \
             lease_until, completed_at, expires_at FROM {t} WHERE {KEY}{lock}"
        );
        let assignments = CLAIM_COLUMNS
            .iter()
            .map(|column| format!("{column} = ?"))
            .collect::<Vec<_>>()
            .join(", ");
        let take_over =
            format!("UPDATE {t} SET {assignments}, output = NULL WHERE {KEY} AND claim_token = ?");
        let set_output = format!("UPDATE {t} SET output = ? WHERE {KEY}");
        let complete = format!(
            "UPDATE {t} SET status = 'completed', output = ?, completed_at = ?, expires_at = ?, \
             lease_until = NULL WHERE {KEY} AND claim_token = ? AND status = 'in_progress'"
        );
        let release = format!("DELETE FROM {t} WHERE {KEY} AND claim_token = ?");
        let delete = format!("DELETE FROM {t} WHERE {KEY}");
        let delete_expired = match backend {
            DbBackend::MySql => {
                format!("DELETE FROM {t} WHERE expires_at < ? ORDER BY expires_at LIMIT ?")
            }
            // Rows a claim is taking over right now are skipped, not waited for.
            DbBackend::Postgres => format!(
                "DELETE FROM {t} WHERE (consumer, message_key) IN (SELECT consumer, message_key \
                 FROM {t} WHERE expires_at < ? LIMIT ? FOR UPDATE SKIP LOCKED)"
            ),
            _ => format!(
                "DELETE FROM {t} WHERE rowid IN (SELECT rowid FROM {t} WHERE expires_at < ? LIMIT ?)"
            ),
        };
        let mut statements = Self {
            backend,
            insert_claim,
            insert_probe,
            select,
            take_over,
            set_output,
            complete,
            release,
            delete,
            delete_expired,
        };
        if backend == DbBackend::Postgres {
            statements.number_placeholders();
        }
        statements
    }

    /// PostgreSQL numbers its placeholders: `?` becomes `$1`, `$2`, ...
    fn number_placeholders(&mut self) {
        for sql in [
            &mut self.insert_claim,
            &mut self.insert_probe,
            &mut self.select,
            &mut self.take_over,
            &mut self.set_output,
            &mut self.complete,
            &mut self.release,
            &mut self.delete,
            &mut self.delete_expired,
        ] {
            *sql = numbered(sql);
        }
    }

    /// The statement that tries to take the cross-process cleaner lock without waiting, and the
    /// values it binds.
    pub(super) fn cleaner_lock(&self, table: &TableName) -> (&'static str, Vec<Value>) {
        match self.backend {
            DbBackend::Postgres => (
                "SELECT pg_try_advisory_xact_lock($1)",
                vec![Value::from(advisory_key(table))],
            ),
            DbBackend::MySql => (
                "SELECT GET_LOCK(CONCAT('idem-cleaner:', LEFT(SHA2(CONCAT(DATABASE(), '.', ?), 256), 40)), 0)",
                vec![Value::from(table.as_str().to_owned())],
            ),
            // One process owns a SQLite file; the cleaner serializes in-process instead.
            _ => ("SELECT 1", Vec::new()),
        }
    }

    /// The statement that releases the MySQL/MariaDB cleaner lock.
    pub(super) fn cleaner_unlock(&self, table: &TableName) -> Option<(&'static str, Vec<Value>)> {
        (self.backend == DbBackend::MySql).then(|| {
            (
                "SELECT RELEASE_LOCK(CONCAT('idem-cleaner:', LEFT(SHA2(CONCAT(DATABASE(), '.', ?), 256), 40)))",
                vec![Value::from(table.as_str().to_owned())],
            )
        })
    }
}

fn numbered(sql: &str) -> String {
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

/// The PostgreSQL advisory lock key of a table's cleaner: stable across processes and versions.
fn advisory_key(table: &TableName) -> i64 {
    let digest = Sha256::digest(format!("idem-cleaner:{}", table.as_str()));
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_placeholders_are_numbered() {
        let s = Statements::new(DbBackend::Postgres, &TableName::default());
        assert!(s.release.ends_with("claim_token = $3"), "{}", s.release);
        assert!(!s.insert_claim.contains('?'));
        assert!(s.insert_claim.contains("$11"));
    }

    #[test]
    fn mysql_claims_with_insert_ignore() {
        let s = Statements::new(DbBackend::MySql, &TableName::default());
        assert!(
            s.insert_claim
                .starts_with("INSERT IGNORE INTO `idem_inbox`")
        );
        assert!(s.select.ends_with("LOCK IN SHARE MODE"));
    }
}

//! The inbox table: its validated name and its schema on each backend.

use sea_orm::DbBackend;

use crate::error::ConfigError;

/// A validated inbox table name: 1 to [`TableName::MAX_LEN`] ASCII letters, digits or
/// underscores, not starting with a digit. It is spliced into SQL, so nothing else is accepted.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName(String);

impl TableName {
    /// The longest name accepted, leaving room for the index name derived from it.
    pub const MAX_LEN: usize = 48;

    /// The table name used when none is configured.
    pub const DEFAULT: &'static str = "idem_inbox";

    /// Validates `name`.
    ///
    /// ```
    /// use idem_runtime::schema::TableName;
    /// assert!(TableName::new("billing_inbox").is_ok());
    /// assert!(TableName::new("inbox; DROP TABLE orders").is_err());
    /// assert!(TableName::new("1inbox").is_err());
    /// ```
    pub fn new(name: impl Into<String>) -> Result<Self, ConfigError> {
        let name = name.into();
        let valid = !name.is_empty()
            && name.len() <= Self::MAX_LEN
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if valid {
            Ok(Self(name))
        } else {
            Err(ConfigError::InvalidTableName(name))
        }
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name quoted for `backend`.
    pub(crate) fn quoted(&self, backend: DbBackend) -> String {
        match backend {
            DbBackend::MySql => format!("`{}`", self.0),
            _ => format!("\"{}\"", self.0),
        }
    }
}

impl Default for TableName {
    fn default() -> Self {
        Self(Self::DEFAULT.to_owned())
    }
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The statements that create the inbox table and its expiry index, and the two tables beside
/// it (the duplicates' summaries and the digests of deleted keys), idempotently.
///
/// Keys are compared byte for byte on every backend: MySQL/MariaDB store them as `VARBINARY`,
/// because their default collations would make `"A"` equal `"a"` and `"a"` equal `"a "`.
/// Timestamps are milliseconds since the Unix epoch (`BIGINT`); fingerprints are the 32 bytes of
/// a SHA-256 hash.
pub fn create_table_statements(backend: DbBackend, table: &TableName) -> Vec<String> {
    let name = table.quoted(backend);
    let index = match backend {
        DbBackend::MySql => format!("`{}_expires_at`", table.as_str()),
        _ => format!("\"{}_expires_at\"", table.as_str()),
    };
    let (key_type, consumer_type, output_type, hash_type) = match backend {
        DbBackend::MySql => (
            "VARBINARY(255)",
            "VARBINARY(128)",
            "MEDIUMTEXT",
            "BINARY(32)",
        ),
        DbBackend::Postgres => ("VARCHAR(255)", "VARCHAR(128)", "TEXT", "BYTEA"),
        _ => ("VARCHAR(255)", "VARCHAR(128)", "TEXT", "BLOB"),
    };
    let columns = format!(
        "consumer {consumer_type} NOT NULL, \
         message_key {key_type} NOT NULL, \
         status VARCHAR(16) NOT NULL, \
         fingerprint {hash_type} NULL, \
         output {output_type} NULL, \
         attempts BIGINT NOT NULL, \
         claim_token BIGINT NOT NULL, \
         created_at BIGINT NOT NULL, \
         claimed_at BIGINT NOT NULL, \
         lease_until BIGINT NULL, \
         completed_at BIGINT NULL, \
         expires_at BIGINT NOT NULL, \
         PRIMARY KEY (consumer, message_key)"
    );
    let mut statements = match backend {
        DbBackend::MySql => vec![format!(
            "CREATE TABLE IF NOT EXISTS {name} ({columns}, INDEX {index} (expires_at)) \
             ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
        )],
        _ => vec![
            format!("CREATE TABLE IF NOT EXISTS {name} ({columns})"),
            format!("CREATE INDEX IF NOT EXISTS {index} ON {name} (expires_at)"),
        ],
    };
    statements.extend(companion_statements(backend, table, consumer_type));
    statements
}

/// The tables beside the inbox: what the processes learnt of each consumer's duplicates
/// (`<table>_dup_daily`, a row per consumer and day), and the digests of the keys the cleaner
/// deleted (`<table>_key_digest`, Bloom filters by consumer, period and piece of 4 KiB).
fn companion_statements(backend: DbBackend, table: &TableName, consumer: &str) -> Vec<String> {
    let (blob, double) = match backend {
        DbBackend::MySql => ("BLOB", "DOUBLE"),
        DbBackend::Postgres => ("BYTEA", "DOUBLE PRECISION"),
        _ => ("BLOB", "REAL"),
    };
    let engine = match backend {
        DbBackend::MySql => " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
        _ => "",
    };
    let daily = companion(backend, table, DUP_DAILY);
    let digest = companion(backend, table, KEY_DIGEST);
    let ages: String = (0..10)
        .map(|i| format!("age_{i} BIGINT NOT NULL, "))
        .collect();
    let digest_columns = format!(
        "consumer {consumer} NOT NULL, period_ms BIGINT NOT NULL, piece BIGINT NOT NULL, \
         key_count BIGINT NOT NULL, newest_completed_ms BIGINT NOT NULL, \
         updated_ms BIGINT NOT NULL, bits {blob} NOT NULL, \
         PRIMARY KEY (consumer, period_ms, piece)"
    );
    // Every process reads the pieces written since its last look.
    let (index, index_name) = ("(updated_ms)", format!("{}_kd_updated", table.as_str()));
    let mut statements = vec![format!(
        "CREATE TABLE IF NOT EXISTS {daily} (consumer {consumer} NOT NULL, \
         day_ms BIGINT NOT NULL, since_ms BIGINT NOT NULL, updated_ms BIGINT NOT NULL, \
         duplicates BIGINT NOT NULL, {ages}max_age_ms BIGINT NOT NULL, \
         late_expired BIGINT NOT NULL, late_expired_max_age_ms BIGINT NOT NULL, \
         late_deleted BIGINT NOT NULL, late_deleted_max_age_ms BIGINT NOT NULL, \
         expected_false_alarms {double} NOT NULL, retention_ms BIGINT NULL, \
         window_ms BIGINT NULL, PRIMARY KEY (consumer, day_ms)){engine}"
    )];
    match backend {
        DbBackend::MySql => statements.push(format!(
            "CREATE TABLE IF NOT EXISTS {digest} ({digest_columns}, \
             INDEX `{index_name}` {index}){engine}"
        )),
        _ => statements.extend([
            format!("CREATE TABLE IF NOT EXISTS {digest} ({digest_columns})"),
            format!("CREATE INDEX IF NOT EXISTS \"{index_name}\" ON {digest} {index}"),
        ]),
    }
    statements
}

/// The suffix of the table of duplicates' summaries, by consumer and day.
pub(crate) const DUP_DAILY: &str = "dup_daily";

/// The suffix of the table of deleted keys' digests, by consumer, period and piece.
pub(crate) const KEY_DIGEST: &str = "key_digest";

/// The suffixes of the tables earlier versions kept beside the inbox (summaries by process,
/// digests in one blob a filter), which this version neither reads nor writes.
#[cfg(feature = "migration")]
pub(crate) const FORMER_COMPANIONS: [&str; 2] = ["duplicates", "digest"];

/// The table `<table>_<suffix>`, quoted for `backend`.
pub(crate) fn companion(backend: DbBackend, table: &TableName, suffix: &str) -> String {
    match backend {
        DbBackend::MySql => format!("`{}_{suffix}`", table.as_str()),
        _ => format!("\"{}_{suffix}\"", table.as_str()),
    }
}

/// The statements that drop the inbox table and those beside it, those of earlier versions
/// included (the migration's `down`).
#[cfg(feature = "migration")]
pub(crate) fn drop_table_statements(backend: DbBackend, table: &TableName) -> Vec<String> {
    let companions = [DUP_DAILY, KEY_DIGEST].into_iter().chain(FORMER_COMPANIONS);
    std::iter::once(table.quoted(backend))
        .chain(companions.map(|suffix| companion(backend, table, suffix)))
        .map(|name| format!("DROP TABLE IF EXISTS {name}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_identifiers() {
        for bad in ["", "a-b", "a b", "a\"b", "9lives", "é", &"x".repeat(49)] {
            assert!(TableName::new(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["inbox", "_inbox", "Inbox_2", &"x".repeat(48)] {
            assert!(TableName::new(good).is_ok(), "{good:?} refused");
        }
    }
}

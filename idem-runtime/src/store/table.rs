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

/// The tables beside the inbox: what each process learnt of each consumer's duplicates
/// (`<table>_duplicates`, a row per consumer and process), and the digests of the keys the
/// cleaner deleted (`<table>_digest`, Bloom filters by consumer and period).
fn companion_statements(backend: DbBackend, table: &TableName, consumer: &str) -> Vec<String> {
    let blob = match backend {
        DbBackend::MySql => "MEDIUMBLOB",
        DbBackend::Postgres => "BYTEA",
        _ => "BLOB",
    };
    let engine = match backend {
        DbBackend::MySql => " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
        _ => "",
    };
    let duplicates = companion(backend, table, DUPLICATES);
    let digest = companion(backend, table, DIGEST);
    vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {duplicates} (consumer {consumer} NOT NULL, \
             instance VARCHAR(36) NOT NULL, since_ms BIGINT NOT NULL, \
             updated_ms BIGINT NOT NULL, duplicates BIGINT NOT NULL, ages VARCHAR(255) NOT NULL, \
             max_age_ms BIGINT NOT NULL, late BIGINT NOT NULL, late_deleted BIGINT NOT NULL, \
             false_alarms_micros BIGINT NOT NULL, window_ms BIGINT NULL, \
             PRIMARY KEY (consumer, instance)){engine}"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {digest} (consumer {consumer} NOT NULL, \
             period_ms BIGINT NOT NULL, key_count BIGINT NOT NULL, bits {blob} NOT NULL, \
             updated_ms BIGINT NOT NULL, PRIMARY KEY (consumer, period_ms)){engine}"
        ),
    ]
}

/// The suffix of the table of duplicates' summaries.
pub(crate) const DUPLICATES: &str = "duplicates";

/// The suffix of the table of deleted keys' digests.
pub(crate) const DIGEST: &str = "digest";

/// The table `<table>_<suffix>`, quoted for `backend`.
pub(crate) fn companion(backend: DbBackend, table: &TableName, suffix: &str) -> String {
    match backend {
        DbBackend::MySql => format!("`{}_{suffix}`", table.as_str()),
        _ => format!("\"{}_{suffix}\"", table.as_str()),
    }
}

/// The statements that drop the inbox table and those beside it (the migration's `down`).
#[cfg(feature = "migration")]
pub(crate) fn drop_table_statements(backend: DbBackend, table: &TableName) -> Vec<String> {
    [
        table.quoted(backend),
        companion(backend, table, DUPLICATES),
        companion(backend, table, DIGEST),
    ]
    .iter()
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

//! The tables' schemas: what every backend declares alike (their columns, the tables beside
//! the inbox, the outbox's indexes), and what each declares its own way.
//!
//! Keys are compared byte for byte on every backend: MySQL/MariaDB store them as `VARBINARY`,
//! because their default collations would make `"A"` equal `"a"` and `"a"` equal `"a "`.
//! Timestamps are milliseconds since the Unix epoch (`BIGINT`); fingerprints are the 32 bytes of
//! a SHA-256 hash.

use super::syntax::Syntax;

/// The suffix of the table of duplicates' summaries, by consumer and day.
pub(crate) const DUP_DAILY: &str = "dup_daily";

/// The suffix of the table of deleted keys' digests, by consumer, period and piece.
pub(crate) const KEY_DIGEST: &str = "key_digest";

/// The statements that create each table idem keeps, idempotently.
pub(crate) trait SchemaSql {
    /// The inbox table and its expiry index, and the tables beside it: what the processes
    /// learnt of each consumer's duplicates (a row per consumer and day), and the digests of the
    /// keys the cleaner deleted (Bloom filters by consumer, period and piece of 4 KiB).
    fn inbox_tables(&self, table: &str) -> Vec<String>;

    /// The outbox table and its indexes.
    fn outbox_table(&self, table: &str) -> Vec<String>;

    /// What brings an outbox table of an earlier version (without `held_until` and its indexes)
    /// to this version's schema.
    fn outbox_upgrade(&self, table: &str) -> Vec<String>;
}

/// The column types of the inbox table and of those beside it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InboxTypes {
    pub(crate) key: &'static str,
    pub(crate) consumer: &'static str,
    pub(crate) output: &'static str,
    pub(crate) hash: &'static str,
    pub(crate) blob: &'static str,
    pub(crate) double: &'static str,
}

/// The column types of the outbox table.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OutboxTypes {
    pub(crate) seq: &'static str,
    pub(crate) id: &'static str,
    pub(crate) payload: &'static str,
    pub(crate) text: &'static str,
}

/// `<table>_<suffix>`, quoted.
pub(crate) fn derived_name(sql: &dyn Syntax, table: &str, suffix: &str) -> String {
    sql.quote(&format!("{table}_{suffix}"))
}

/// The inbox table's columns and primary key.
pub(crate) fn inbox_columns(types: &InboxTypes) -> String {
    format!(
        "consumer {} NOT NULL, \
         message_key {} NOT NULL, \
         status VARCHAR(16) NOT NULL, \
         fingerprint {} NULL, \
         output {} NULL, \
         attempts BIGINT NOT NULL, \
         claim_token BIGINT NOT NULL, \
         created_at BIGINT NOT NULL, \
         claimed_at BIGINT NOT NULL, \
         lease_until BIGINT NULL, \
         completed_at BIGINT NULL, \
         expires_at BIGINT NOT NULL, \
         PRIMARY KEY (consumer, message_key)",
        types.consumer, types.key, types.hash, types.output
    )
}

/// The statement that creates the table of duplicates' summaries, its options `options`.
pub(crate) fn daily_table(
    sql: &dyn Syntax,
    table: &str,
    types: &InboxTypes,
    options: &str,
) -> String {
    let ages: String = (0..10)
        .map(|i| format!("age_{i} BIGINT NOT NULL, "))
        .collect();
    format!(
        "CREATE TABLE IF NOT EXISTS {} (consumer {} NOT NULL, \
         day_ms BIGINT NOT NULL, since_ms BIGINT NOT NULL, updated_ms BIGINT NOT NULL, \
         duplicates BIGINT NOT NULL, {ages}max_age_ms BIGINT NOT NULL, \
         late_expired BIGINT NOT NULL, late_expired_max_age_ms BIGINT NOT NULL, \
         late_deleted BIGINT NOT NULL, late_deleted_max_age_ms BIGINT NOT NULL, \
         expected_false_alarms {} NOT NULL, retention_ms BIGINT NULL, \
         window_ms BIGINT NULL, PRIMARY KEY (consumer, day_ms)){options}",
        derived_name(sql, table, DUP_DAILY),
        types.consumer,
        types.double
    )
}

/// The columns and primary key of the table of deleted keys' digests.
pub(crate) fn digest_columns(types: &InboxTypes) -> String {
    format!(
        "consumer {} NOT NULL, period_ms BIGINT NOT NULL, piece BIGINT NOT NULL, \
         key_count BIGINT NOT NULL, newest_completed_ms BIGINT NOT NULL, \
         updated_ms BIGINT NOT NULL, bits {} NOT NULL, \
         PRIMARY KEY (consumer, period_ms, piece)",
        types.consumer, types.blob
    )
}

/// The index of digests by when they were written (every process reads the pieces written
/// since its last look): its name (unquoted) and columns.
pub(crate) fn digest_index(table: &str) -> (String, &'static str) {
    (format!("{}_kd_updated", table), "(updated_ms)")
}

/// The inbox tables as backends that create indexes apart from their tables write them
/// (PostgreSQL, SQLite).
pub(crate) fn inbox_tables(sql: &dyn Syntax, table: &str, types: &InboxTypes) -> Vec<String> {
    let name = sql.quote(table);
    let index = derived_name(sql, table, "expires_at");
    let digest = derived_name(sql, table, KEY_DIGEST);
    let (digest_index, digest_index_columns) = digest_index(table);
    vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {name} ({})",
            inbox_columns(types)
        ),
        format!("CREATE INDEX IF NOT EXISTS {index} ON {name} (expires_at)"),
        daily_table(sql, table, types, ""),
        format!(
            "CREATE TABLE IF NOT EXISTS {digest} ({})",
            digest_columns(types)
        ),
        format!(
            "CREATE INDEX IF NOT EXISTS {} ON {digest} {digest_index_columns}",
            sql.quote(&digest_index)
        ),
    ]
}

/// The outbox table's columns.
pub(crate) fn outbox_columns(types: &OutboxTypes) -> String {
    format!(
        "seq {}, \
         message_id {} NOT NULL, \
         exchange VARCHAR(255) NOT NULL, \
         routing_key VARCHAR(255) NOT NULL, \
         content_type VARCHAR(255) NULL, \
         headers {} NULL, \
         payload {} NOT NULL, \
         origin VARCHAR(512) NULL, \
         staged_at BIGINT NOT NULL, \
         sent_at BIGINT NULL, \
         held_until BIGINT NULL",
        types.seq, types.id, types.text, types.payload
    )
}

/// The outbox's indexes as backends with partial indexes define them, by suffix: pending rows
/// in order (which the cleaner uses too), the rows ready to publish (held ones are not in it,
/// so that a large held backlog costs no scan), each run's unsent rows, and the holds.
pub(crate) const PARTIAL_OUTBOX_INDEXES: [(&str, &str); 4] = [
    ("pending", "(sent_at, seq)"),
    (
        "ready",
        "(seq) WHERE sent_at IS NULL AND held_until IS NULL",
    ),
    (
        "runs",
        "(origin, seq) WHERE sent_at IS NULL AND origin IS NOT NULL",
    ),
    ("held", "(held_until) WHERE held_until IS NOT NULL"),
];

/// `CREATE INDEX IF NOT EXISTS` for each of the outbox's partial indexes.
pub(crate) fn create_outbox_indexes(sql: &dyn Syntax, table: &str) -> Vec<String> {
    let name = sql.quote(table);
    PARTIAL_OUTBOX_INDEXES
        .iter()
        .map(|(suffix, definition)| {
            let index = derived_name(sql, table, suffix);
            format!("CREATE INDEX IF NOT EXISTS {index} ON {name} {definition}")
        })
        .collect()
}

/// The outbox table as backends that create indexes apart from their tables write it.
pub(crate) fn outbox_table(sql: &dyn Syntax, table: &str, types: &OutboxTypes) -> Vec<String> {
    let mut statements = vec![format!(
        "CREATE TABLE IF NOT EXISTS {} ({}, CONSTRAINT {} UNIQUE (message_id))",
        sql.quote(table),
        outbox_columns(types),
        derived_name(sql, table, "message_id")
    )];
    statements.extend(create_outbox_indexes(sql, table));
    statements
}

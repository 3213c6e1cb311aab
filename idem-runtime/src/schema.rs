//! The tables idem keeps in the application's database, for migrations: the statements that
//! create them (and bring an outbox table of the earlier version to this one), and the table
//! names they accept. Inboxes and outboxes create their tables themselves unless told not to
//! (`create_table(false)`); with `sea-orm-migration`, the `migration` feature has migrations.

use sea_orm::DbBackend;

pub use crate::outbox::table::{create_outbox_statements, upgrade_outbox_statements};
use crate::store::dialect::Dialect;
pub use crate::store::table::TableName;

/// The statements that create the inbox table and its expiry index, and the two tables beside
/// it (the duplicates' summaries and the digests of deleted keys), idempotently.
///
/// Keys are compared byte for byte on every backend: MySQL/MariaDB store them as `VARBINARY`,
/// because their default collations would make `"A"` equal `"a"` and `"a"` equal `"a "`.
/// Timestamps are milliseconds since the Unix epoch (`BIGINT`); fingerprints are the 32 bytes of
/// a SHA-256 hash.
pub fn create_table_statements(backend: DbBackend, table: &TableName) -> Vec<String> {
    Dialect::new(backend).inbox_tables(table.as_str())
}

/// The statements that drop the inbox table and those beside it, those of earlier versions
/// included (the migration's `down`).
#[cfg(feature = "migration")]
pub(crate) fn drop_table_statements(backend: DbBackend, table: &TableName) -> Vec<String> {
    use crate::store::table::{DUP_DAILY, FORMER_COMPANIONS, KEY_DIGEST};
    let dialect = Dialect::new(backend);
    let companions = [DUP_DAILY, KEY_DIGEST].into_iter().chain(FORMER_COMPANIONS);
    std::iter::once(table.as_str().to_owned())
        .chain(companions.map(|suffix| format!("{}_{suffix}", table.as_str())))
        .map(|name| format!("DROP TABLE IF EXISTS {}", dialect.quote(&name)))
        .collect()
}

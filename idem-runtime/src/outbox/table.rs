//! The outbox table's schema on each backend, and its upgrade from the schema of earlier
//! versions (each backend's room writes them: `store/sql/`).

use sea_orm::DbBackend;

use crate::store::dialect::Dialect;
use crate::store::table::TableName;

/// The statements that create the outbox table and its indexes, idempotently.
///
/// `seq` orders rows as they were staged; `message_id` is unique, so a handler run that stages
/// again (a redelivery after the inbox record expired) adds nothing; `origin` names the run
/// whose messages go out in order (a handler run, or a run named outside handlers). Times are
/// milliseconds since the Unix epoch by the database's clock: `sent_at` is set when the relay's
/// publish was confirmed, `held_until` while a relay holds the message back (the broker did not
/// take it, or one before it in its run).
///
/// The indexes: pending rows in order (`<table>_pending`, which the cleaner uses too), the rows
/// ready to publish (`<table>_ready`: held ones are not in it, so that a large held backlog
/// costs no scan), each run's unsent rows (`<table>_runs`), and the holds (`<table>_held`).
pub fn create_outbox_statements(backend: DbBackend, table: &TableName) -> Vec<String> {
    Dialect::new(backend).outbox_table(table.as_str())
}

/// The statements that bring an outbox table of an earlier version (without `held_until` and
/// its indexes) to this version's schema, for migrations: run them once, on a table without
/// `held_until` (on PostgreSQL they may run again; MySQL has no `IF NOT EXISTS` for columns,
/// and MySQL/MariaDB run the whole change as one `ALTER TABLE`).
pub fn upgrade_outbox_statements(backend: DbBackend, table: &TableName) -> Vec<String> {
    Dialect::new(backend).outbox_upgrade(table.as_str())
}

/// The statement that drops the outbox table.
#[cfg(feature = "migration")]
pub(crate) fn drop_outbox_statement(backend: DbBackend, table: &TableName) -> String {
    format!(
        "DROP TABLE IF EXISTS {}",
        Dialect::new(backend).quote(table.as_str())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_backend_indexes_ready_rows_and_runs() {
        let table = TableName::new("idem_outbox").unwrap();
        let pg = Dialect::named("postgres")
            .outbox_table(table.as_str())
            .join("\n");
        assert!(
            pg.contains(
                "CREATE INDEX IF NOT EXISTS \"idem_outbox_ready\" ON \"idem_outbox\" (seq) \
             WHERE sent_at IS NULL AND held_until IS NULL"
            ),
            "{pg}"
        );
        let my = Dialect::named("mariadb")
            .outbox_table(table.as_str())
            .join("\n");
        assert!(
            my.contains("KEY `idem_outbox_runs` (origin, sent_at, seq)"),
            "{my}"
        );
        let upgrade = Dialect::named("mariadb")
            .outbox_upgrade(table.as_str())
            .join("\n");
        assert!(
            upgrade.contains("ADD INDEX `idem_outbox_ready`"),
            "{upgrade}"
        );
        // MySQL proper has no `IF NOT EXISTS` for columns and indexes.
        assert!(!upgrade.contains("IF NOT EXISTS"), "{upgrade}");
        assert!(!upgrade.contains("idem_outbox_pending"), "{upgrade}");
    }
}

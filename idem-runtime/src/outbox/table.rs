//! The outbox table's schema on each backend, and its upgrade from the schema of earlier
//! versions.

use sea_orm::DbBackend;

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
    let name = table.quoted(backend);
    let (seq, id, payload, text) = match backend {
        DbBackend::MySql => (
            "BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY",
            "VARBINARY(255)",
            "LONGBLOB",
            "MEDIUMTEXT",
        ),
        DbBackend::Postgres => ("BIGSERIAL PRIMARY KEY", "VARCHAR(255)", "BYTEA", "TEXT"),
        _ => (
            "INTEGER PRIMARY KEY AUTOINCREMENT",
            "VARCHAR(255)",
            "BLOB",
            "TEXT",
        ),
    };
    let columns = format!(
        "seq {seq}, \
         message_id {id} NOT NULL, \
         exchange VARCHAR(255) NOT NULL, \
         routing_key VARCHAR(255) NOT NULL, \
         content_type VARCHAR(255) NULL, \
         headers {text} NULL, \
         payload {payload} NOT NULL, \
         origin VARCHAR(512) NULL, \
         staged_at BIGINT NOT NULL, \
         sent_at BIGINT NULL, \
         held_until BIGINT NULL"
    );
    let unique = index_name(backend, table, "message_id");
    match backend {
        DbBackend::MySql => {
            let keys: Vec<String> = indexes(backend, table)
                .into_iter()
                .map(|(index, definition)| format!("KEY {index} {definition}"))
                .collect();
            vec![format!(
                "CREATE TABLE IF NOT EXISTS {name} ({columns}, UNIQUE KEY {unique} (message_id), \
                 {}) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
                keys.join(", ")
            )]
        }
        _ => {
            let mut statements = vec![format!(
                "CREATE TABLE IF NOT EXISTS {name} ({columns}, CONSTRAINT {unique} UNIQUE (message_id))"
            )];
            statements.extend(create_indexes(backend, table));
            statements
        }
    }
}

/// The statements that bring an outbox table of an earlier version (without `held_until` and
/// its indexes) to this version's schema, for migrations: run them once, on a table without
/// `held_until` (on PostgreSQL they may run again; MySQL has no `IF NOT EXISTS` for columns,
/// and MySQL/MariaDB run the whole change as one `ALTER TABLE`).
pub fn upgrade_outbox_statements(backend: DbBackend, table: &TableName) -> Vec<String> {
    let name = table.quoted(backend);
    match backend {
        DbBackend::MySql => {
            let mut clauses = vec!["ADD COLUMN held_until BIGINT NULL".to_owned()];
            clauses.extend(
                indexes(backend, table)
                    .into_iter()
                    .skip(1)
                    .map(|(index, definition)| format!("ADD INDEX {index} {definition}")),
            );
            vec![format!("ALTER TABLE {name} {}", clauses.join(", "))]
        }
        DbBackend::Postgres => {
            let mut statements = vec![format!(
                "ALTER TABLE {name} ADD COLUMN IF NOT EXISTS held_until BIGINT NULL"
            )];
            statements.extend(create_indexes(backend, table));
            statements
        }
        // SQLite adds a column only once: the caller checks that it is missing first.
        _ => {
            let mut statements = vec![format!(
                "ALTER TABLE {name} ADD COLUMN held_until BIGINT NULL"
            )];
            statements.extend(create_indexes(backend, table));
            statements
        }
    }
}

/// `CREATE INDEX IF NOT EXISTS` for each index (PostgreSQL, SQLite).
fn create_indexes(backend: DbBackend, table: &TableName) -> Vec<String> {
    let name = table.quoted(backend);
    indexes(backend, table)
        .into_iter()
        .map(|(index, definition)| {
            let (columns, condition) = definition
                .split_once(" WHERE ")
                .map_or((definition.as_str(), None), |(c, w)| (c, Some(w)));
            let condition = condition.map_or(String::new(), |w| format!(" WHERE {w}"));
            format!("CREATE INDEX IF NOT EXISTS {index} ON {name} {columns}{condition}")
        })
        .collect()
}

/// Each index's name and definition (`(columns)`, with ` WHERE ...` where the backend has
/// partial indexes): pending, ready, runs, held.
fn indexes(backend: DbBackend, table: &TableName) -> Vec<(String, String)> {
    let partial = backend != DbBackend::MySql;
    let definitions = if partial {
        [
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
        ]
    } else {
        [
            ("pending", "(sent_at, seq)"),
            ("ready", "(sent_at, held_until, seq)"),
            ("runs", "(origin, sent_at, seq)"),
            ("held", "(held_until)"),
        ]
    };
    definitions
        .into_iter()
        .map(|(suffix, definition)| (index_name(backend, table, suffix), definition.to_owned()))
        .collect()
}

/// `<table>_<suffix>`, quoted.
pub(super) fn index_name(backend: DbBackend, table: &TableName, suffix: &str) -> String {
    match backend {
        DbBackend::MySql => format!("`{}_{suffix}`", table.as_str()),
        _ => format!("\"{}_{suffix}\"", table.as_str()),
    }
}

/// The statement that drops the outbox table.
#[cfg(feature = "migration")]
pub(crate) fn drop_outbox_statement(backend: DbBackend, table: &TableName) -> String {
    format!("DROP TABLE IF EXISTS {}", table.quoted(backend))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_backend_indexes_ready_rows_and_runs() {
        let table = TableName::new("idem_outbox").unwrap();
        let pg = create_outbox_statements(DbBackend::Postgres, &table).join("\n");
        assert!(
            pg.contains(
                "CREATE INDEX IF NOT EXISTS \"idem_outbox_ready\" ON \"idem_outbox\" (seq) \
             WHERE sent_at IS NULL AND held_until IS NULL"
            ),
            "{pg}"
        );
        let my = create_outbox_statements(DbBackend::MySql, &table).join("\n");
        assert!(
            my.contains("KEY `idem_outbox_runs` (origin, sent_at, seq)"),
            "{my}"
        );
        let upgrade = upgrade_outbox_statements(DbBackend::MySql, &table).join("\n");
        assert!(
            upgrade.contains("ADD INDEX `idem_outbox_ready`"),
            "{upgrade}"
        );
        // MySQL proper has no `IF NOT EXISTS` for columns and indexes.
        assert!(!upgrade.contains("IF NOT EXISTS"), "{upgrade}");
        assert!(!upgrade.contains("idem_outbox_pending"), "{upgrade}");
    }
}

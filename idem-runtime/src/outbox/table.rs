//! The outbox table's schema on each backend.

use sea_orm::DbBackend;

use crate::store::table::TableName;

/// The statements that create the outbox table and its index of pending rows, idempotently.
///
/// `seq` orders rows as they were staged; `message_id` is unique, so a handler run that stages
/// again (a redelivery after the inbox record expired) adds nothing. Times are milliseconds since
/// the Unix epoch by the database's clock; `sent_at` is set when the relay's publish was
/// confirmed.
pub fn create_outbox_statements(backend: DbBackend, table: &TableName) -> Vec<String> {
    let name = table.quoted(backend);
    let quote = |suffix: &str| match backend {
        DbBackend::MySql => format!("`{}_{suffix}`", table.as_str()),
        _ => format!("\"{}_{suffix}\"", table.as_str()),
    };
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
         sent_at BIGINT NULL"
    );
    let unique = quote("message_id");
    let pending = quote("pending");
    match backend {
        DbBackend::MySql => vec![format!(
            "CREATE TABLE IF NOT EXISTS {name} ({columns}, UNIQUE KEY {unique} (message_id), \
             KEY {pending} (sent_at, seq)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
        )],
        _ => vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {name} ({columns}, CONSTRAINT {unique} UNIQUE (message_id))"
            ),
            format!("CREATE INDEX IF NOT EXISTS {pending} ON {name} (sent_at, seq)"),
        ],
    }
}

/// The statement that drops the outbox table.
#[cfg(feature = "migration")]
pub(crate) fn drop_outbox_statement(backend: DbBackend, table: &TableName) -> String {
    format!("DROP TABLE IF EXISTS {}", table.quoted(backend))
}

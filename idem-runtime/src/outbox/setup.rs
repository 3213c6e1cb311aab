//! The outbox table made, or brought from an earlier version's to this one, and checked.

use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement, TransactionOptions, Value};

use super::shared::Shared;
use super::table::{create_outbox_statements, upgrade_outbox_statements};
use crate::store::dialect::begin_detached;

pub(super) async fn create_table(shared: &Shared) -> Result<(), DbErr> {
    let tx = begin_detached(&shared.db, TransactionOptions::default()).await?;
    if let Some((sql, values)) = shared.dialect.schema_lock(shared.table.as_str()) {
        tx.query_one_raw(Statement::from_sql_and_values(
            shared.backend(),
            sql,
            values,
        ))
        .await?;
    }
    // The table, a table of an earlier version brought to this one, then the indexes
    // (some of which read columns an earlier version's table lacks).
    let statements = create_outbox_statements(shared.backend(), &shared.table);
    let (table, indexes) = statements.split_first().expect("a table statement");
    tx.execute_unprepared(table).await?;
    upgrade_table(shared, &tx).await?;
    for sql in indexes {
        tx.execute_unprepared(sql).await?;
    }
    tx.commit().await
}

/// Brings a table an earlier version created to this version's schema: the `held_until`
/// column and the indexes of ready rows, runs and holds.
async fn upgrade_table(shared: &Shared, db: &impl ConnectionTrait) -> Result<(), DbErr> {
    let column = match shared.backend() {
        DbBackend::Postgres => {
            "SELECT 1 FROM information_schema.columns WHERE \
             table_schema = current_schema() AND table_name = $1 AND column_name = 'held_until'"
        }
        DbBackend::MySql => {
            "SELECT 1 FROM information_schema.columns WHERE \
             table_schema = DATABASE() AND table_name = ? AND column_name = 'held_until'"
        }
        _ => "SELECT 1 FROM pragma_table_info(?) WHERE name = 'held_until'",
    };
    let table = Value::from(&shared.table.as_str().to_owned());
    let upgraded = || async {
        let check = shared.statement(column, vec![table.clone()]);
        db.query_one_raw(check).await.map(|row| row.is_some())
    };
    if upgraded().await? {
        return Ok(());
    }
    tracing::info!(table = &shared.table.as_str(), "upgrading the outbox table");
    for sql in upgrade_outbox_statements(shared.backend(), &shared.table) {
        if let Err(error) = db.execute_unprepared(&sql).await {
            // Another process starting at the same time upgraded it first.
            if shared.backend() != DbBackend::Postgres && upgraded().await? {
                return Ok(());
            }
            return Err(error);
        }
    }
    Ok(())
}

/// Reads every column this version uses, from no row: a table of another shape fails here.
pub(super) async fn check_schema(shared: &Shared) -> Result<(), DbErr> {
    let sql = &shared.statements.check_schema;
    shared
        .db
        .query_all_raw(shared.statement(sql, Vec::new()))
        .await?;
    Ok(())
}

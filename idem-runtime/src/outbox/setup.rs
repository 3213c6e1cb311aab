//! The outbox table made, or brought from an earlier version's to this one, and checked.

use sea_orm::{ConnectionTrait, DbErr, Statement, TransactionOptions, Value};

use super::shared::Shared;
use crate::store::dialect::{begin_detached, lock_name};

pub(super) async fn create_table(shared: &Shared) -> Result<(), DbErr> {
    let tx = begin_detached(&shared.db, TransactionOptions::default()).await?;
    if let Some((sql, values)) =
        (shared.dialect).schema_lock(&lock_name("schema", shared.table.as_str()))
    {
        tx.query_one_raw(Statement::from_sql_and_values(
            shared.backend(),
            sql,
            values,
        ))
        .await?;
    }
    // The table, a table of an earlier version brought to this one, then the indexes
    // (some of which read columns an earlier version's table lacks).
    let statements = shared.dialect.outbox_table(shared.table.as_str());
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
    let column = shared.dialect.column_exists("held_until");
    let table = Value::from(&shared.table.as_str().to_owned());
    let upgraded = || async {
        let check = shared.statement(&column, vec![table.clone()]);
        db.query_one_raw(check).await.map(|row| row.is_some())
    };
    if upgraded().await? {
        return Ok(());
    }
    tracing::info!(table = &shared.table.as_str(), "upgrading the outbox table");
    for sql in shared.dialect.outbox_upgrade(shared.table.as_str()) {
        if let Err(error) = db.execute_unprepared(&sql).await {
            // Another process starting at the same time upgraded it first.
            if !shared.dialect.aborts_on_error() && upgraded().await? {
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

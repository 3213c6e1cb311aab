//! The inbox table as a `sea-orm-migration` migration, for applications that run their own
//! migrator (feature `migration`).
//!
//! ```no_run
//! use idem_runtime::schema::TableName;
//! use idem_runtime::migration::{CreateInbox, CreateInboxCompanions, UpgradeInboxCompanions};
//! use sea_orm_migration::{MigrationTrait, MigratorTrait};
//!
//! struct Migrator;
//!
//! impl MigratorTrait for Migrator {
//!     fn migrations() -> Vec<Box<dyn MigrationTrait>> {
//!         vec![
//!             Box::new(CreateInbox::default()), // `idem_inbox`
//!             Box::new(CreateInbox::new(TableName::new("billing_inbox").unwrap())),
//!             // For tables created before the duplicates' summaries and digests came:
//!             Box::new(CreateInboxCompanions::default()),
//!             // For tables whose companions came before they went by day and by piece:
//!             Box::new(UpgradeInboxCompanions::default()),
//!         ]
//!     }
//! }
//! ```
//!
//! Then build the inbox with [`InboxBuilder::create_table(false)`](crate::InboxBuilder::create_table).

use sea_orm_migration::prelude::*;

use crate::outbox::{create_outbox_statements, drop_outbox_statement};
use crate::schema::{TableName, create_table_statements, drop_table_statements};

/// Creates the inbox table, its expiry index and the tables beside it (`up`) or drops them
/// (`down`).
///
/// Its name is `m20261129_000001_create_<table>`, so that migrations of several inbox tables are
/// recorded apart; the default table's is `m20261129_000001_create_idem_inbox`.
#[derive(Debug, Clone)]
pub struct CreateInbox {
    table: TableName,
    name: String,
}

impl CreateInbox {
    /// The migration for a table with a custom name.
    pub fn new(table: TableName) -> Self {
        let name = format!("m20261129_000001_create_{table}");
        Self { table, name }
    }
}

impl Default for CreateInbox {
    /// The migration for the default table, `idem_inbox`.
    fn default() -> Self {
        Self::new(TableName::default())
    }
}

impl MigrationName for CreateInbox {
    fn name(&self) -> &str {
        &self.name
    }
}

// The trait's signature elides `SchemaManager`'s lifetime; an impl must match it.
#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for CreateInbox {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for sql in create_table_statements(db.get_database_backend(), &self.table) {
            db.execute_unprepared(&sql).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for sql in drop_table_statements(db.get_database_backend(), &self.table) {
            db.execute_unprepared(&sql).await?;
        }
        Ok(())
    }
}

/// Creates the tables beside an inbox table made by an earlier [`CreateInbox`]: the
/// duplicates' summaries (`<table>_duplicates`) and the digests of deleted keys
/// (`<table>_digest`), which `idem retention advise` reads. Idempotent (`up`); `down` drops
/// them.
///
/// Its name is `m20261202_000001_create_<table>_companions`.
#[derive(Debug, Clone)]
pub struct CreateInboxCompanions {
    table: TableName,
    name: String,
}

impl CreateInboxCompanions {
    /// The migration for a table with a custom name.
    pub fn new(table: TableName) -> Self {
        let name = format!("m20261202_000001_create_{table}_companions");
        Self { table, name }
    }
}

impl Default for CreateInboxCompanions {
    /// The migration for the default table, `idem_inbox`.
    fn default() -> Self {
        Self::new(TableName::default())
    }
}

impl MigrationName for CreateInboxCompanions {
    fn name(&self) -> &str {
        &self.name
    }
}

#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for CreateInboxCompanions {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for sql in create_table_statements(db.get_database_backend(), &self.table) {
            db.execute_unprepared(&sql).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        let backend = db.get_database_backend();
        for sql in drop_table_statements(backend, &self.table).iter().skip(1) {
            db.execute_unprepared(sql).await?;
        }
        Ok(())
    }
}

/// Creates the tables beside an inbox table that this version reads and writes, for a table
/// whose companions an earlier version made: the duplicates' summaries by consumer and day
/// (`<table>_dup_daily`) and the digests of deleted keys in pieces (`<table>_key_digest`).
/// Idempotent. The earlier companions (`<table>_duplicates`, `<table>_digest`) are left in
/// place for processes of the earlier version still running: drop them once none is (`down`
/// drops every companion).
///
/// Its name is `m20261210_000001_upgrade_<table>_companions`.
#[derive(Debug, Clone)]
pub struct UpgradeInboxCompanions {
    table: TableName,
    name: String,
}

impl UpgradeInboxCompanions {
    /// The migration for a table with a custom name.
    pub fn new(table: TableName) -> Self {
        let name = format!("m20261210_000001_upgrade_{table}_companions");
        Self { table, name }
    }
}

impl Default for UpgradeInboxCompanions {
    /// The migration for the default table, `idem_inbox`.
    fn default() -> Self {
        Self::new(TableName::default())
    }
}

impl MigrationName for UpgradeInboxCompanions {
    fn name(&self) -> &str {
        &self.name
    }
}

#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for UpgradeInboxCompanions {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        CreateInboxCompanions::new(self.table.clone())
            .up(manager)
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        CreateInboxCompanions::new(self.table.clone())
            .down(manager)
            .await
    }
}

/// Creates the outbox table and its index of pending rows (`up`) or drops them (`down`).
///
/// Its name is `m20261130_000001_create_<table>`; the default table's is
/// `m20261130_000001_create_idem_outbox`. Build the outbox with
/// [`OutboxBuilder::create_table(false)`](crate::outbox::OutboxBuilder::create_table) then.
#[derive(Debug, Clone)]
pub struct CreateOutbox {
    table: TableName,
    name: String,
}

impl CreateOutbox {
    /// The migration for a table with a custom name.
    pub fn new(table: TableName) -> Self {
        let name = format!("m20261130_000001_create_{table}");
        Self { table, name }
    }
}

impl Default for CreateOutbox {
    /// The migration for the default table, `idem_outbox`.
    fn default() -> Self {
        Self::new(TableName::new(crate::outbox::Outbox::DEFAULT_TABLE).expect("a valid name"))
    }
}

impl MigrationName for CreateOutbox {
    fn name(&self) -> &str {
        &self.name
    }
}

#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for CreateOutbox {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for sql in create_outbox_statements(db.get_database_backend(), &self.table) {
            db.execute_unprepared(&sql).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared(&drop_outbox_statement(
            db.get_database_backend(),
            &self.table,
        ))
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_follows_the_table() {
        // Databases migrated before names followed the table keep theirs.
        assert_eq!(
            CreateInbox::default().name(),
            "m20261129_000001_create_idem_inbox"
        );
        let billing = CreateInbox::new(TableName::new("billing_inbox").unwrap());
        assert_eq!(billing.name(), "m20261129_000001_create_billing_inbox");
    }
}

//! The inbox table as a `sea-orm-migration` migration, for applications that run their own
//! migrator (feature `migration`).
//!
//! ```no_run
//! use idem_runtime::migration::CreateInbox;
//! use sea_orm_migration::{MigrationTrait, MigratorTrait};
//!
//! struct Migrator;
//!
//! impl MigratorTrait for Migrator {
//!     fn migrations() -> Vec<Box<dyn MigrationTrait>> {
//!         vec![Box::new(CreateInbox::default())]
//!     }
//! }
//! ```
//!
//! Then build the inbox with [`InboxBuilder::create_table(false)`](crate::InboxBuilder::create_table).

use sea_orm_migration::prelude::*;

use crate::store::table::{TableName, create_table_statements, drop_table_statement};

/// Creates the inbox table and its expiry index (`up`) or drops them (`down`).
#[derive(Debug, Clone, Default)]
pub struct CreateInbox {
    table: TableName,
}

impl CreateInbox {
    /// The migration for a table with a custom name.
    pub fn new(table: TableName) -> Self {
        Self { table }
    }
}

impl MigrationName for CreateInbox {
    fn name(&self) -> &str {
        "m20261129_000001_create_idem_inbox"
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
        db.execute_unprepared(&drop_table_statement(
            db.get_database_backend(),
            &self.table,
        ))
        .await?;
        Ok(())
    }
}

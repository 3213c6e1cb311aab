//! The tables idem keeps in the application's database, for migrations: the statements that
//! create them (and bring an outbox table of the earlier version to this one), and the table
//! names they accept. Inboxes and outboxes create their tables themselves unless told not to
//! (`create_table(false)`); with `sea-orm-migration`, the `migration` feature has migrations.

pub use crate::outbox::{create_outbox_statements, upgrade_outbox_statements};
pub use crate::store::table::{TableName, create_table_statements};

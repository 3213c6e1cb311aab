//! SQL access to the inbox table: statements prepared once per inbox, run on any connection or
//! transaction.

mod access;
mod cleanup;
pub(crate) mod dialect;
mod failure;
mod many;
mod setup;
pub(crate) mod sql;
pub(crate) mod startup;
mod statements;
mod stats;
pub(crate) mod table;
pub(crate) mod values;

pub use access::MAX_BATCH;
pub(crate) use access::Store;
pub(crate) use cleanup::Cleaning;
pub(crate) use many::Batches;
pub(crate) use setup::Setup;
pub(crate) use stats::Census;
pub(crate) use values::{BatchClaim, ClaimValues, Claims, Deleted, Row};
pub use values::{LiveClaim, Status};

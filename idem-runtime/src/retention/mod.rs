//! Retention of inbox records and their cleanup: how long records are kept
//! ([`RetentionPolicy`], checked against the broker's [`RedeliveryWindow`]), and the [`Cleaner`]
//! that deletes expired records and sent outbox rows in bounded batches.

mod cleaner;
pub(crate) mod policy;

pub(crate) use cleaner::CleanerParts;
pub use cleaner::{Cleaner, CleanerHandle, CleanupReport};
pub use policy::RedeliveryWindow;
pub(crate) use policy::RetentionPolicy;

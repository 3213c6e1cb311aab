//! Retention of inbox records and their cleanup.

mod cleaner;
pub(crate) mod policy;

pub use cleaner::{Cleaner, CleanerHandle, CleanupReport};
pub use policy::{RedeliveryWindow, RetentionPolicy};

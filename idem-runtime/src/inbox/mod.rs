//! The inbox: runs a handler at most once per key, in transactional or two-phase mode.

mod admin;
mod batch;
mod builder;
mod claim;
mod completion;
mod handle;
mod handling;
mod inner;
mod operate;
mod processing;
mod record;
mod renewal;
mod transactional;
mod two_phase;
mod unrecorded;

pub use admin::InboxAdmin;
pub use batch::{BatchChecks, BatchItem, MAX_BATCH};
pub use builder::InboxBuilder;
pub use handle::Inbox;
pub use handling::panic_message;
pub use operate::{ConsumerStats, Forgotten, Released};
pub use processing::Processing;
pub use record::InboxRecord;

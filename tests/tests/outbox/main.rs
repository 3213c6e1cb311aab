//! The transactional outbox: staging, runs and their order, holds, the relay on the real broker,
//! backlogs.
//!
//! One test binary per topic area: each file a module, its tests named `file::test`.

mod outbox;
mod outbox_backlog;
mod outbox_relay;
mod outbox_staging;

//! The transactional outbox: messages a handler stages in its own transaction, committed with
//! its effects and its inbox record or not at all, and published afterwards by a relay (the
//! RabbitMQ adapter's `Relay`) with ids that every re-execution derives identically.
//!
//! Handler authors need [`Outbox`], [`OutboxMessage`] and [`Outbound`] (also at the crate's
//! root). A relay, with the trait [`Relaying`] in scope, of another broker takes committed messages in batches
//! ([`Relaying::take_pending`], a [`PendingBatch`] of [`PendingMessage`]s, locked while it holds
//! them), publishes them, holds back what the broker did not take ([`PendingBatch::hold`],
//! [`PendingBatch::hold_exchange`], released by [`Relaying::release_holds`]) and marks the rest
//! sent ([`PendingBatch::mark_sent`]); it keeps each run's order ([`PendingMessage::run`]) and
//! is woken by commits ([`Relaying::staged`], [`Relaying::local_relay`]).

mod admin;
mod error;
mod handle;
mod holds;
mod message;
mod outbound;
mod pending;
mod pending_message;
mod relaying;
mod run_order;
mod setup;
mod shared;
mod staging;
mod statements;
mod stats;
mod table;

pub use admin::OutboxAdmin;
pub use error::StagingError;
pub use handle::{LocalRelay, Outbox, OutboxBuilder};
pub use holds::{HeldRun, HeldSubject, PendingRow};
pub use message::{OutboxMessage, derived_id};
pub use outbound::Outbound;
pub use pending::PendingBatch;
pub use pending_message::PendingMessage;
pub use relaying::Relaying;
pub(crate) use staging::RunClaim;
pub(crate) use statements::RunStatements;
pub use stats::{HeldExchange, OutboxStats, Pending};
#[cfg(feature = "migration")]
pub(crate) use table::drop_outbox_statement;
pub use table::{create_outbox_statements, upgrade_outbox_statements};

//! The transactional outbox: messages a handler stages in its own transaction, committed with
//! its effects and its inbox record or not at all, and published afterwards by a relay (the
//! RabbitMQ adapter's `Relay`) with ids that every re-execution derives identically.
//!
//! Handler authors need [`Outbox`] and [`Outbound`] here, and the message they stage,
//! [`OutboxMessage`], at the crate's root. A relay of another broker, with
//! the trait [`Relaying`] in scope, takes committed messages in batches ([`Relaying::take_pending`],
//! a [`PendingBatch`] of [`PendingMessage`]s, locked while it holds them), publishes them, holds back what the broker did not take ([`PendingBatch::hold`],
//! [`PendingBatch::hold_exchange`], released by [`Relaying::release_holds`]) and marks the rest
//! sent ([`PendingBatch::mark_sent`]); it keeps each run's order ([`PendingMessage::run`]) and
//! is woken by commits ([`Relaying::staged`], [`Relaying::local_relay`]).

pub(crate) mod admin;
mod error;
mod handle;
pub(crate) mod holds;
pub(crate) mod message;
mod outbound;
mod pending;
mod pending_message;
mod relaying;
mod run_order;
mod setup;
mod shared;
mod staging;
mod statements;
pub(crate) mod stats;
pub(crate) mod table;

pub use error::StagingError;
pub use handle::{LocalRelay, Outbox, OutboxBuilder};
pub(crate) use message::OutboxMessage;
pub use message::derived_id;
pub use outbound::Outbound;
pub use pending::PendingBatch;
pub use pending_message::PendingMessage;
pub use relaying::Relaying;
pub(crate) use staging::RunClaim;
pub(crate) use statements::RunStatements;
pub use stats::Pending;
#[cfg(feature = "migration")]
pub(crate) use table::{create_outbox_statements, drop_outbox_statement};

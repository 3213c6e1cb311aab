//! A model of idem's protocol, checked exhaustively within stated bounds.
//!
//! The model is a state machine of the whole system: the database (the inbox table, business
//! writes, entity markers, the outbox table, open transactions and the row locks they hold), a
//! broker delivering at least once, consumer workers, outbox relays, the cleaner, and an
//! environment that injects faults. Each [`Action`] is one step of idem's code, named in its doc
//! comment (`Inbox::transactional`, `Store::complete`, `HoldMemory::sort`, …): a statement or a
//! commit, a publish, an acknowledgment. A small explicit-state checker ([`check`]) explores
//! every state reachable from the start, breadth-first, and checks the properties in each; a
//! counterexample is a shortest path of actions, printed with its last state.
//!
//! # What is modelled
//!
//! - **Claims** (`inbox/claim.rs`): a conditional insert, or the takeover of a record past its
//!   retention or of a lapsed lease, or a duplicate, or in progress elsewhere, or needs
//!   intervention past `max_attempts`; one atomic step, as its compare-and-swap on the claim
//!   token makes it. A claim waits for a transaction holding the key, or its wait runs out.
//! - **Transactional mode**: claim, handler (its business write and its stagings) and completion
//!   in one transaction, committed or rolled back whole.
//! - **Two-phase mode**: the claim committed with a lease; the handler's side effect is a call
//!   keyed by the message's derived downstream key; renewals; a lease that runs out by the
//!   database's clock (its holder crashed, or is paused or cut off); the takeover; the
//!   completion fenced by the claim token; a failed handler's claim released (first attempt) or
//!   handed on (a takeover).
//! - **Batches** (`inbox/batch/`): keys claimed in one statement, handlers run unguarded first;
//!   a failure rolls the transaction back and the rest run again under a savepoint each
//!   (the default, `BatchChecks::BeforeCommit`, and PostgreSQL's `BatchChecks::EachMessage`,
//!   which the model's handlers, returning every error and leaving their transaction open,
//!   cannot tell apart); records that need more than a read go the
//!   per-message way after the commit; a transaction lost under the batch requeues every message.
//! - **Entity mode**: the marker entity's unique key in the handler's transaction.
//! - **The outbox**: stagings in the handler's transaction with ids derived from (consumer, key,
//!   position); relays taking batches with `SKIP LOCKED`, keeping each run's order, holding a
//!   run back when the broker refuses its exchange (and the exchange "on sight" afterwards), and
//!   marking what was confirmed sent; the downstream consumer records each message id once.
//! - **Retention**: records passing their retention behave as absent; the cleaner deletes them
//!   (skipping locked ones) and writes a digest of the deleted keys at the end of its run, which
//!   each process reads back; a claim counts a late duplicate by the expired record it takes
//!   over or by its process's copy of the digest.
//! - **The environment**: duplicate publishes, redeliveries of whatever a crashed worker held,
//!   acknowledgments lost with their channel, crashes of any process at any step, handler
//!   failures, transactions the database rolls back, leases running out, records expiring, the
//!   missing exchange declared, holds running out.
//!
//! # Properties
//!
//! Checked in every reachable state ([`properties`] has their exact wording):
//!
//! 1. At most one committed effect per key while its record lives (two-phase: one completion).
//! 2. No delivery acknowledged before its effect committed, unless it was dead-lettered.
//! 3. Staged messages published in order within their run; each processed once downstream
//!    (two-phase calls too, by their downstream key); and every run of the model that ends,
//!    ends with every staged message published.
//! 4. A late duplicate (a copy processed again because its record passed its retention) is
//!    counted: by the expired record it finds, or by the digest once the deletion reached the
//!    claiming process.
//!
//! Besides, every run that ends, ends with each message processed or dead-lettered, and
//! "sometimes" properties show the model is not vacuous: messages get processed, duplicates
//! acknowledged, late duplicates counted, leases taken over, stale holders fenced, batches run
//! again, runs held back, messages dead-lettered.
//!
//! # Bounds
//!
//! Each scenario of [`scenarios`] states its bounds (at most two messages, two workers, two
//! relays, two staged messages per run, and one or two faults of each kind); its doc says which.
//! The checks run as this crate's tests, `cargo test -p idem-model`, in well under a minute:
//! `tests/properties.rs` checks every property of every scenario, `tests/planted_bugs.rs` plants
//! bugs (no fencing token, an ack before the commit, a batch run again without rolling back,
//! staged ids not derived) and asserts that the checker finds each one's counterexample, and
//! `tests/known_defects.rs` shows what idem does not guarantee as it is.
//!
//! # What the model leaves out
//!
//! Message content (fingerprints and mismatches), slice handlers, natural mode, operator
//! commands, `BatchChecks::EachMessage` on MySQL/MariaDB and SQLite (a savepoint per message
//! from the first try), publisher confirms that are lost or
//! distrusted (a relay crash stands for them), the outbox's own retention, handlers that
//! swallow database errors or end their transaction, and timing beyond the order of events
//! (a hold, a lease and a retention only run out or not).

pub mod batch;
pub mod broker;
pub mod checker;
pub mod config;
pub mod db;
pub mod inbox;
pub mod model;
pub mod outbox;
pub mod properties;
pub mod retention;
pub mod scenarios;
pub mod state;
pub mod two_phase;

pub use checker::{Expectation, Limits, Model, Path, Property, Report, check};
pub use config::{Bugs, Config, Faults, IdemModel, Intake, Mode, OnSight};
pub use model::Action;

//! Fault injection for idem handlers: run a handler through idem on the application's own
//! database while workers crash at every boundary of the protocol, messages are redelivered
//! and raced, leases run out and the outbox relay crashes; then count each message's effects.
//! Every message must have exactly one. A seed names the run's schedule, so a failing run is
//! replayed exactly.
//!
//! ```
//! use idem_runtime::sea_orm::sea_query::Query;
//! use idem_runtime::sea_orm::{ConnectionTrait, Database, DatabaseTransaction, DbErr};
//! use idem_runtime::idempotent;
//! use idem_testkit::{Effects, FaultKit};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct OrderPlaced { order_id: String, amount: i64 }
//!
//! #[idempotent(key = order.order_id, consumer = "billing.charge")]
//! async fn charge(tx: &DatabaseTransaction, order: OrderPlaced) -> Result<(), DbErr> {
//!     let insert = Query::insert()
//!         .into_table("invoices")
//!         .columns(["order_id", "amount"])
//!         .values_panic([order.order_id.into(), order.amount.into()])
//!         .to_owned();
//!     tx.execute(&insert).await?;
//!     Ok(())
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let db = Database::connect("sqlite::memory:").await?;
//! db.execute_unprepared("CREATE TABLE invoices (order_id TEXT, amount INTEGER)").await?;
//!
//! let report = FaultKit::new(
//!     db,
//!     |i| OrderPlaced { order_id: format!("o-{i}"), amount: 100 + i as i64 },
//!     Effects::rows("invoices", "order_id", |order: &OrderPlaced| order.order_id.clone()),
//! )
//! .seed(7)
//! .run(&charge_handler())
//! .await?;
//! report.assert_effectively_once(); // panics with the findings, the seed and the schedule
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
//! ```
//!
//! # What a run does
//!
//! The kit draws a [`Schedule`] from its seed: steps that deliver a message, deliver it and
//! crash the worker at a [`Boundary`], deliver two or three copies at once, let the leases
//! crashed two-phase workers left run out, and, with a [`Downstream`] handler, relay the
//! outbox (crashing before the publish, or after it and before the messages are marked
//! sent) and deliver what was published downstream (crashing there too). Every schedule
//! crashes at each boundary on a message's first delivery, and, with a downstream handler,
//! opens with a message's delivery followed by each relay crash and a downstream crash at
//! each boundary. Then the run drains: each message not yet
//! acknowledged is delivered until it is, the outbox is relayed until nothing is pending, and
//! every published message is delivered downstream until acknowledged. Last, the kit counts
//! each message's effects with the [`Effects`] it was given.
//!
//! | boundary | transactional handler | two-phase handler |
//! |---|---|---|
//! | [`Boundary::BeforeHandler`] | before the claim commits: it rolls back | after the claim, before the call: the claim stays until its lease runs out |
//! | [`Boundary::AfterHandler`] | after the handler, before the commit: only what the handler did outside the transaction stays | after the call, before the completion: the call stays done |
//! | [`Boundary::AfterCommit`] | the acknowledgment is lost: delivered again | the same |
//!
//! A crash is a killed worker's: the kit drops the future of [`Inbox::process`] (the handler
//! is wrapped to stop at the boundary), so idem's transaction rolls back and its claim stays
//! as it was; idem is never bypassed. A delivery after the first says it is a redelivery, as
//! a broker does ([`Metadata::redelivered`] and the `x-delivery-count` header).
//!
//! # What it catches
//!
//! - An external call (a payment provider) inside a transactional handler: a crash after
//!   the handler rolls the charge's record back, and the redelivery charges again (2 effects).
//! - A key derived from something a redelivery changes (the `redelivered` flag, the delivery
//!   count, a receive time): the redelivery after a lost acknowledgment is a new key, and is
//!   processed again.
//! - A handler that commits its own transaction (a `COMMIT` statement) or writes outside it:
//!   a crash after the handler leaves its effects, and the redelivery adds them again.
//! - A two-phase handler that does not pass its downstream key (`Context::downstream_key`) to
//!   a service that deduplicates by it: a takeover after a crash calls it again.
//! - A downstream handler that keeps no record (declared naturally idempotent when it is
//!   not): the relay, crashed after a publish, publishes the message again.
//!
//! # Replaying a run
//!
//! The report names its seed. [`FaultKit::seed`] with that seed (or `IDEM_TESTKIT_SEED` in
//! the environment of a kit given none) draws the same schedule; run it on a database without
//! the first run's effects (the kit refuses to start when a message already has some).
//! Two things are not the seed's: copies delivered at once interleave as the database lets
//! them, and leases are measured by its clock. A handler whose effects depend on how its
//! copies interleave (one that commits half-way, racing its copies) can count differently on
//! a replay, and a machine slower than the lease can change what a step gave; the schedule,
//! and the findings of a handler whose effects depend only on what it is given, stay.
//!
//! # What it does not cover
//!
//! Batches and slice handlers (`Inbox::process_batch`), the broker's own behaviour (delivery
//! limits, dead-letter queues, prefetch), a database that goes away or fails over, the
//! cleaner and late duplicates past the retention, and crashes inside the handler between two
//! of its own statements. Effects are counted once the run has drained, not while it runs.
//!
//! # Features
//!
//! | feature | what it enables |
//! |---|---|
//! | `sqlite` | idem-runtime's SQLite |
//! | `postgres` | idem-runtime's PostgreSQL |
//! | `mysql` | idem-runtime's MySQL and MariaDB |
//!
//! The kit runs on whichever backends the application's idem-runtime is built with; the
//! features only forward to it.
//!
//! [`Inbox::process`]: idem_runtime::Inbox::process
//! [`Metadata::redelivered`]: idem_runtime::Metadata::redelivered

mod delivery;
mod downstream;
mod effects;
mod error;
mod faults;
mod kit;
mod relay;
mod report;
mod rng;
mod run;
mod schedule;

pub use delivery::DELIVERY_COUNT_HEADER;
pub use downstream::Downstream;
pub use effects::Effects;
pub use error::{Error, Result};
pub use kit::FaultKit;
pub use report::{Finding, Report};
pub use rng::SEED_VARIABLE;
pub use schedule::{Boundary, RelayCrash, Schedule, Step};

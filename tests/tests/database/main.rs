//! The inbox on each database: claims, handlers, batches and slices, two-phase leases, entity mode,
//! retention and late duplicates, outages and edge cases, and the attribute's expansion.
//!
//! One test binary per topic area: each file a module, its tests named `file::test`.

mod batch;
mod batch_faults;
mod cancellation;
mod cleanup;
mod clocks;
mod edges_deployment;
mod edges_outage;
mod edges_transactions;
mod edges_two_phase;
mod entity;
mod inbox;
mod late_duplicates;
mod macros;
mod slices;

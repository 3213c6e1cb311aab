//! The examples' services end to end, against the real broker and databases: the billing demo
//! through a crash and restart, the command line, the fault-injection kit on the examples'
//! handlers, the Prometheus endpoint, orders over HTTP, and status events out of order.
//!
//! One test binary: each file a module, its tests named `file::test`.

#[path = "../common/mod.rs"]
mod common;

mod billing_demo;
mod cli;
mod faults;
mod metrics;
mod orders_http;
mod orders_http_answers;
mod statuses;

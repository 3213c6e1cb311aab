//! Shared context for idem's end-to-end tests: real databases (SQLite, PostgreSQL, MariaDB)
//! with per-test tables, the real RabbitMQ with per-test queues, a proxy to cut a database off,
//! and a recording handler.
//!
//! Run them with the command the README gives; the PostgreSQL and MariaDB servers must be up
//! (`.ci/run` starts them). A missing server fails the tests, it never skips them.

pub mod db;
pub mod proxy;
pub mod rabbit;
pub mod recorder;

pub use db::{Backend, TestDb, unique};
pub use rabbit::TestBroker;
pub use recorder::{Msg, Recorder};

//! A model of idem's protocol, checked exhaustively.
//!
//! TODO: crate docs.

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
pub use config::{Bugs, Config, Faults, Intake, Mode, OnSight};
pub use model::{Action, IdemModel};

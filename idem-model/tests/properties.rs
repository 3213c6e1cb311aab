//! idem's properties, checked exhaustively on each scenario of `idem_model::scenarios` (its doc
//! gives the bounds). Run with `cargo test -p idem-model --test properties -- --nocapture` to
//! see the states explored and the time taken.

use idem_model::{Config, IdemModel, Limits, check, scenarios};

/// Explores every state of `config`, prints what it found, and fails with the counterexample
/// of any property that does not hold (or the name of one never reached).
fn holds(name: &str, config: Config) {
    let report = check(&IdemModel::new(config), Limits::default());
    println!("{name}: {report}");
    report.assert_properties();
}

#[test]
fn transactional_mode() {
    holds("transactional", scenarios::transactional());
}

#[test]
fn retention_and_late_duplicates() {
    holds("retention", scenarios::retention());
}

#[test]
fn two_phase_mode() {
    holds("two-phase", scenarios::two_phase());
}

#[test]
fn batches() {
    holds("batches", scenarios::batch());
}

#[test]
fn entity_mode() {
    holds("entity", scenarios::entity());
}

/// The relays with the on-sight hold that keeps a run together: the as-is relay reorders a
/// run (see `known_defects.rs`).
#[test]
fn outbox_relays() {
    holds("relays", scenarios::relays());
}

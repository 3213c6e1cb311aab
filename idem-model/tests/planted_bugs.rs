//! Bugs planted in the model, each of which the checker must catch with a counterexample: a
//! model that let them through would prove nothing. Run with `cargo test -p idem-model --test
//! planted_bugs -- --nocapture` to see the counterexamples.

use idem_model::properties::{EFFECT_ONCE, IN_ORDER, NO_EARLY_ACK, ONCE_DOWNSTREAM};
use idem_model::{Bugs, Config, IdemModel, Limits, OnSight, check, scenarios};

/// Checks `config` until `property` fails, prints the counterexample, and asserts there is one.
fn caught(bug: &str, config: Config, property: &'static str) {
    let limits = Limits {
        stop_at: Some(property),
        ..Limits::default()
    };
    let report = check(&IdemModel::new(config), limits);
    let path = report
        .discovery(property)
        .unwrap_or_else(|| panic!("{bug}: {property} holds: the checker missed the bug"));
    assert!(!report.holds(property));
    println!(
        "{bug}: {property} fails after {} states:\n{path}\n",
        report.states
    );
}

#[test]
fn a_two_phase_completion_without_fencing() {
    let config = scenarios::two_phase().bugs(Bugs {
        no_fencing: true,
        ..Bugs::default()
    });
    caught("no fencing", config, EFFECT_ONCE);
}

#[test]
fn an_ack_before_the_commit() {
    let config = scenarios::transactional().bugs(Bugs {
        ack_before_commit: true,
        ..Bugs::default()
    });
    caught("ack before commit", config, NO_EARLY_ACK);
}

#[test]
fn a_batch_run_again_without_rolling_back() {
    let config = scenarios::batch().bugs(Bugs {
        rerun_without_rollback: true,
        ..Bugs::default()
    });
    caught("rerun without rollback", config, EFFECT_ONCE);
}

#[test]
fn staged_ids_not_derived_from_the_message() {
    let config = scenarios::retention().outbox(1, 1).bugs(Bugs {
        fresh_staged_ids: true,
        ..Bugs::default()
    });
    caught("fresh staged ids", config, ONCE_DOWNSTREAM);
}

/// The relay as it was: a message held on sight, and the later messages of its run published
/// in the same round (`HoldMemory::sort` before it held the rest of the run; the test
/// `outbox_relay::a_run_behind_a_held_exchange_keeps_its_order` shows it on the real broker).
#[test]
fn a_run_published_past_its_message_held_on_sight() {
    let mut config = scenarios::relays();
    config.on_sight = OnSight::PublishesRestOfRun;
    caught("the rest of a run published", config, IN_ORDER);
}

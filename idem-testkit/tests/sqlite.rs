//! The kit's own tests on SQLite: each planted mistake reported with a seed that replays the
//! report, and correct handlers passing.
//!
//! Run: `cargo test -p idem-testkit --test sqlite` (no server needed).

mod common;

use common::*;
use idem_tests::on_each_backend;

on_each_backend!([sqlite]:
    an_external_call_in_a_transactional_handler_charges_twice,
    a_key_from_the_delivery_count_processes_a_redelivery_again,
    a_handler_committing_its_own_transaction_leaves_its_effects_twice,
    a_two_phase_call_without_its_downstream_key_notifies_twice,
    a_downstream_handler_keeping_no_record_ships_a_republished_event_twice,
    correct_handlers_have_one_effect_per_message_on_many_seeds,
);

//! The properties checked, by name, and which apply to a configuration.

use crate::checker::Property;
use crate::config::{IdemModel, Intake, Mode};
use crate::db::bit;
use crate::state::State;

/// Property 1: While a key's record lives (from its first claim until it passes its retention), at
/// most one effect of its message is committed: one transaction's writes (transactional, batch,
/// entity) or one completion (two-phase).
pub const EFFECT_ONCE: &str = "1. at most one committed effect per key while its record lives";

/// Property 2: A delivery is acknowledged only once its message's effect is committed, or after a
/// copy went to the dead-letter queue with its reason.
pub const NO_EARLY_ACK: &str =
    "2. no delivery acknowledged before its effect committed, unless dead-lettered";

/// Property 3: Within a run (a handler run's stagings), no message is published before every
/// earlier one was.
pub const IN_ORDER: &str = "3. staged messages published in order within their run";

/// Property 3: Each staged message (and each two-phase call, by its downstream key) is processed
/// once downstream, whose inbox keys on the message id, however often it was published or staged
/// again.
pub const ONCE_DOWNSTREAM: &str = "3. each staged message processed once downstream";

/// Property 3: Every run of the model that ends, ends with every committed staged message published
/// and marked sent.
pub const ALL_PUBLISHED: &str = "3. every staged message published (every run that ends)";

/// Property 4: A copy of a message processed before, taken as new because its record passed its
/// retention, is counted as a late duplicate: by the expired record it finds, or by the
/// digest of deleted keys once the deletion has reached the claiming process.
pub const LATE_COUNTED: &str =
    "4. a late duplicate is counted (expired record, or its deletion in the process's digest)";

/// Property 4, strictly: every copy processed again is counted as late, whenever it comes. idem
/// does not meet it: a copy claimed after the cleaner deleted its record and before the deletion
/// reached the claiming process's digest (during the cleaner's run, before the process's next read
/// of the digests, or after the cleaner's process crashed before writing it) is not counted.
pub const LATE_ALWAYS_COUNTED: &str = "4'. every late duplicate is counted";

/// Every run of the model that ends, ends with every delivery settled: each message
/// acknowledged with its effect committed, or dead-lettered.
pub const SETTLED: &str = "every message ends processed or dead-lettered (every run that ends)";

/// The model is not vacuous: a message gets processed.
pub const PROCESSED: &str = "sometimes: a message is processed";
/// A duplicate gets acknowledged.
pub const DUPLICATE_ACKED: &str = "sometimes: a duplicate is acknowledged";
/// A late duplicate gets counted.
pub const LATE_SEEN: &str = "sometimes: a late duplicate is counted";
/// A lapsed lease is taken over.
pub const TAKEOVER: &str = "sometimes: a lapsed lease is taken over";
/// A worker whose claim was taken over is refused its completion.
pub const FENCED: &str = "sometimes: a stale holder's completion is refused";
/// A batch runs again under savepoints.
pub const RERUN: &str = "sometimes: a batch runs again under savepoints";
/// A staged message reaches the downstream consumer.
pub const DOWNSTREAM: &str = "sometimes: a staged message is processed downstream";
/// A run is held back.
pub const HELD: &str = "sometimes: a run is held back";
/// A message is dead-lettered.
pub const DEAD_LETTERED: &str = "sometimes: a message is dead-lettered";

/// The properties that apply to `model`'s configuration.
pub fn of(model: &IdemModel) -> Vec<Property<IdemModel>> {
    let config = &model.config;
    let faults = &config.faults;
    let mut properties = vec![
        Property::always(EFFECT_ONCE, |_, s: &State| {
            s.ghost.live_effects.iter().all(|n| *n <= 1)
        }),
        Property::always(NO_EARLY_ACK, |_, s: &State| !s.ghost.acked_too_early),
        Property::eventually(SETTLED, settled),
        Property::sometimes(PROCESSED, |_, s: &State| s.ghost.committed != 0),
    ];
    if config.staged > 0 || config.mode == Mode::TwoPhase {
        properties.push(Property::always(ONCE_DOWNSTREAM, |_, s: &State| {
            s.ghost.downstream.iter().flatten().all(|n| *n <= 1)
        }));
    }
    if config.staged > 0 && config.relays > 0 {
        properties.extend([
            Property::always(IN_ORDER, |_, s: &State| !s.ghost.out_of_order),
            Property::eventually(ALL_PUBLISHED, |_, s: &State| {
                s.db.outbox.iter().all(|row| row.sent)
            }),
            Property::sometimes(DOWNSTREAM, |_, s: &State| {
                !s.ghost.downstream_ids.is_empty()
            }),
        ]);
    }
    if config.mode != Mode::Entity && faults.expiries > 0 {
        properties.push(Property::always(LATE_COUNTED, |_, s: &State| {
            !s.ghost.late_missed
        }));
        properties.push(Property::sometimes(LATE_SEEN, |_, s: &State| {
            s.ghost.seen.late_counted
        }));
        if model.strict {
            properties.push(Property::always(LATE_ALWAYS_COUNTED, |_, s: &State| {
                !s.ghost.late_uncounted
            }));
        }
    }
    if faults.duplicates > 0 {
        properties.push(Property::sometimes(DUPLICATE_ACKED, |_, s: &State| {
            s.ghost.seen.duplicate_acked
        }));
    }
    if config.mode == Mode::TwoPhase && faults.crashes + faults.paused_holders > 0 {
        properties.push(Property::sometimes(TAKEOVER, |_, s: &State| {
            s.ghost.seen.takeover
        }));
    }
    if config.mode == Mode::TwoPhase && faults.paused_holders > 0 {
        properties.push(Property::sometimes(FENCED, |_, s: &State| {
            s.ghost.seen.fenced
        }));
    }
    let batches = config.workers.contains(&Some(Intake::Batch));
    if batches && faults.handler_failures > 0 {
        properties.push(Property::sometimes(RERUN, |_, s: &State| {
            s.ghost.seen.rerun
        }));
    }
    if config.missing_exchange {
        properties.push(Property::sometimes(HELD, |_, s: &State| s.ghost.seen.held));
    }
    properties
}

/// Every delivery settled, each message's effect committed or the message dead-lettered.
fn settled(model: &IdemModel, state: &State) -> bool {
    state.broker.ready.is_empty()
        && state.workers.iter().all(|worker| worker.is_free())
        && model
            .config
            .keys()
            .all(|key| (state.ghost.committed | state.broker.dead_lettered) & bit(key) != 0)
}

//! The configurations the tests check, each with its bounds.

use crate::config::{Config, Faults, Intake, Mode};

/// Transactional mode: two messages, two workers, one staged message per run and a relay; one
/// duplicate publish, one crash, one lost ack, one handler failure, one rollback by the
/// database.
pub fn transactional() -> Config {
    Config::new(Mode::Transactional, 2)
        .workers(&[Intake::PerMessage, Intake::PerMessage])
        .outbox(1, 1)
        .faults(Faults {
            crashes: 1,
            duplicates: 1,
            lost_acks: 1,
            handler_failures: 1,
            rollbacks: 1,
            ..Faults::default()
        })
}

/// Retention and late duplicates: two messages, two workers, the cleaner, one staged message
/// per run and a relay; one record expires, one duplicate publish and one lost ack bring
/// copies after it, one crash.
pub fn retention() -> Config {
    Config::new(Mode::Transactional, 2)
        .workers(&[Intake::PerMessage, Intake::PerMessage])
        .cleaner()
        .outbox(1, 1)
        .faults(Faults {
            crashes: 1,
            duplicates: 1,
            lost_acks: 1,
            expiries: 1,
            ..Faults::default()
        })
}

/// Two-phase mode: one message, two workers, at most two claims per key before it needs
/// intervention, the cleaner; two duplicate publishes, two crashes, two paused holders, one
/// handler failure, one lost ack, one expiry.
pub fn two_phase() -> Config {
    Config::new(Mode::TwoPhase, 1)
        .workers(&[Intake::PerMessage, Intake::PerMessage])
        .cleaner()
        .faults(Faults {
            crashes: 2,
            duplicates: 2,
            lost_acks: 1,
            paused_holders: 2,
            handler_failures: 1,
            expiries: 1,
            ..Faults::default()
        })
}

/// Batches: two messages, a batch worker beside a per-message worker, one staged message per
/// run and a relay; one duplicate publish, one handler failure, one rollback, one crash.
pub fn batch() -> Config {
    Config::new(Mode::Transactional, 2)
        .workers(&[Intake::Batch, Intake::PerMessage])
        .outbox(1, 1)
        .faults(Faults {
            crashes: 1,
            duplicates: 1,
            handler_failures: 1,
            rollbacks: 1,
            ..Faults::default()
        })
}

/// Entity mode: two messages, two workers, one staged message per run and a relay; one
/// duplicate publish, one crash, one lost ack, one handler failure, one rollback.
pub fn entity() -> Config {
    Config::new(Mode::Entity, 2)
        .workers(&[Intake::PerMessage, Intake::PerMessage])
        .outbox(1, 1)
        .faults(Faults {
            crashes: 1,
            duplicates: 1,
            lost_acks: 1,
            handler_failures: 1,
            rollbacks: 1,
            ..Faults::default()
        })
}

/// The outbox and its relays: two messages whose runs stage two messages each, the first to
/// an exchange missing at first; two relays sharing the table; two crashes.
pub fn relays() -> Config {
    let mut config = Config::new(Mode::Transactional, 2)
        .outbox(2, 2)
        .faults(Faults {
            crashes: 2,
            ..Faults::default()
        });
    config.missing_exchange = true;
    config
}

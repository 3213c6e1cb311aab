//! The schedule of a run: the deliveries, crashes, copies, lease expiries and relay steps it
//! takes, in order, drawn from a seed, so that the seed alone replays it.

use std::fmt;

use crate::rng::Rng;

/// Where a worker crashes while it delivers a message: the boundaries idem's protocol names.
/// A crash abandons the work in flight as a killed process does: the processing future is
/// dropped, so an open transaction rolls back, a two-phase claim stays in progress until its
/// lease runs out, and the broker never hears an acknowledgment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Boundary {
    /// Before the handler runs. A transactional claim (in the handler's transaction) has not
    /// committed, and rolls back; a two-phase claim has committed, and stays in progress until
    /// its lease runs out.
    BeforeHandler,
    /// After the handler returned, before the commit (transactional modes) or the completion
    /// (two-phase mode): what the handler did outside the transaction (an external call) stays
    /// done, the rest rolls back.
    AfterHandler,
    /// After the commit, before the acknowledgment: the acknowledgment is lost, and the
    /// message is delivered again.
    AfterCommit,
}

impl Boundary {
    /// Every boundary, in the order a delivery meets them.
    pub const ALL: [Boundary; 3] = [
        Boundary::BeforeHandler,
        Boundary::AfterHandler,
        Boundary::AfterCommit,
    ];

    /// The crash, in words, for a handler in two-phase mode or not.
    pub fn describe(self, two_phase: bool) -> &'static str {
        match (self, two_phase) {
            (Boundary::BeforeHandler, false) => "crash before the claim commits",
            (Boundary::BeforeHandler, true) => "crash after the claim, before the handler's call",
            (Boundary::AfterHandler, false) => "crash after the handler, before the commit",
            (Boundary::AfterHandler, true) => {
                "crash after the handler's call, before the completion"
            }
            (Boundary::AfterCommit, false) => "lose the acknowledgment after the commit",
            (Boundary::AfterCommit, true) => "lose the acknowledgment after the completion",
        }
    }
}

/// Where the outbox relay crashes while it publishes a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RelayCrash {
    /// After taking the batch, before the broker has any of it: nothing is published, and the
    /// batch is taken again later.
    BeforePublish,
    /// After the broker took the batch (confirmed or not), before it is marked sent: it is
    /// published again later, with the same message ids.
    AfterPublish,
}

/// One step of a [`Schedule`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Step {
    /// Deliver message `message` (again, if it was delivered before: a redelivery or a
    /// producer's retry).
    Deliver {
        /// The message's index, as the message generator was given it.
        message: usize,
    },
    /// Deliver message `message` and crash at `at`.
    Crash {
        /// The message's index.
        message: usize,
        /// Where the worker crashes.
        at: Boundary,
    },
    /// Deliver `copies` copies of message `message` at once, to workers of their own.
    Concurrent {
        /// The message's index.
        message: usize,
        /// How many copies.
        copies: usize,
    },
    /// Wait until the leases of the two-phase claims that crashed workers left have run out,
    /// so that the next delivery takes them over.
    ExpireLeases,
    /// Take the outbox's pending messages (a few), publish them to the kit's broker, and mark
    /// them sent, or crash.
    Relay {
        /// Where the relay crashes; `None` for a batch that is published and marked sent.
        crash: Option<RelayCrash>,
    },
    /// Deliver the next published message to the downstream handler, crashing at `crash`.
    DeliverDownstream {
        /// Where the downstream worker crashes; `None` for a delivery without a fault.
        crash: Option<Boundary>,
    },
}

/// What a schedule is drawn for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Shape {
    /// How many distinct messages.
    pub(crate) messages: usize,
    /// How many steps are drawn at random (the steps that cover every boundary come on top).
    pub(crate) steps: usize,
    /// Whether the handler runs in two-phase mode.
    pub(crate) two_phase: bool,
    /// With a downstream handler, whether it runs in two-phase mode.
    pub(crate) downstream: Option<bool>,
}

/// A run's steps, drawn from its seed: [`Schedule::draw`] with the same seed and the same
/// shape (the number of messages and steps, the handlers' modes, a downstream handler or
/// none) gives the same schedule.
///
/// After its steps every run drains: each message not yet acknowledged is delivered until it
/// is, the outbox is relayed until nothing is pending, and every published message is
/// delivered downstream until acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Schedule {
    /// The seed it was drawn from.
    pub seed: u64,
    /// How many distinct messages it delivers.
    pub messages: usize,
    /// Its steps, in order.
    pub steps: Vec<Step>,
    shape: Shape,
}

impl Schedule {
    /// The schedule of `seed` for `shape`: random steps, and one crash at each boundary (each
    /// on a message drawn from the seed), at places drawn from the seed. With a downstream
    /// handler, one relay crash of each kind and one downstream crash at each boundary come in
    /// the second half, in that order, when earlier steps have staged messages to relay.
    pub(crate) fn draw(seed: u64, shape: Shape) -> Self {
        let mut rng = Rng::new(seed);
        let mut steps: Vec<Step> = (0..shape.steps)
            .map(|_| random_step(&mut rng, &shape))
            .collect();
        for at in Boundary::ALL {
            let message = rng.below(shape.messages);
            let place = rng.below(steps.len() + 1);
            steps.insert(place, Step::Crash { message, at });
        }
        if shape.two_phase || shape.downstream == Some(true) {
            let place = rng.below(steps.len() + 1);
            steps.insert(place, Step::ExpireLeases);
        }
        if shape.downstream.is_some() {
            insert_in_second_half(&mut rng, &mut steps, downstream_coverage());
        }
        Self {
            seed,
            messages: shape.messages,
            steps,
            shape,
        }
    }

    /// Whether the handler runs in two-phase mode (the steps are described for it).
    pub fn two_phase(&self) -> bool {
        self.shape.two_phase
    }

    /// One step in words, for this schedule's handlers.
    pub fn describe(&self, step: &Step) -> String {
        let downstream_two_phase = self.shape.downstream == Some(true);
        match *step {
            Step::Deliver { message } => format!("deliver #{message}"),
            Step::Crash { message, at } => {
                format!("deliver #{message}, {}", at.describe(self.shape.two_phase))
            }
            Step::Concurrent { message, copies } => {
                format!("deliver {copies} copies of #{message} at once")
            }
            Step::ExpireLeases => "let the leases that crashed workers left run out".to_owned(),
            Step::Relay { crash: None } => "relay: take pending, publish, mark sent".to_owned(),
            Step::Relay {
                crash: Some(RelayCrash::BeforePublish),
            } => "relay: take pending, crash before publishing".to_owned(),
            Step::Relay {
                crash: Some(RelayCrash::AfterPublish),
            } => "relay: take pending, publish, crash before marking them sent".to_owned(),
            Step::DeliverDownstream { crash: None } => {
                "deliver the next published message downstream".to_owned()
            }
            Step::DeliverDownstream { crash: Some(at) } => format!(
                "deliver the next published message downstream, {}",
                at.describe(downstream_two_phase)
            ),
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "schedule of seed {}: {} messages (#0 to #{}), {} steps",
            self.seed,
            self.messages,
            self.messages.saturating_sub(1),
            self.steps.len()
        )?;
        for (number, step) in self.steps.iter().enumerate() {
            writeln!(f, "  {:>3}. {}", number + 1, self.describe(step))?;
        }
        let relayed = if self.shape.downstream.is_some() {
            ", relay everything pending, deliver everything published downstream"
        } else {
            ""
        };
        write!(
            f,
            "  then: deliver each message not acknowledged until it is{relayed}"
        )
    }
}

fn random_step(rng: &mut Rng, shape: &Shape) -> Step {
    let leases = shape.two_phase || shape.downstream == Some(true);
    let downstream = shape.downstream.is_some();
    // deliver, crash, concurrent copies, lease expiry, relay, downstream delivery
    let weights = [
        3,
        4,
        2,
        u32::from(leases),
        2 * u32::from(downstream),
        3 * u32::from(downstream),
    ];
    let message = rng.below(shape.messages);
    match rng.weighted(&weights) {
        0 => Step::Deliver { message },
        1 => Step::Crash {
            message,
            at: Boundary::ALL[rng.below(Boundary::ALL.len())],
        },
        2 => Step::Concurrent {
            message,
            copies: 2 + rng.below(2),
        },
        3 => Step::ExpireLeases,
        4 => Step::Relay {
            crash: match rng.below(4) {
                0 | 1 => None,
                2 => Some(RelayCrash::BeforePublish),
                _ => Some(RelayCrash::AfterPublish),
            },
        },
        _ => Step::DeliverDownstream {
            crash: match rng.below(2 + Boundary::ALL.len()) {
                0 | 1 => None,
                n => Some(Boundary::ALL[n - 2]),
            },
        },
    }
}

/// The downstream steps every schedule with a downstream handler takes, in order: each relay
/// crash, a clean relay, and a downstream crash at each boundary.
fn downstream_coverage() -> Vec<Step> {
    let mut steps = vec![
        Step::Relay {
            crash: Some(RelayCrash::BeforePublish),
        },
        Step::Relay {
            crash: Some(RelayCrash::AfterPublish),
        },
        Step::Relay { crash: None },
    ];
    steps.extend(Boundary::ALL.map(|at| Step::DeliverDownstream { crash: Some(at) }));
    steps
}

/// Inserts `required` into the second half of `steps`, keeping their order, at places drawn
/// from `rng`.
fn insert_in_second_half(rng: &mut Rng, steps: &mut Vec<Step>, required: Vec<Step>) {
    let half = steps.len() / 2;
    let mut places: Vec<usize> = (0..required.len())
        .map(|_| half + rng.below(steps.len() - half + 1))
        .collect();
    places.sort_unstable();
    // From the last: each insertion leaves the places before it where they were.
    for (place, step) in places.into_iter().zip(required).rev() {
        steps.insert(place, step);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(two_phase: bool, downstream: Option<bool>) -> Shape {
        Shape {
            messages: 6,
            steps: 18,
            two_phase,
            downstream,
        }
    }

    #[test]
    fn a_seed_replays_its_schedule_and_another_seed_draws_another() {
        let shape = shape(false, Some(true));
        assert_eq!(Schedule::draw(11, shape), Schedule::draw(11, shape));
        assert_ne!(
            Schedule::draw(11, shape).steps,
            Schedule::draw(12, shape).steps
        );
    }

    #[test]
    fn every_schedule_crashes_at_every_boundary() {
        for seed in 0..50 {
            let schedule = Schedule::draw(seed, shape(false, Some(false)));
            for at in Boundary::ALL {
                let crashes = |step: &Step| matches!(step, Step::Crash { at: a, .. } if *a == at);
                let downstream =
                    |step: &Step| *step == Step::DeliverDownstream { crash: Some(at) };
                assert!(schedule.steps.iter().any(crashes), "seed {seed}: {at:?}");
                assert!(schedule.steps.iter().any(downstream), "seed {seed}: {at:?}");
            }
            for crash in [RelayCrash::BeforePublish, RelayCrash::AfterPublish] {
                let relay = Step::Relay { crash: Some(crash) };
                assert!(schedule.steps.contains(&relay), "seed {seed}: {crash:?}");
            }
            assert!(schedule.steps.iter().all(|step| match step {
                Step::Deliver { message }
                | Step::Crash { message, .. }
                | Step::Concurrent { message, .. } => *message < 6,
                _ => true,
            }));
        }
    }

    #[test]
    fn lease_and_relay_steps_come_only_where_they_mean_something() {
        for seed in 0..50 {
            let schedule = Schedule::draw(seed, shape(false, None));
            assert!(schedule.steps.iter().all(|step| matches!(
                step,
                Step::Deliver { .. } | Step::Crash { .. } | Step::Concurrent { .. }
            )));
            let two_phase = Schedule::draw(seed, shape(true, None));
            assert!(two_phase.steps.contains(&Step::ExpireLeases));
        }
    }

    #[test]
    fn the_schedule_reads_as_steps_in_words() {
        let schedule = Schedule {
            seed: 5,
            messages: 2,
            steps: vec![
                Step::Crash {
                    message: 1,
                    at: Boundary::AfterHandler,
                },
                Step::Relay {
                    crash: Some(RelayCrash::AfterPublish),
                },
            ],
            shape: shape(false, Some(true)),
        };
        assert_eq!(
            schedule.to_string(),
            "schedule of seed 5: 2 messages (#0 to #1), 2 steps\n\
             \x20   1. deliver #1, crash after the handler, before the commit\n\
             \x20   2. relay: take pending, publish, crash before marking them sent\n\
             \x20 then: deliver each message not acknowledged until it is, relay everything \
             pending, deliver everything published downstream"
        );
    }
}

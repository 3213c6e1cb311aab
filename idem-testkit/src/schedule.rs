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

impl Step {
    /// The generated message the step delivers, if it delivers one.
    pub fn message(&self) -> Option<usize> {
        match *self {
            Step::Deliver { message }
            | Step::Crash { message, .. }
            | Step::Concurrent { message, .. } => Some(message),
            Step::ExpireLeases | Step::Relay { .. } | Step::DeliverDownstream { .. } => None,
        }
    }
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

/// A run's steps, drawn from its seed: the same seed and the same shape (the number of
/// messages and steps, the handlers' modes, a downstream handler or none) give the same
/// schedule.
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
    /// The schedule of `seed` for `shape`: random steps, and a crash at each boundary on the
    /// first delivery of a message (each on a message of its own while there are enough,
    /// drawn from the seed; a two-phase claim's crash followed by the lease's expiry), at
    /// places drawn from the seed. With a downstream handler, the schedule opens with the last
    /// message, kept for it: its first delivery, a relay crash of each kind, a clean relay,
    /// and a downstream crash at each boundary (with the lease's expiry after each crash that
    /// leaves a two-phase claim), so that the relay's crashes meet what that delivery staged
    /// and the downstream crashes meet a message not yet processed there.
    pub(crate) fn draw(seed: u64, shape: Shape) -> Self {
        let mut rng = Rng::new(seed);
        let reserved = shape.downstream.is_some() && shape.messages > 1;
        let drawn = shape.messages - usize::from(reserved);
        let mut steps: Vec<Step> = (0..shape.steps)
            .map(|_| random_step(&mut rng, &shape, drawn))
            .collect();
        let mut fresh: Vec<usize> = (0..drawn).collect();
        let mut units: Vec<(usize, Vec<Step>)> = Boundary::ALL
            .map(|at| {
                let message = match fresh.len() {
                    0 => rng.below(drawn),
                    left => fresh.swap_remove(rng.below(left)),
                };
                let mut unit = vec![Step::Crash { message, at }];
                if shape.two_phase && at != Boundary::AfterCommit {
                    unit.push(Step::ExpireLeases);
                }
                let first = first_delivery(&steps, message).unwrap_or(steps.len());
                (rng.below(first + 1), unit)
            })
            .into();
        // From the last place: each unit goes in whole, and the places before it stay.
        units.sort_by_key(|(place, _)| std::cmp::Reverse(*place));
        for (place, unit) in units {
            steps.splice(place..place, unit);
        }
        if let Some(downstream_two_phase) = shape.downstream {
            let block = relay_block(shape.messages - 1, downstream_two_phase);
            steps.splice(0..0, block);
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

/// Where `steps` first deliver `message`, if they do.
fn first_delivery(steps: &[Step], message: usize) -> Option<usize> {
    steps
        .iter()
        .position(|step| step.message() == Some(message))
}

/// A step drawn at random, on one of the messages `0..drawn`.
fn random_step(rng: &mut Rng, shape: &Shape, drawn: usize) -> Step {
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
    let message = rng.below(drawn);
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

/// The block of relay and downstream steps every schedule with a downstream handler opens with:
/// the first delivery of `message` (which stages what it stages), each relay crash, a clean
/// relay, and a downstream crash at each boundary, the leases left by two-phase crashes run
/// out before the next delivery.
fn relay_block(message: usize, downstream_two_phase: bool) -> Vec<Step> {
    let mut steps = vec![
        Step::Deliver { message },
        Step::Relay {
            crash: Some(RelayCrash::BeforePublish),
        },
        Step::Relay {
            crash: Some(RelayCrash::AfterPublish),
        },
        Step::Relay { crash: None },
    ];
    for at in [
        Boundary::AfterHandler,
        Boundary::BeforeHandler,
        Boundary::AfterCommit,
    ] {
        steps.push(Step::DeliverDownstream { crash: Some(at) });
        if downstream_two_phase && at != Boundary::AfterCommit {
            steps.push(Step::ExpireLeases);
        }
    }
    steps
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
    fn every_schedule_crashes_at_every_boundary_on_a_first_delivery() {
        for seed in 0..50 {
            let schedule = Schedule::draw(seed, shape(false, Some(false)));
            let steps = &schedule.steps;
            for at in Boundary::ALL {
                let on_first_delivery = (0..steps.len()).any(|index| match steps[index] {
                    Step::Crash { message, at: a } => {
                        a == at && first_delivery(steps, message) == Some(index)
                    }
                    _ => false,
                });
                let downstream = Step::DeliverDownstream { crash: Some(at) };
                assert!(on_first_delivery, "seed {seed}, {at:?}: {schedule}");
                assert!(steps.contains(&downstream), "seed {seed}: {at:?}");
            }
            for crash in [RelayCrash::BeforePublish, RelayCrash::AfterPublish] {
                let relay = Step::Relay { crash: Some(crash) };
                assert!(steps.contains(&relay), "seed {seed}: {crash:?}");
            }
            assert!(
                steps
                    .iter()
                    .all(|step| step.message().is_none_or(|m| m < 6))
            );
        }
    }

    #[test]
    fn with_a_downstream_handler_the_last_message_is_first_delivered_before_the_relay_crashes() {
        for seed in 0..50 {
            let schedule = Schedule::draw(seed, shape(true, Some(true)));
            let last = |step: &Step| step.message() == Some(5);
            let deliveries: Vec<usize> = (0..schedule.steps.len())
                .filter(|&index| last(&schedule.steps[index]))
                .collect();
            assert_eq!(deliveries.len(), 1, "seed {seed}: {schedule}");
            let block = &schedule.steps[deliveries[0]..];
            assert_eq!(
                block[1..4],
                [
                    Step::Relay {
                        crash: Some(RelayCrash::BeforePublish)
                    },
                    Step::Relay {
                        crash: Some(RelayCrash::AfterPublish)
                    },
                    Step::Relay { crash: None },
                ]
            );
            assert_eq!(block[5], Step::ExpireLeases, "seed {seed}");
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
            for at in [Boundary::BeforeHandler, Boundary::AfterHandler] {
                let expired = two_phase.steps.windows(2).any(|pair| {
                    matches!(pair[0], Step::Crash { at: a, .. } if a == at)
                        && pair[1] == Step::ExpireLeases
                });
                assert!(expired, "seed {seed}, {at:?}: {two_phase}");
            }
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

//! What a run found: the messages whose effects were not counted once, with the seed and the
//! schedule that replay it.

use std::fmt;

use crate::rng::SEED_VARIABLE;
use crate::schedule::Schedule;

/// A message whose effects were not counted exactly once.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Finding {
    /// The consumer of the handler that processed it.
    pub consumer: String,
    /// Which message: `#3` for the fourth generated message, the message id for a message the
    /// relay published downstream.
    pub message: String,
    /// The key the handler gave the message on its first delivery (or why it gave none).
    pub key: String,
    /// The effects counted.
    pub effects: u64,
    /// The effects expected: one.
    pub expected: u64,
    /// How the message ended when it did not end acknowledged: dead-lettered (with the
    /// reason), or never acknowledged by the end of the drain (with the last error).
    pub ended: Option<String>,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} (key {}): {} effects, expected {}",
            self.consumer, self.message, self.key, self.effects, self.expected
        )?;
        if let Some(ended) = &self.ended {
            write!(f, "; {ended}")?;
        }
        Ok(())
    }
}

/// What a run found. Replaying its seed (the same messages, handlers and settings) draws the
/// same schedule, and a handler whose effects depend only on what it is given gives the same
/// findings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Report {
    /// The seed: `FaultKit::seed` (or `IDEM_TESTKIT_SEED`) replays the run.
    pub seed: u64,
    /// The steps the run took.
    pub schedule: Schedule,
    /// The messages whose effects were not counted once; empty when every message had
    /// exactly one.
    pub findings: Vec<Finding>,
    /// What each step gave (one line a step, then the drain's), for reading a failure. Waits
    /// measured by the clock (a claim whose lease had not yet run out) may make a replay's
    /// lines differ from the first run's.
    pub trace: Vec<String>,
}

impl Report {
    /// Whether every message's effects were counted exactly once.
    pub fn is_effectively_once(&self) -> bool {
        self.findings.is_empty()
    }

    /// Panics with the report unless every message's effects were counted exactly once.
    ///
    /// # Panics
    ///
    /// When a message had no effect or more than one: the message shows the findings, the
    /// seed that replays the run and its schedule.
    #[track_caller]
    pub fn assert_effectively_once(&self) {
        assert!(self.is_effectively_once(), "{self}");
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.findings.is_empty() {
            writeln!(
                f,
                "every message had exactly one effect (seed {})",
                self.seed
            )?;
        } else {
            writeln!(
                f,
                "{} message(s) did not have exactly one effect (seed {}):",
                self.findings.len(),
                self.seed
            )?;
            for finding in &self.findings {
                writeln!(f, "  {finding}")?;
            }
        }
        writeln!(
            f,
            "replay: FaultKit::seed({}), or {SEED_VARIABLE}={} for a kit given no seed",
            self.seed, self.seed
        )?;
        writeln!(f, "{}", self.schedule)?;
        writeln!(f, "what happened:")?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

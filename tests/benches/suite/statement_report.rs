//! The statements each case ran per message, and how idem's modes compare with the
//! hand-written ones they are measured against.

use idem_tests::bench::figures::median;
use serde_json::json;

use crate::Suite;
use crate::args::{BackendArg, Mode};
use crate::case::Case;
use crate::report::{Concurrency, round3};

/// Statements (and round trips, where counted) per message, medians over counted rounds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PerMessage {
    pub(crate) statements: f64,
    pub(crate) round_trips: Option<f64>,
}

impl Case {
    /// Statements per message of the counted rounds, if any round was counted.
    pub(crate) fn statements_per_message(&self, suite: &Suite) -> Option<PerMessage> {
        if self.statements.is_empty() {
            return None;
        }
        let n = suite.messages(self.mode) as f64;
        let statements = self.statements.iter().map(|c| c.statements as f64 / n);
        let round_trips: Option<Vec<f64>> = (self.statements.iter())
            .map(|c| c.round_trips.map(|r| r as f64 / n))
            .collect();
        Some(PerMessage {
            statements: median(statements.collect()),
            round_trips: round_trips.map(median),
        })
    }
}

/// An idem mode and the hand-written mode its statements are shown beside.
struct StatementPair {
    idem: (Mode, Concurrency),
    hand: (Mode, Concurrency),
}

/// The pairs of the batch-parity issue.
const STATEMENT_PAIRS: [StatementPair; 4] = [
    StatementPair {
        idem: (Mode::IdemBatch, Concurrency::Any),
        hand: (Mode::HandBatch, Concurrency::Any),
    },
    StatementPair {
        idem: (Mode::IdemBatchSlice, Concurrency::Any),
        hand: (Mode::HandBatchMultirow, Concurrency::Any),
    },
    StatementPair {
        idem: (Mode::IdemPerMessage, Concurrency::One),
        hand: (Mode::HandPerMessage, Concurrency::One),
    },
    StatementPair {
        idem: (Mode::IdemOutbox, Concurrency::Any),
        hand: (Mode::HandOutbox, Concurrency::Any),
    },
];

/// Prints, per backend and prefetch, idem's statements per message over the rounds beside the
/// hand-written mode's, and the difference per round. These include what idem runs beside its
/// messages (its cleaner's first run, its telemetry) and depend on how each consumer cut its
/// batches (idem runs two at once, the hand-written code one): the verdict on statements is the
/// probe's (`statement_probe.rs`), which runs the same work through both. `sources` says where
/// each backend's counts come from.
pub(crate) fn print_statements(
    suite: &Suite,
    groups: &[Vec<Case>],
    sources: &[(BackendArg, &str)],
) {
    if !suite.args.json {
        println!(
            "\nStatements per message over the rounds (idem beside hand-written; medians of \
             rounds; idem's cleaner and telemetry and each side's batch cut included):"
        );
        for (backend, source) in sources {
            println!("  {}: {source}", backend.name());
        }
    }
    for cases in groups {
        let Some(first) = cases.first() else { continue };
        let (backend, prefetch) = (first.backend, first.prefetch);
        for pair in &STATEMENT_PAIRS {
            let find = |(mode, concurrency): (Mode, Concurrency)| {
                cases.iter().find(|case| {
                    case.mode == mode
                        && case.failure.is_none()
                        && concurrency.matches(case.concurrency)
                })
            };
            let per_message = |side| find(side)?.statements_per_message(suite);
            let (Some(idem), Some(hand)) = (per_message(pair.idem), per_message(pair.hand)) else {
                continue;
            };
            let messages = suite.messages(pair.idem.0) as f64;
            let extra_per_round = ((idem.statements - hand.statements) * messages).round();
            let name = format!(
                "{}{} / {}{}",
                pair.idem.0.name(),
                pair.idem.1.suffix(),
                pair.hand.0.name(),
                pair.hand.1.suffix()
            );
            if suite.args.json {
                let line = json!({
                    "bench": "suite-statements",
                    "backend": backend.name(),
                    "prefetch": prefetch,
                    "pair": name,
                    "idem_statements_per_msg": round3(idem.statements),
                    "hand_statements_per_msg": round3(hand.statements),
                    "idem_round_trips_per_msg": idem.round_trips.map(round3),
                    "hand_round_trips_per_msg": hand.round_trips.map(round3),
                    "extra_statements_per_round": extra_per_round,
                });
                println!("{line}");
            } else {
                let trips =
                    |p: PerMessage| p.round_trips.map_or("-".to_owned(), |r| format!("{r:.2}"));
                println!(
                    "{:<9} {:>4}  {:<48} {:>6.2} vs {:>6.2} (round trips {} vs {}; {:+} a round)",
                    backend.name(),
                    prefetch,
                    name,
                    idem.statements,
                    hand.statements,
                    trips(idem),
                    trips(hand),
                    extra_per_round,
                );
            }
        }
    }
}

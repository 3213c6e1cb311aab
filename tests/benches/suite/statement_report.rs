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

/// An idem mode whose statements per message may be at most the hand-written mode's, plus
/// `per_batch` for each batch.
struct StatementTarget {
    idem: (Mode, Concurrency),
    hand: (Mode, Concurrency),
    per_batch: f64,
}

/// The statement targets of the batch-parity issue.
const STATEMENT_TARGETS: [StatementTarget; 4] = [
    StatementTarget {
        idem: (Mode::IdemBatch, Concurrency::Any),
        hand: (Mode::HandBatch, Concurrency::Any),
        per_batch: 0.0,
    },
    StatementTarget {
        idem: (Mode::IdemBatchSlice, Concurrency::Any),
        hand: (Mode::HandBatchMultirow, Concurrency::Any),
        per_batch: 1.0,
    },
    StatementTarget {
        idem: (Mode::IdemPerMessage, Concurrency::One),
        hand: (Mode::HandPerMessage, Concurrency::One),
        per_batch: 0.0,
    },
    StatementTarget {
        idem: (Mode::IdemOutbox, Concurrency::Any),
        hand: (Mode::HandOutbox, Concurrency::Any),
        per_batch: 0.0,
    },
];

/// Prints, per backend and prefetch, each statement target: idem's statements per message
/// beside the hand-written mode's, and whether idem sends no more. `sources` says where each
/// backend's counts come from.
pub(crate) fn print_statements(
    suite: &Suite,
    groups: &[Vec<Case>],
    sources: &[(BackendArg, &str)],
) {
    if !suite.args.json {
        println!("\nStatements per message (idem beside hand-written; medians of rounds):");
        for (backend, source) in sources {
            println!("  {}: {source}", backend.name());
        }
    }
    for cases in groups {
        let Some(first) = cases.first() else { continue };
        let (backend, prefetch) = (first.backend, first.prefetch);
        let batch = suite.batch_size(prefetch) as f64;
        for target in &STATEMENT_TARGETS {
            let find = |(mode, concurrency): (Mode, Concurrency)| {
                cases.iter().find(|case| {
                    case.mode == mode
                        && case.failure.is_none()
                        && concurrency.matches(case.concurrency)
                })
            };
            let per_message = |side| find(side)?.statements_per_message(suite);
            let (Some(idem), Some(hand)) = (per_message(target.idem), per_message(target.hand))
            else {
                continue;
            };
            let limit = hand.statements + target.per_batch / batch;
            // The same difference per round: a constant (the consumer's start) shows as such.
            let messages = suite.messages(target.idem.0) as f64;
            let extra_per_round = ((idem.statements - hand.statements) * messages).round();
            // Counts are exact; a thousandth absorbs the rounding of a division.
            let met = idem.statements <= limit + 1e-3;
            let name = format!(
                "{}{} / {}{}",
                target.idem.0.name(),
                target.idem.1.suffix(),
                target.hand.0.name(),
                target.hand.1.suffix()
            );
            if suite.args.json {
                let line = json!({
                    "bench": "suite-statements",
                    "backend": backend.name(),
                    "prefetch": prefetch,
                    "target": name,
                    "idem_statements_per_msg": round3(idem.statements),
                    "hand_statements_per_msg": round3(hand.statements),
                    "idem_round_trips_per_msg": idem.round_trips.map(round3),
                    "hand_round_trips_per_msg": hand.round_trips.map(round3),
                    "max_statements_per_msg": round3(limit),
                    "extra_statements_per_round": extra_per_round,
                    "met": met,
                });
                println!("{line}");
            } else {
                let trips =
                    |p: PerMessage| p.round_trips.map_or("-".to_owned(), |r| format!("{r:.2}"));
                println!(
                    "{:<9} {:>4}  {:<48} {:>6.2} vs {:>6.2} (round trips {} vs {}; {:+} a round)  <= {:.2}  {}",
                    backend.name(),
                    prefetch,
                    name,
                    idem.statements,
                    hand.statements,
                    trips(idem),
                    trips(hand),
                    extra_per_round,
                    limit,
                    if met { "met" } else { "NOT MET" }
                );
            }
        }
    }
}

//! What the suite prints: a row or a JSON object per case, then the targets.

use idem_tests::bench::figures::median;
use serde_json::json;

use crate::args::{BackendArg, Mode};
use crate::case::{Case, Round};
use crate::outbox::RELAY_BATCH;
use crate::{DEFAULT_CONCURRENCY, Suite};

/// The figures of a case, as printed.
pub(crate) struct Summary {
    pub(crate) msgs_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
}

impl Case {
    pub(crate) fn record(&mut self, round: Round) {
        self.rates.push(round.rate);
        self.latency.merge(&round.latency);
        self.peak_rss_mb = self.peak_rss_mb.max(round.peak_rss_mb);
        self.requeued += round.requeued;
        self.broker_errors += round.broker_errors;
        if let Some(deleted) = round.deleted {
            self.deleted.push(deleted);
        }
        self.statements.push(round.statements);
    }

    pub(crate) fn summary(&self) -> Summary {
        Summary {
            msgs_per_s: median(self.rates.clone()),
            p50_ms: self.latency.quantile_ms(0.5),
            p99_ms: self.latency.quantile_ms(0.99),
        }
    }

    pub(crate) fn json(&self, suite: &Suite) -> serde_json::Value {
        let mut line = json!({
            "bench": "suite",
            "backend": self.backend.name(),
            "prefetch": self.prefetch,
            "concurrency": self.concurrency,
            "mode": self.mode.name(),
        });
        let object = line.as_object_mut().expect("an object");
        let summary = self.summary();
        let fields = json!({
            "msgs_per_s": round1(summary.msgs_per_s),
            "p50_ms": round3(summary.p50_ms),
            "p99_ms": round3(summary.p99_ms),
            "peak_rss_mb": round1(self.peak_rss_mb),
            "messages": suite.messages(self.mode),
            "rounds": self.rates.len(),
            "duplicates": 0.1,
            "requeued": self.requeued,
            "broker_errors": self.broker_errors,
        });
        object.extend(fields.as_object().expect("an object").clone());
        if self.mode.batch() {
            object.insert("batch_size".into(), suite.batch_size(self.prefetch).into());
            object.insert("max_wait_ms".into(), suite.args.max_wait_ms.into());
        }
        if self.mode == Mode::IdemBatchDuringCleanup {
            let deleted: Vec<f64> = self.deleted.iter().map(|&d| d as f64).collect();
            object.insert("cleanup_deleted_per_round".into(), median(deleted).into());
        }
        if self.mode.outbox() {
            object.insert("end_to_end".into(), true.into());
            object.insert("relay_batch_size".into(), RELAY_BATCH.into());
        }
        if let Some(per_message) = self.statements_per_message(suite) {
            object.insert(
                "statements_per_msg".into(),
                round3(per_message.statements).into(),
            );
            let round_trips = per_message.round_trips.map(round3);
            object.insert("round_trips_per_msg".into(), round_trips.into());
        }
        if let Some(failure) = &self.failure {
            object.insert("failed".into(), failure.as_str().into());
        }
        line
    }

    pub(crate) fn row(&self, suite: &Suite) -> String {
        let head = format!(
            "{:<9} {:>8}  {:<26} {:>4}",
            self.backend.name(),
            self.prefetch,
            self.mode.name(),
            self.concurrency
        );
        let s = self.summary();
        let mut notes = Vec::new();
        if self.mode.batch() {
            notes.push(format!(
                "batch {} / {} ms",
                suite.batch_size(self.prefetch),
                suite.args.max_wait_ms
            ));
        }
        if self.mode == Mode::IdemBatchDuringCleanup {
            let deleted: Vec<f64> = self.deleted.iter().map(|&d| d as f64).collect();
            notes.push(format!("cleaner deleted {:.0}/round", median(deleted)));
        }
        if let Some(per_message) = self.statements_per_message(suite) {
            notes.push(format!("{:.2} statements/msg", per_message.statements));
        }
        if self.mode.outbox() {
            notes.push(format!(
                "end to end: events relayed, batches of {RELAY_BATCH}; latency to the ack"
            ));
        }
        if self.requeued > 0 {
            notes.push(format!("{} requeued", self.requeued));
        }
        if self.broker_errors > 0 {
            notes.push(format!(
                "{} channel/connection closed by the broker with an error",
                self.broker_errors
            ));
        }
        if self.failure.is_some() {
            notes.push(format!(
                "FAILED after {} counted rounds (see the end)",
                self.rates.len()
            ));
        }
        format!(
            "{head} {:>10.0} {:>8.2} {:>8.2} {:>7.1}  {}",
            s.msgs_per_s,
            s.p50_ms,
            s.p99_ms,
            self.peak_rss_mb,
            notes.join(", ")
        )
    }
}

pub(crate) fn round1(value: f64) -> f64 {
    (value * 10.0).round() / 10.0
}

pub(crate) fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// A target: `numerator / denominator >= min`, per round, median; the minimum may depend on
/// the backend.
pub(crate) struct Target {
    pub(crate) numerator: (Mode, Concurrency),
    pub(crate) denominator: (Mode, Concurrency),
    /// The minimum on PostgreSQL, MySQL/MariaDB and SQLite.
    pub(crate) min: [f64; 3],
}

impl Target {
    /// The minimum on `backend`.
    pub(crate) fn min(&self, backend: BackendArg) -> f64 {
        match backend {
            BackendArg::Postgres => self.min[0],
            BackendArg::Mysql => self.min[1],
            BackendArg::Sqlite => self.min[2],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Concurrency {
    One,
    Default,
    /// Whatever the mode runs at (the batch modes, `raw`, the outbox modes).
    Any,
}

impl Concurrency {
    pub(crate) fn matches(self, concurrency: usize) -> bool {
        match self {
            Concurrency::One => concurrency == 1,
            Concurrency::Default => concurrency == DEFAULT_CONCURRENCY,
            Concurrency::Any => true,
        }
    }

    pub(crate) fn suffix(self) -> &'static str {
        match self {
            Concurrency::One => " c=1",
            Concurrency::Default => " c=16",
            Concurrency::Any => "",
        }
    }
}

/// The targets of the batch-parity issue (the outbox's from its own issue), per backend.
pub(crate) const TARGETS: [Target; 6] = [
    // The default, which trusts its handlers as the hand-written batch trusts its own code.
    Target {
        numerator: (Mode::IdemBatch, Concurrency::Any),
        denominator: (Mode::HandBatch, Concurrency::Any),
        min: [0.9; 3],
    },
    Target {
        numerator: (Mode::IdemBatchSlice, Concurrency::Any),
        denominator: (Mode::HandBatchMultirow, Concurrency::Any),
        min: [0.9; 3],
    },
    Target {
        numerator: (Mode::IdemBatchDuringCleanup, Concurrency::Any),
        denominator: (Mode::IdemBatch, Concurrency::Any),
        min: [0.8; 3],
    },
    Target {
        numerator: (Mode::IdemPerMessage, Concurrency::One),
        denominator: (Mode::HandPerMessage, Concurrency::One),
        min: [0.95; 3],
    },
    Target {
        numerator: (Mode::IdemPerMessage, Concurrency::Default),
        denominator: (Mode::HandPerMessage, Concurrency::Default),
        min: [0.95; 3],
    },
    // Consume, stage and relay, end to end.
    Target {
        numerator: (Mode::IdemOutbox, Concurrency::Any),
        denominator: (Mode::HandOutbox, Concurrency::Any),
        min: [0.8; 3],
    },
];

impl Target {
    pub(crate) fn name(&self) -> String {
        format!(
            "{}{} / {}{}",
            self.numerator.0.name(),
            self.numerator.1.suffix(),
            self.denominator.0.name(),
            self.denominator.1.suffix()
        )
    }

    /// The median over rounds of the per-round ratio, among `cases` of one backend and
    /// prefetch; `None` if either side did not run.
    pub(crate) fn ratio(&self, cases: &[Case]) -> Option<f64> {
        let find = |(mode, concurrency): (Mode, Concurrency)| {
            cases.iter().find(|case| {
                case.mode == mode
                    && case.failure.is_none()
                    && concurrency.matches(case.concurrency)
                    && !case.rates.is_empty()
            })
        };
        let (top, bottom) = (find(self.numerator)?, find(self.denominator)?);
        Some(median(
            top.rates
                .iter()
                .zip(&bottom.rates)
                .map(|(a, b)| a / b)
                .collect(),
        ))
    }
}

pub(crate) fn header() -> String {
    format!(
        "{:<9} {:>8}  {:<26} {:>4} {:>10} {:>8} {:>8} {:>7}  notes",
        "backend", "prefetch", "mode", "conc", "msg/s", "p50 ms", "p99 ms", "RSS MB"
    )
}

pub(crate) fn print_targets(suite: &Suite, groups: &[Vec<Case>]) {
    if !suite.args.json {
        println!("\nTargets (median of per-round ratios):");
    }
    for cases in groups {
        let Some(first) = cases.first() else { continue };
        let (backend, prefetch) = (first.backend, first.prefetch);
        for target in &TARGETS {
            let min = target.min(backend);
            print_target(
                suite,
                backend,
                prefetch,
                &target.name(),
                target.ratio(cases),
                min,
            );
        }
    }
    // idem's batch gains from a larger window, as every hand-written mode does.
    let batch_rate = |backend: BackendArg, prefetch: u16| {
        groups
            .iter()
            .flatten()
            .find(|case| {
                case.backend == backend
                    && case.prefetch == prefetch
                    && case.mode == Mode::IdemBatch
                    && case.failure.is_none()
                    && !case.rates.is_empty()
            })
            .map(|case| median(case.rates.clone()))
    };
    for backend in [BackendArg::Postgres, BackendArg::Mysql, BackendArg::Sqlite] {
        if let (Some(at_100), Some(at_500)) = (batch_rate(backend, 100), batch_rate(backend, 500)) {
            let name = "idem-batch p500 / idem-batch p100";
            print_target(suite, backend, 500, name, Some(at_500 / at_100), 1.0);
        }
    }
}

/// One target's line, or JSON object.
fn print_target(
    suite: &Suite,
    backend: BackendArg,
    prefetch: u16,
    name: &str,
    ratio: Option<f64>,
    min: f64,
) {
    let verdict = match ratio {
        None => "not measured",
        Some(r) if r >= min => "met",
        Some(_) => "NOT MET",
    };
    if suite.args.json {
        println!(
            "{}",
            json!({
                "bench": "suite-target",
                "backend": backend.name(),
                "prefetch": prefetch,
                "target": name,
                "ratio": ratio.map(round3),
                "min": min,
                "met": ratio.map(|r| r >= min),
            })
        );
    } else {
        let shown = ratio.map_or("-".to_owned(), |r| format!("{r:.2}"));
        println!(
            "{:<9} {:>4}  {:<48} {:>7}  >= {:<4}  {verdict}",
            backend.name(),
            prefetch,
            name,
            shown,
            min
        );
    }
}

//! `--outbox-drain`: idem's relay draining outbox backlogs (issue 21), on each backend given:
//!
//! - `base`: 10 k pending messages over 100 runs, the reference rate (median of the rounds);
//! - `large`: 1 M over 10 k runs (`--drain-backlog`), as many per run: its rate against
//!   `base`'s (target ≥ 0.8×), and its peak memory against `base`'s (flat);
//! - `held`: `base`'s drain with 100 k messages (`--drain-held`, over 1 k runs) to an exchange
//!   that does not exist in the table, held by the relay as it meets them: the other runs'
//!   rate against `base`'s (target ≥ 0.9×);
//! - `cleanup`: 100 k pending over 1 k runs drained while the inbox's cleaner deletes 10 M sent
//!   rows (`--drain-sent`) from the same table, against the same drain on a table without them
//!   (target ≥ 0.8×), and against the same drain beside the same rows left uncleaned, which
//!   tells what the cleaner costs from what the rows cost by being there.
//!
//! Each drain runs on a fresh table filled before the relay starts, and lasts from the relay's
//! start (its connections included) until it has published every message of the drain. Peak
//! memory is the process's, reset before each drain. Published messages go to a queue purged
//! as they arrive.

use std::time::{Duration, Instant};

use idem_rabbitmq::Relay;
use idem_rabbitmq::lapin::ExchangeKind;
use idem_runtime::Inbox;
use idem_runtime::outbox::Outbox;
use idem_tests::backlog::Backlog;
use idem_tests::bench::figures::{median, peak_rss_mb, reset_peak_rss};
use idem_tests::rabbit::amqp_url;
use idem_tests::{TestDb, unique};
use serde_json::json;

use crate::Suite;
use crate::args::BackendArg;
use crate::report::{round1, round3};

/// Messages per run in every drain.
const PER_RUN: u64 = 100;
/// The reference drain.
const BASE: u64 = 10_000;
/// The drain the cleaner runs beside, and its reference.
const BESIDE_CLEANER: u64 = 100_000;
/// The longest a drain may take before the bench gives up on it.
const LONGEST: Duration = Duration::from_secs(3600);

/// One drain's figures.
#[derive(Debug, Clone, Copy)]
struct Drained {
    backlog: u64,
    held: u64,
    sent_rows: u64,
    /// Of them, how many the cleaner deleted by the drain's end.
    cleaned: u64,
    msgs_per_s: f64,
    peak_rss_mb: f64,
}

/// What one drain sets up besides its backlog.
#[derive(Debug, Clone, Copy, Default)]
struct Beside {
    /// Messages to an exchange that does not exist, in runs of their own.
    held: u64,
    /// Rows sent long ago in the table.
    sent_rows: u64,
    /// The inbox's cleaner deletes them during the drain.
    cleaner: bool,
}

/// Runs every drain on every backend given, prints each and then the targets.
pub(crate) async fn outbox_drain(suite: &Suite) {
    let mut failed = Vec::new();
    for backend in suite.args.backends.clone() {
        let drains = Drains::new(suite, backend).await;
        let base = drains.median(BASE, Beside::default()).await;
        let large = drains
            .once(suite.args.drain_backlog, Beside::default())
            .await;
        let held = Beside {
            held: suite.args.drain_held,
            ..Beside::default()
        };
        let held = drains.median(BASE, held).await;
        let quiet = drains.median(BESIDE_CLEANER, Beside::default()).await;
        let beside_sent = Beside {
            sent_rows: suite.args.drain_sent,
            ..Beside::default()
        };
        // The same rows without the cleaner: what they cost the relay by being there.
        let uncleaned = drains.once(BESIDE_CLEANER, beside_sent).await;
        let cleaning = Beside {
            cleaner: true,
            ..beside_sent
        };
        let cleaning = drains.once(BESIDE_CLEANER, cleaning).await;
        let checks = [
            (
                "large backlog rate",
                large.msgs_per_s / base.msgs_per_s,
                0.8,
            ),
            (
                "held backlog, others' rate",
                held.msgs_per_s / base.msgs_per_s,
                0.9,
            ),
            (
                "during cleanup rate",
                cleaning.msgs_per_s / quiet.msgs_per_s,
                0.8,
            ),
            (
                "during cleanup rate, against the same sent rows uncleaned",
                cleaning.msgs_per_s / uncleaned.msgs_per_s,
                0.8,
            ),
            // Flat: within a fifth of the small drain's peak.
            (
                "large backlog memory",
                base.peak_rss_mb / large.peak_rss_mb,
                1.0 / 1.2,
            ),
        ];
        for (what, ratio, target) in checks {
            let verdict = if ratio >= target { "met" } else { "NOT MET" };
            println!(
                "outbox-drain {} {what}: {:.2} of the reference (target {target:.2}): {verdict}",
                backend.name(),
                ratio
            );
            if ratio < target {
                failed.push(format!("{} {what}", backend.name()));
            }
        }
    }
    if !failed.is_empty() {
        println!("outbox-drain targets not met: {}", failed.join(", "));
    }
}

/// The drains of one backend: its database, and the exchange and queue they publish to.
struct Drains<'a> {
    suite: &'a Suite,
    backend: BackendArg,
    db: TestDb,
    exchange: String,
    queue: String,
}

impl<'a> Drains<'a> {
    async fn new(suite: &'a Suite, backend: BackendArg) -> Self {
        let db = TestDb::connect_with_pool(backend.backend(), 8).await;
        let topology = suite.broker.classic_queue();
        suite.broker.declare(&topology).await;
        let exchange = unique("idem_drain");
        suite
            .broker
            .declare_exchange(&exchange, ExchangeKind::Direct)
            .await;
        suite
            .broker
            .bind(topology.queue(), &exchange, "drained")
            .await;
        Self {
            suite,
            backend,
            db,
            exchange,
            queue: topology.queue().to_owned(),
        }
    }

    /// The drain of `backlog` messages, `--rounds` times after one warm-up: the median rate and
    /// the highest peak.
    async fn median(&self, backlog: u64, beside: Beside) -> Drained {
        let _warm_up = self.drain(backlog, beside).await;
        let mut rounds = Vec::new();
        for _ in 0..self.suite.args.rounds {
            rounds.push(self.drain(backlog, beside).await);
        }
        let rates: Vec<f64> = rounds.iter().map(|d| d.msgs_per_s).collect();
        let peak = rounds.iter().map(|d| d.peak_rss_mb).fold(0.0, f64::max);
        let drained = Drained {
            msgs_per_s: median(rates),
            peak_rss_mb: peak,
            ..rounds[0]
        };
        self.print(drained, "median");
        drained
    }

    /// The drain of `backlog` messages, once.
    async fn once(&self, backlog: u64, beside: Beside) -> Drained {
        let drained = self.drain(backlog, beside).await;
        self.print(drained, "once");
        drained
    }

    /// One drain on a fresh table.
    async fn drain(&self, backlog: u64, beside: Beside) -> Drained {
        let db = &self.db;
        let table = unique("idem_drain_outbox");
        let outbox = Outbox::builder(db.db.clone())
            .table(table.as_str())
            .retention(Duration::from_secs(1))
            .build()
            .await
            .expect("the outbox builds");
        let pending = Backlog {
            prefix: "m",
            exchange: &self.exchange,
            routing_key: "drained",
            runs: backlog / PER_RUN,
            per_run: PER_RUN,
        };
        pending.write(&db.db, &table, false).await;
        let missing = unique("idem_missing");
        let held = Backlog {
            prefix: "h",
            exchange: &missing,
            routing_key: "held",
            runs: beside.held / PER_RUN,
            per_run: PER_RUN,
        };
        held.write(&db.db, &table, false).await;
        let sent = Backlog {
            prefix: "s",
            exchange: &self.exchange,
            routing_key: "drained",
            runs: beside.sent_rows / PER_RUN,
            per_run: PER_RUN,
        };
        sent.write(&db.db, &table, true).await;
        let cleaner = if beside.cleaner {
            let inbox = Inbox::builder(db.db.clone())
                .table(unique("idem_drain_inbox"))
                .outbox(outbox.clone())
                .build()
                .await
                .expect("the inbox builds");
            Some((inbox.clone(), inbox.cleaner().spawn()))
        } else {
            None
        };
        let _ = reset_peak_rss();
        let start = Instant::now();
        let relay = Relay::builder(amqp_url(), outbox.clone())
            .connection_name("bench-drain")
            .start()
            .await
            .expect("the relay starts");
        let mut purged = Instant::now();
        while relay.stats().published < pending.len() {
            assert!(
                start.elapsed() < LONGEST,
                "the relay published {} of {} in {LONGEST:?}",
                relay.stats().published,
                pending.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
            if purged.elapsed() > Duration::from_secs(1) {
                self.suite.broker.purge(&self.queue).await;
                purged = Instant::now();
            }
        }
        let elapsed = start.elapsed();
        let peak = peak_rss_mb();
        relay.shutdown().await;
        if let Some((_inbox, cleaner)) = cleaner {
            cleaner.stop().await;
        }
        let left = db.count(&table, "sent_at = 0").await as u64;
        let cleaned = sent.len() - left;
        self.suite.broker.purge(&self.queue).await;
        let unsent = db.count(&table, "sent_at IS NULL").await as u64;
        assert_eq!(unsent, held.len(), "every message but the held ones sent");
        db.exec(&format!("DROP TABLE {}", quoted(self.backend, &table)))
            .await;
        Drained {
            backlog,
            held: held.len(),
            sent_rows: sent.len(),
            cleaned,
            msgs_per_s: pending.len() as f64 / elapsed.as_secs_f64(),
            peak_rss_mb: peak,
        }
    }

    fn print(&self, drained: Drained, figure: &str) {
        let backend = self.backend.name();
        if self.suite.args.json {
            println!(
                "{}",
                json!({
                    "mode": "outbox-drain",
                    "backend": backend,
                    "backlog": drained.backlog,
                    "runs": drained.backlog / PER_RUN,
                    "held": drained.held,
                    "sent_rows": drained.sent_rows,
                    "cleaned_rows": drained.cleaned,
                    "msgs_per_s": round1(drained.msgs_per_s),
                    "peak_rss_mb": round1(drained.peak_rss_mb),
                    "rate_is": figure,
                })
            );
        } else {
            println!(
                "outbox-drain {backend:<8} backlog {:>8} over {:>6} runs, held {:>6}, sent rows \
                 {:>8} ({:>8} cleaned): {:>8.0} msg/s ({figure}), peak RSS {:>6.1} MB",
                drained.backlog,
                drained.backlog / PER_RUN,
                drained.held,
                drained.sent_rows,
                drained.cleaned,
                drained.msgs_per_s,
                round3(drained.peak_rss_mb),
            );
        }
    }
}

fn quoted(backend: BackendArg, table: &str) -> String {
    match backend {
        BackendArg::Mysql => format!("`{table}`"),
        _ => format!("\"{table}\""),
    }
}

//! What the example's end-to-end tests share: the billing service as a child process (its
//! start, its delivery counters, SIGKILL and SIGTERM), its invoices read back by SQL, and its
//! dead letters.

// Each test file uses a part of this module.
#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use idem_tests::TestBroker;
use sea_orm::sea_query::{Asterisk, Expr, ExprTrait, Func, Query};
use sea_orm::{ConnectionTrait, DatabaseConnection};

/// A billing process's delivery counters, as its `billing stats` log lines give them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Stats {
    /// Processed and acknowledged.
    pub(crate) acked: u64,
    /// Duplicates acknowledged without charging.
    pub(crate) duplicates: u64,
    /// Moved to the dead-letter queue.
    pub(crate) dead_lettered: u64,
    /// Requeued for a later attempt.
    pub(crate) requeued: u64,
    /// Settlements lost with their channel (the broker redelivers those messages).
    pub(crate) settle_lost: u64,
    /// Connection losses that recovered.
    pub(crate) recoveries: u64,
    /// Connections replaced by new ones.
    pub(crate) reconnections: u64,
}

impl Stats {
    /// The counters in a `billing stats acked=1 duplicates=0 ...` line.
    fn parse(line: &str) -> Option<Self> {
        let fields = &line[line.find("billing stats")? + "billing stats".len()..];
        let mut stats = Self::default();
        for field in fields.split_whitespace() {
            let Some((name, value)) = field.split_once('=') else {
                continue;
            };
            let Ok(value) = value.parse() else { continue };
            match name {
                "acked" => stats.acked = value,
                "duplicates" => stats.duplicates = value,
                "dead_lettered" => stats.dead_lettered = value,
                "requeued" => stats.requeued = value,
                "settle_lost" => stats.settle_lost = value,
                "recoveries" => stats.recoveries = value,
                "reconnections" => stats.reconnections = value,
                _ => {}
            }
        }
        Some(stats)
    }

    /// Every delivery these counters settled.
    pub(crate) fn settled(&self) -> u64 {
        self.acked + self.duplicates + self.dead_lettered + self.requeued
    }
}

impl std::ops::Add for Stats {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            acked: self.acked + other.acked,
            duplicates: self.duplicates + other.duplicates,
            dead_lettered: self.dead_lettered + other.dead_lettered,
            requeued: self.requeued + other.requeued,
            settle_lost: self.settle_lost + other.settle_lost,
            recoveries: self.recoveries + other.recoveries,
            reconnections: self.reconnections + other.reconnections,
        }
    }
}

/// What a billing process has logged so far.
#[derive(Debug, Default)]
struct Seen {
    /// The line it logged when it began consuming (it names its database).
    consuming: Option<String>,
    /// Its last counters.
    stats: Stats,
    /// Whether its standard error closed (it exited).
    ended: bool,
    /// Its last lines of output, for failure messages.
    tail: VecDeque<String>,
}

/// How many lines of a process's output a failure message shows.
const TAIL: usize = 20;

/// How long a service stopped with SIGTERM is given to exit.
const STOP_WAIT: Duration = Duration::from_secs(60);

/// The billing binary running as a child process, its standard error read by a thread; killed
/// if still running when dropped.
#[derive(Debug)]
pub(crate) struct Billing {
    child: Child,
    seen: Arc<Mutex<Seen>>,
    reader: Option<JoinHandle<()>>,
}

impl Billing {
    /// Starts the service in consume mode, with `env` on top of this process's environment
    /// (`DATABASE_URL`, `BILLING_QUEUE`...); returns at once.
    pub(crate) fn spawn(env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_billing"));
        command
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("the billing binary starts");
        let stderr = child.stderr.take().unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let reader = {
            let seen = Arc::clone(&seen);
            // Reads to the end, so that the service never blocks on a full pipe.
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    let mut seen = seen.lock().unwrap();
                    if let Some(stats) = Stats::parse(&line) {
                        seen.stats = stats;
                    } else if seen.consuming.is_none() && line.contains("billing is consuming") {
                        seen.consuming = Some(line.clone());
                    }
                    if seen.tail.len() == TAIL {
                        seen.tail.pop_front();
                    }
                    seen.tail.push_back(line);
                }
                seen.lock().unwrap().ended = true;
            })
        };
        Self {
            child,
            seen,
            reader: Some(reader),
        }
    }

    /// Starts the service on `database_url` and returns once it consumes.
    pub(crate) fn start(database_url: &str) -> Self {
        let billing = Self::spawn(&[("DATABASE_URL", database_url)]);
        billing.wait_consuming(Duration::from_secs(60));
        billing
    }

    /// Waits (blocking) until the service consumes; returns the line it logged then.
    ///
    /// # Panics
    ///
    /// When it exits first, or after `timeout`.
    pub(crate) fn wait_consuming(&self, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            {
                let seen = self.seen.lock().unwrap();
                if let Some(line) = &seen.consuming {
                    return line.clone();
                }
                assert!(
                    !seen.ended,
                    "billing exited before consuming:\n{}",
                    self.tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "billing is not consuming after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether the service has begun consuming.
    pub(crate) fn is_consuming(&self) -> bool {
        self.seen.lock().unwrap().consuming.is_some()
    }

    /// Whether its output ended: it exited, or is about to.
    pub(crate) fn has_ended(&self) -> bool {
        self.seen.lock().unwrap().ended
    }

    /// Its last lines of output.
    pub(crate) fn tail(&self) -> String {
        let seen = self.seen.lock().unwrap();
        seen.tail
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Its last logged counters.
    pub(crate) fn stats(&self) -> Stats {
        self.seen.lock().unwrap().stats
    }

    /// Kills it with SIGKILL; returns the counters it logged last.
    pub(crate) fn kill(mut self) -> Stats {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.finish()
    }

    /// Stops it with SIGTERM, gracefully: it must exit cleanly. Returns its final counters.
    pub(crate) fn terminate(mut self) -> Stats {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let deadline = Instant::now() + STOP_WAIT;
        let exit = loop {
            if let Some(exit) = self.child.try_wait().unwrap() {
                break exit;
            }
            if Instant::now() > deadline {
                self.child.kill().unwrap();
                self.child.wait().unwrap();
                self.finish();
                panic!(
                    "billing did not exit within {STOP_WAIT:?} of SIGTERM:\n{}",
                    self.tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.finish();
        assert!(
            exit.success(),
            "billing exited with {exit} after SIGTERM:\n{}",
            self.tail()
        );
        self.finish()
    }

    /// Waits for the reader to reach the end of the output; returns the last counters.
    fn finish(&mut self) -> Stats {
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        self.stats()
    }
}

impl Drop for Billing {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `(invoices, distinct orders invoiced)` for orders whose id starts with `prefix`.
pub(crate) async fn invoices(db: &DatabaseConnection, prefix: &str) -> (i64, i64) {
    let mut counts = (0, 0);
    for table in INVOICE_TABLES {
        let count = Query::select()
            .expr(Func::count(Expr::col(Asterisk)))
            .expr(Func::count_distinct(Expr::col("order_id")))
            .from(table)
            .and_where(Expr::col("order_id").like(format!("{prefix}%")))
            .to_owned();
        let row = db.query_one(&count).await.unwrap().unwrap();
        counts.0 += row.try_get_by_index::<i64>(0).unwrap();
        counts.1 += row.try_get_by_index::<i64>(1).unwrap();
    }
    counts
}

/// The tables billing writes its invoices to: `invoices`, or with `--keys entity`
/// `invoices_by_order`. A run writes to one of them.
const INVOICE_TABLES: [&str; 2] = ["invoices", idem_examples::invoice::TABLE];

/// The amounts invoiced per order, for orders whose id starts with `prefix`.
pub(crate) async fn invoiced_amounts(
    db: &DatabaseConnection,
    prefix: &str,
) -> BTreeMap<String, Vec<i64>> {
    let mut amounts: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for table in INVOICE_TABLES {
        let select = Query::select()
            .columns(["order_id", "amount_cents"])
            .from(table)
            .and_where(Expr::col("order_id").like(format!("{prefix}%")))
            .to_owned();
        for row in db.query_all(&select).await.unwrap() {
            let order: String = row.try_get_by_index(0).unwrap();
            amounts
                .entry(order)
                .or_default()
                .push(row.try_get_by_index(1).unwrap());
        }
    }
    amounts
}

/// Empties the dead-letter queue `queue`; returns the `(message id, x-idem-reason)` of what it
/// held, sorted.
pub(crate) async fn drain_dead_letters(broker: &TestBroker, queue: &str) -> Vec<(String, String)> {
    let mut letters: Vec<_> = broker
        .drain(queue)
        .await
        .into_iter()
        .map(|letter| {
            let reason = letter.reason().to_owned();
            (letter.message_id.unwrap_or_default(), reason)
        })
        .collect();
    letters.sort();
    letters
}

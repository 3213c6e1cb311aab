//! Deterministic simulation of idem's timed parts, for its crates' tests.
//!
//! A simulation runs the real code (the lease renewal, the delivery policy, the relay's holds)
//! against a simulated environment (a database, a broker) on a single-threaded tokio runtime
//! whose clock is paused: time moves only when every task waits, straight to the next timer, so
//! an hour of leases and back-offs takes milliseconds. Every choice of the environment (a
//! latency, a failure, when a rival worker shows up) is drawn from a generator seeded per run,
//! so a seed replays its run exactly, event for event.
//!
//! [`check`] runs a scenario over many seeds and names the first seed that broke a property;
//! `IDEM_SIM_SEED=<seed>` replays that one alone, `IDEM_SIM_SEEDS=<n>` runs more of them.

use std::fmt::Write as _;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// A small seeded generator (SplitMix64): the same seed draws the same numbers on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// The generator of `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number below `end` (0 when `end` is 0).
    pub fn below(&mut self, end: u64) -> u64 {
        self.next_u64() % end.max(1)
    }

    /// True once in `n` draws on average; never when `n` is `None`.
    pub fn one_in(&mut self, n: Option<u64>) -> bool {
        n.is_some_and(|n| self.below(n) == 0)
    }

    /// A duration of up to `max`, in whole milliseconds.
    pub fn up_to(&mut self, max: Duration) -> Duration {
        let ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(self.below(ms.saturating_add(1)))
    }
}

/// What a run did, event by event, with the simulated time of each: printed for a failing seed,
/// and compared between two runs of one seed to show that it replays.
#[derive(Debug)]
pub struct Trace {
    start: Instant,
    events: String,
}

impl Default for Trace {
    fn default() -> Self {
        Self::new()
    }
}

impl Trace {
    /// An empty trace whose times count from now.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            events: String::new(),
        }
    }

    /// Notes `event` at the simulated time.
    pub fn note(&mut self, event: impl std::fmt::Display) {
        let at = self.ms(Instant::now());
        let _ = writeln!(self.events, "{at:>8} ms  {event}");
    }

    /// Milliseconds from the trace's start to `at`.
    pub fn ms(&self, at: Instant) -> u128 {
        at.saturating_duration_since(self.start).as_millis()
    }

    /// The events so far, one per line.
    pub fn events(&self) -> &str {
        &self.events
    }
}

/// Runs `scenario` once for `seed` on a fresh single-threaded runtime with a paused clock;
/// `Err` holds the property it broke and the run's trace.
pub fn run_seed<F, Fut>(seed: u64, scenario: F) -> Result<String, String>
where
    F: FnOnce(Rng) -> Fut,
    Fut: Future<Output = Result<String, String>>,
{
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime builds")
        .block_on(scenario(Rng::new(seed)))
}

/// Whether one seed is replayed (`IDEM_SIM_SEED`): the checks that many runs met what they were
/// meant to (some claim lost, some message held) do not apply to it.
pub fn replaying() -> bool {
    std::env::var_os("IDEM_SIM_SEED").is_some()
}

/// The seeds to run: `seeds` of them, or the one `IDEM_SIM_SEED` names; `IDEM_SIM_SEEDS`
/// overrides the count, which must not be 0.
pub fn chosen_seeds(seeds: u64) -> Vec<u64> {
    let from_env = |name: &str| {
        std::env::var(name).ok().map(|value| {
            (value.parse::<u64>()).unwrap_or_else(|_| panic!("{name}={value}: not a number"))
        })
    };
    if let Some(seed) = from_env("IDEM_SIM_SEED") {
        return vec![seed];
    }
    let count = from_env("IDEM_SIM_SEEDS").unwrap_or(seeds);
    assert!(count > 0, "IDEM_SIM_SEEDS=0 would check nothing");
    (0..count).collect()
}

/// Runs `scenario` for seeds 0 to `seeds` (whatever the environment says: a planted bug is
/// looked for in the same seeds every time) until one breaks a property: that seed, with its
/// error and trace.
pub fn first_failing<F, Fut>(seeds: u64, scenario: F) -> Option<(u64, String)>
where
    F: Fn(Rng) -> Fut,
    Fut: Future<Output = Result<String, String>>,
{
    (0..seeds).find_map(|seed| run_seed(seed, &scenario).err().map(|error| (seed, error)))
}

/// Runs `scenario` for each of `seeds` seeds (see [`chosen_seeds`]) and fails, naming the first
/// failing seed with its trace and how to replay it, if any run broke a property; otherwise
/// returns what each run reported, for the checks that the runs met what they were meant to.
pub fn check<F, Fut>(name: &str, seeds: u64, scenario: F) -> Vec<String>
where
    F: Fn(Rng) -> Fut,
    Fut: Future<Output = Result<String, String>>,
{
    let mut reports = Vec::new();
    let mut failing = Vec::new();
    for seed in chosen_seeds(seeds) {
        match run_seed(seed, &scenario) {
            Ok(report) => reports.push(report),
            Err(error) => failing.push((seed, error)),
        }
    }
    if let Some((seed, error)) = failing.first() {
        panic!(
            "{name}: {} of the seeds broke a property; the first, seed {seed}:\n{error}\n\
             replay it alone with IDEM_SIM_SEED={seed}",
            failing.len()
        );
    }
    reports
}

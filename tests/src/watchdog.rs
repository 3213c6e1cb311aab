//! A limit on how long one test process runs: a test that hangs (a broker call that never
//! returns, a recovery that waits forever) ends its process with a message naming the limit,
//! rather than holding up the whole run until CI gives up on it.

use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long a test process may run unless `IDEM_TEST_PROCESS_LIMIT_S` says otherwise: several
/// times the longest suite (the cluster's, about 7 minutes on two cores).
const DEFAULT_LIMIT: Duration = Duration::from_secs(25 * 60);

/// Set by a program that runs for as long as it is asked to (a benchmark, a soak).
static OFF: AtomicBool = AtomicBool::new(false);

/// Keeps this process free of the watchdog: for benchmarks, whose runs last as long as their
/// arguments say (a soak of ten million messages, tables of twenty million rows), not tests.
/// Call it before anything connects.
pub fn off() {
    OFF.store(true, Ordering::SeqCst);
}

/// Starts the watchdog of this process, once, unless [`off`] was called; every database and
/// broker a test connects to starts it.
pub fn start() {
    static STARTED: Once = Once::new();
    if OFF.load(Ordering::SeqCst) {
        return;
    }
    STARTED.call_once(|| {
        let limit = std::env::var("IDEM_TEST_PROCESS_LIMIT_S")
            .ok()
            .and_then(|seconds| seconds.parse().ok())
            .map_or(DEFAULT_LIMIT, Duration::from_secs);
        std::thread::Builder::new()
            .name("idem-test-watchdog".to_owned())
            .spawn(move || {
                std::thread::sleep(limit);
                let test = std::env::args().collect::<Vec<_>>().join(" ");
                eprintln!(
                    "idem test watchdog: `{test}` ran longer than {limit:?} (a test hangs; the \
                     harness's \"has been running for over 60 seconds\" lines name it); stopping \
                     the process"
                );
                std::process::exit(101);
            })
            .expect("the watchdog thread starts");
    });
}

//! A process whose wall clock is wrong, for the clock tests: a small library preloaded into the
//! child shifts `CLOCK_REALTIME` (and `gettimeofday`, `time`) and leaves the monotonic clock
//! true, so its timers run normally. Built here with the machine's C compiler, so the tests need
//! no tool installed by hand.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

const SOURCE: &str = include_str!("clock_skew.c");

/// A command that runs `program` with its wall clock `behind` the true one.
pub fn behind(program: impl AsRef<std::ffi::OsStr>, behind: Duration) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(program);
    command
        .env("LD_PRELOAD", library())
        .env("IDEM_SKEW_SECONDS", format!("-{}", behind.as_secs()));
    command
}

/// The preload library, compiled once per test process.
fn library() -> &'static PathBuf {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("idem-skew-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for the skew library");
        let source = dir.join("clock_skew.c");
        let library = dir.join("libidem_clock_skew.so");
        std::fs::write(&source, SOURCE).expect("the skew library's source is written");
        let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
        let status = Command::new(&compiler)
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&library)
            .arg(&source)
            .arg("-ldl")
            .status()
            .unwrap_or_else(|error| {
                panic!("the clock tests build a small C library with `{compiler}`: {error}")
            });
        assert!(
            status.success(),
            "{compiler} could not build the skew library"
        );
        library
    })
}

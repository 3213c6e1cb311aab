//! A progress line on standard error for long runs, drawn only when standard error is a
//! terminal: rewritten in place (`\r`) every [`EVERY`], cleared when the run ends. Logs go
//! through [`LogWriter`], which clears the line before each record so that the two never mix;
//! the next tick draws it again below the record.
//!
//! The line is padded with spaces rather than erased with escape codes, so it holds no escape
//! sequence at all.

use std::io::{IsTerminal, StderrLock, Write};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the line is redrawn; the first drawing waits this long too, so that a short run
/// shows nothing.
pub const EVERY: Duration = Duration::from_millis(250);

/// The width of the progress line on the terminal now; 0 when none is shown. Taken after the
/// standard error lock, by whoever writes to standard error.
static SHOWN: Mutex<usize> = Mutex::new(0);

/// A progress line, redrawn from `render` by a thread of its own until dropped (or
/// [`finish`](Progress::finish)ed), then cleared.
#[derive(Debug)]
#[must_use = "the line is cleared when the Progress is dropped"]
pub struct Progress {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Progress {
    /// Shows `render()` on standard error every [`EVERY`] if standard error is a terminal, and
    /// nothing otherwise.
    pub fn start(render: impl Fn() -> String + Send + 'static) -> Self {
        if !std::io::stderr().is_terminal() {
            return Self {
                stop: None,
                thread: None,
            };
        }
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(EVERY) {
                let line = render();
                let mut stderr = std::io::stderr().lock();
                let mut shown = SHOWN.lock().unwrap_or_else(PoisonError::into_inner);
                // A terminal that went away mid-run leaves nothing to show progress on.
                let _ = redraw(&mut stderr, &mut shown, &line);
            }
        });
        Self {
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Stops redrawing and clears the line.
    pub fn finish(self) {}
}

impl Drop for Progress {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
            let mut stderr = std::io::stderr().lock();
            let mut shown = SHOWN.lock().unwrap_or_else(PoisonError::into_inner);
            let _ = clear(&mut stderr, &mut shown);
        }
    }
}

/// Writes `line` over the one shown (`shown` columns wide), padding with spaces to cover it.
fn redraw(out: &mut impl Write, shown: &mut usize, line: &str) -> std::io::Result<()> {
    let width = line.chars().count();
    let pad = shown.saturating_sub(width);
    write!(out, "\r{line}{:pad$}", "")?;
    out.flush()?;
    *shown = width;
    Ok(())
}

/// Blanks the line shown, if any, and returns the cursor to its start.
fn clear(out: &mut impl Write, shown: &mut usize) -> std::io::Result<()> {
    if *shown > 0 {
        write!(out, "\r{:width$}\r", "", width = *shown)?;
        out.flush()?;
        *shown = 0;
    }
    Ok(())
}

/// The log writer of [`init_logging`](crate::init_logging): standard error, with the progress
/// line cleared before each record.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogWriter;

/// One log record's hold on standard error, from [`LogWriter`].
#[derive(Debug)]
pub struct LogRecord {
    stderr: StderrLock<'static>,
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogRecord;

    fn make_writer(&'a self) -> LogRecord {
        LogRecord {
            stderr: std::io::stderr().lock(),
        }
    }
}

impl Write for LogRecord {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut shown = SHOWN.lock().unwrap_or_else(PoisonError::into_inner);
        clear(&mut self.stderr, &mut shown)?;
        drop(shown);
        self.stderr.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.stderr.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shorter_line_covers_the_longer_one() {
        let mut out = Vec::new();
        let mut shown = 0;
        redraw(&mut out, &mut shown, "published 10/100").unwrap();
        redraw(&mut out, &mut shown, "charged 9/99").unwrap();
        assert_eq!(shown, 12);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "\rpublished 10/100\rcharged 9/99    "
        );
    }

    #[test]
    fn clearing_blanks_the_line_once() {
        let mut out = Vec::new();
        let mut shown = 0;
        clear(&mut out, &mut shown).unwrap();
        assert!(out.is_empty(), "nothing shown, nothing to clear");
        redraw(&mut out, &mut shown, "abc").unwrap();
        clear(&mut out, &mut shown).unwrap();
        clear(&mut out, &mut shown).unwrap();
        assert_eq!(shown, 0);
        assert_eq!(String::from_utf8(out).unwrap(), "\rabc\r   \r");
    }
}

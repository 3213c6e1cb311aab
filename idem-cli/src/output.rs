//! How the command prints: lines that stop quietly when their reader goes away, times, ages
//! and tables for people.

use std::fmt;
use std::io::{ErrorKind, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Prints a line on standard output (see [`write_out`]).
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::write_out(format_args!($($arg)*), true) };
}

/// Prints a line on standard error (see [`write_err`]).
macro_rules! note {
    ($($arg:tt)*) => { $crate::output::write_err(format_args!($($arg)*), true) };
}

pub(crate) use {note, out};

/// Whether standard output's reader went away: nothing more is written to it.
static OUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Whether standard error's reader went away.
static ERR_CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `text` (and a newline when `line`) on standard output. A reader that went away
/// (`idem dlq list | head`) ends the output quietly: the command finishes what it does, and
/// exits as it would have.
pub(crate) fn write_out(text: fmt::Arguments<'_>, line: bool) {
    write_to(&mut std::io::stdout().lock(), &OUT_CLOSED, text, line);
}

/// Writes `text` (and a newline when `line`) on standard error, as [`write_out`] does.
pub(crate) fn write_err(text: fmt::Arguments<'_>, line: bool) {
    write_to(&mut std::io::stderr().lock(), &ERR_CLOSED, text, line);
}

fn write_to(stream: &mut impl Write, closed: &AtomicBool, text: fmt::Arguments<'_>, line: bool) {
    if closed.load(Ordering::Relaxed) {
        return;
    }
    let written = stream
        .write_fmt(text)
        .and_then(|()| {
            if line {
                stream.write_all(b"\n")
            } else {
                Ok(())
            }
        })
        .and_then(|()| stream.flush());
    if let Err(error) = written {
        // Nothing else can be said where nothing can be written.
        if error.kind() == ErrorKind::BrokenPipe || error.kind() == ErrorKind::WriteZero {
            closed.store(true, Ordering::Relaxed);
        }
    }
}

/// Milliseconds since the Unix epoch, for JSON.
pub(crate) fn time_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}

/// `2026-12-02T05:08:24Z` (UTC, to the second).
pub(crate) fn time(at: SystemTime) -> String {
    let secs = time_ms(at) / 1000;
    let (days, of_day) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

/// The calendar date `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `3d 4h`, `2h 5m`, `4m 10s`, `12s`: the two largest units.
pub(crate) fn age(age: Duration) -> String {
    let secs = age.as_secs();
    let units = [(86_400, "d"), (3600, "h"), (60, "m"), (1, "s")];
    let Some(first) = units.iter().position(|(size, _)| secs >= *size) else {
        return "0s".into();
    };
    let (size, unit) = units[first];
    match units.get(first + 1) {
        Some((next, next_unit)) if secs % size >= *next => {
            format!("{}{unit} {}{next_unit}", secs / size, secs % size / next)
        }
        _ => format!("{}{unit}", secs / size),
    }
}

/// Prints `rows` under `header`, each column as wide as its widest cell.
pub(crate) fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|name| name.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out!("{}", padded.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc_dates() {
        assert_eq!(time(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let at = UNIX_EPOCH + Duration::from_secs(1_796_188_104);
        assert_eq!(time(at), "2026-12-02T05:08:24Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(time(leap), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn ages_show_two_units() {
        assert_eq!(age(Duration::from_millis(300)), "0s");
        assert_eq!(age(Duration::from_secs(12)), "12s");
        assert_eq!(age(Duration::from_secs(250)), "4m 10s");
        assert_eq!(age(Duration::from_secs(7200)), "2h");
        assert_eq!(age(Duration::from_secs(3 * 86_400 + 4 * 3600 + 5)), "3d 4h");
    }
}

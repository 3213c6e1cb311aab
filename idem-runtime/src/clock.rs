//! Time as stored in the inbox: milliseconds since the Unix epoch, by the database's clock.
//!
//! Leases and expiries are written and compared by the database's clock, inside the statements
//! (see `store::dialect`): every process sharing an inbox reads them the same way, whatever its
//! host's clock says. This module only converts.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest duration the inbox writes or waits for, a thousand years: a retention or a lease
/// meant as "for good" (`Duration::MAX`) is added to the database's clock, and to this
/// process's, without overflowing it.
const FOREVER: Duration = Duration::from_secs(1000 * 366 * 24 * 3600);

/// `duration`, at most [`FOREVER`].
pub(crate) fn capped(duration: Duration) -> Duration {
    duration.min(FOREVER)
}

/// A duration in whole milliseconds, at most [`FOREVER`]'s.
pub(crate) fn duration_ms(duration: Duration) -> i64 {
    i64::try_from(capped(duration).as_millis()).expect("a thousand years of milliseconds fit")
}

/// Milliseconds since the Unix epoch as a time.
pub(crate) fn from_epoch_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

//! Wall-clock time as stored in the inbox: milliseconds since the Unix epoch.
//!
//! Leases and expiries are compared against the clock of the process that reads them, so the
//! hosts sharing an inbox need synchronized clocks (NTP), to well within a lease.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Now, in milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    to_epoch_ms(SystemTime::now())
}

/// A time as milliseconds since the Unix epoch (0 before it).
pub(crate) fn to_epoch_ms(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map(duration_ms)
        .unwrap_or(0)
}

/// A duration in whole milliseconds, saturating.
pub(crate) fn duration_ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Milliseconds since the Unix epoch as a time.
pub(crate) fn from_epoch_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

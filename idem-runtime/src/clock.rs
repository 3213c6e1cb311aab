//! Time as stored in the inbox: milliseconds since the Unix epoch, by the database's clock.
//!
//! Leases and expiries are written and compared by the database's clock, inside the statements
//! (see `store::dialect`): every process sharing an inbox reads them the same way, whatever its
//! host's clock says. This module only converts.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A duration in whole milliseconds, saturating.
pub(crate) fn duration_ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Milliseconds since the Unix epoch as a time.
pub(crate) fn from_epoch_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

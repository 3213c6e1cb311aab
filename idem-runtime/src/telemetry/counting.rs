//! What the summaries count by: this process's clock, days, and the age buckets of duplicates.

use std::time::{SystemTime, UNIX_EPOCH};

/// A day, in milliseconds; rows are by UTC day.
pub(super) const DAY_MS: i64 = 86_400_000;

/// The columns of the age buckets, in order.
pub(super) const AGE_COLUMNS: &str =
    "age_0, age_1, age_2, age_3, age_4, age_5, age_6, age_7, age_8, age_9";

/// The upper bounds, in seconds, of the age buckets duplicates are counted in (a last bucket
/// holds the older ones): a second, a minute, ten minutes, an hour, six hours, a day, three
/// days, a week, two weeks.
pub(super) const AGE_BUCKETS: [u64; 9] = [
    1, 60, 600, 3_600, 21_600, 86_400, 259_200, 604_800, 1_209_600,
];

/// Milliseconds since the Unix epoch, by this process's clock.
pub(super) fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

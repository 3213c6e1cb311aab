//! Figures of a benchmark: a latency histogram of fixed size, medians, and the process's
//! resident memory.

use std::time::Duration;

/// Sub-buckets per power of two: values are kept within 1/64 (1.6 %) of what was recorded.
const SUB_BUCKETS: u64 = 64;
/// Enough buckets for any latency up to 2^40 µs (12 days).
const BUCKETS: usize = (34 * SUB_BUCKETS + 2 * SUB_BUCKETS) as usize;

/// Latencies in a fixed number of log-linear buckets of microseconds: its size does not grow
/// with the number of values recorded, so a million-message run can keep one.
#[derive(Clone)]
pub struct Histogram {
    counts: Box<[u64; BUCKETS]>,
    total: u64,
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.total)
            .finish_non_exhaustive()
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: Box::new([0; BUCKETS]),
            total: 0,
        }
    }
}

impl Histogram {
    /// Records one latency.
    pub fn record(&mut self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.counts[bucket(micros)] += 1;
        self.total += 1;
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts.iter()) {
            *mine += theirs;
        }
        self.total += other.total;
    }

    /// How many values were recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The value at quantile `q` (0.5 for the median, 0.99...), in milliseconds; NaN when
    /// empty.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.total == 0 {
            return f64::NAN;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (index, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return lower_bound(index) as f64 / 1000.0;
            }
        }
        f64::NAN
    }
}

/// The bucket of `micros`: exact below 128 µs, then 64 buckets per power of two.
fn bucket(micros: u64) -> usize {
    let bits = 64 - micros.leading_zeros() as u64;
    let index = if bits <= 7 {
        micros
    } else {
        let shift = bits - 7;
        (shift << 6) + (micros >> shift)
    };
    (index as usize).min(BUCKETS - 1)
}

/// The smallest value of bucket `index`.
fn lower_bound(index: usize) -> u64 {
    let index = index as u64;
    if index < 2 * SUB_BUCKETS {
        return index;
    }
    let shift = index / SUB_BUCKETS - 1;
    (index - shift * SUB_BUCKETS) << shift
}

/// The median of `values` (the upper one of an even count); NaN when empty.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Resets the process's peak resident memory (`VmHWM`) to its current resident memory, by
/// writing `5` to `/proc/self/clear_refs` (Linux). Returns whether it could.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The process's peak resident memory since it started or since [`reset_peak_rss`], in MB
/// (`VmHWM`); NaN where `/proc` does not tell.
pub fn peak_rss_mb() -> f64 {
    status_kb("VmHWM:").map_or(f64::NAN, |kb| kb as f64 / 1024.0)
}

/// The process's resident memory now, in MB (`VmRSS`); NaN where `/proc` does not tell.
pub fn rss_mb() -> f64 {
    status_kb("VmRSS:").map_or(f64::NAN, |kb| kb as f64 / 1024.0)
}

fn status_kb(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with(field))?;
    line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_keep_values_within_two_percent() {
        for micros in [0, 1, 127, 128, 129, 1_000, 65_432, 1_000_000, 123_456_789] {
            let low = lower_bound(bucket(micros));
            assert!(low <= micros, "{micros}: {low}");
            assert!(micros - low <= micros / 50, "{micros}: {low}");
        }
        assert!(bucket(u64::MAX) < BUCKETS);
    }

    #[test]
    fn quantiles() {
        let mut histogram = Histogram::default();
        for ms in 1..=100 {
            histogram.record(Duration::from_millis(ms));
        }
        let p50 = histogram.quantile_ms(0.5);
        let p99 = histogram.quantile_ms(0.99);
        assert!((49.0..=50.0).contains(&p50), "{p50}");
        assert!((97.0..=99.0).contains(&p99), "{p99}");
    }
}

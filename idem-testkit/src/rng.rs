//! The seeded generator schedules are drawn from: SplitMix64, small and the same on every
//! platform, so that a seed names one schedule for good.

use std::hash::{BuildHasher, Hasher};
use std::time::{SystemTime, UNIX_EPOCH};

/// The environment variable that sets the seed of runs that set none themselves.
pub const SEED_VARIABLE: &str = "IDEM_TESTKIT_SEED";

/// SplitMix64 (Steele, Lea and Flood, 2014): every seed gives a different sequence, and the
/// same seed the same sequence.
#[derive(Debug, Clone)]
pub(crate) struct Rng {
    state: u64,
}

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (`bound` > 0). Lemire's multiply-shift: no division, and a bias
    /// of at most `bound / 2^64`, nothing for the small bounds schedules use.
    pub(crate) fn below(&mut self, bound: usize) -> usize {
        let wide = u128::from(self.next_u64()) * bound as u128;
        (wide >> 64) as usize
    }

    /// One of `weights`' indexes, each drawn with its weight's share (the sum must be > 0).
    pub(crate) fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u32 = weights.iter().sum();
        let mut draw = self.below(total as usize) as u32;
        for (index, weight) in weights.iter().enumerate() {
            if draw < *weight {
                return index;
            }
            draw -= weight;
        }
        unreachable!("a draw below the sum of the weights falls on one of them")
    }
}

/// The seed of a run that was given none: [`SEED_VARIABLE`] when it is set (a decimal number,
/// or hexadecimal after `0x`), a fresh one otherwise.
///
/// # Panics
///
/// When [`SEED_VARIABLE`] is set to something that is not a number: a replay that silently
/// ran another schedule would mislead.
pub(crate) fn seed_from_environment() -> u64 {
    match std::env::var(SEED_VARIABLE) {
        Ok(text) => parse_seed(&text)
            .unwrap_or_else(|| panic!("{SEED_VARIABLE}={text:?} is not a seed (a number)")),
        Err(_) => fresh_seed(),
    }
}

fn parse_seed(text: &str) -> Option<u64> {
    let text = text.trim();
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// A seed no earlier run is likely to have had: the standard library's per-process random
/// hashing keys, mixed with the clock.
fn fresh_seed() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    hasher.write_u128(now);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_sequence_and_another_seed_another() {
        let draw = |seed| {
            let mut rng = Rng::new(seed);
            (0..8).map(|_| rng.next_u64()).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        // SplitMix64's published first output for seed 0.
        assert_eq!(draw(0)[0], 0xe220_a839_7b1d_cdaf);
    }

    #[test]
    fn draws_stay_below_their_bound_and_reach_every_value() {
        let mut rng = Rng::new(42);
        let mut seen = [0u32; 5];
        for _ in 0..1_000 {
            seen[rng.below(5)] += 1;
        }
        assert!(seen.iter().all(|&count| count > 100), "{seen:?}");
        let mut weighted = [0u32; 3];
        for _ in 0..1_000 {
            weighted[rng.weighted(&[0, 1, 3])] += 1;
        }
        assert_eq!(weighted[0], 0);
        assert!(weighted[2] > weighted[1] * 2, "{weighted:?}");
    }

    #[test]
    fn seeds_are_read_in_decimal_and_hexadecimal() {
        assert_eq!(parse_seed("42"), Some(42));
        assert_eq!(parse_seed(" 0x2a "), Some(42));
        assert_eq!(parse_seed("forty-two"), None);
    }
}

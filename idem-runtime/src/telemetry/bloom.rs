//! A Bloom filter of inbox keys, in a form the database stores: a fixed number of bits, a
//! fixed number of probes, positions from SHA-256 (the same in every process and version).

use sha2::{Digest, Sha256};

/// Bits per filter: 2^20 (128 KiB).
pub(crate) const BITS: usize = 1 << 20;

/// Probes per key.
const PROBES: u64 = 7;

/// Keys a filter takes before a new one is begun: at this many its false-positive rate is
/// about 0.015 % (`(1 - e^(-7 * 50000 / 2^20))^7`, [`FALSE_POSITIVE_RATE`]); a check against
/// several filters errs at about the sum of their rates.
pub(crate) const CAPACITY: u64 = 50_000;

/// The false-positive rate of a full filter.
pub(crate) const FALSE_POSITIVE_RATE: f64 = 0.000_15;

/// A set of keys that answers "maybe" or "no".
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bloom {
    words: Vec<u64>,
}

impl Default for Bloom {
    fn default() -> Self {
        Self {
            words: vec![0; BITS / 64],
        }
    }
}

impl Bloom {
    /// The filter stored as `bytes` (little-endian words); `None` when they are not one.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != BITS / 8 {
            return None;
        }
        let words = bytes
            .chunks_exact(8)
            .map(|word| u64::from_le_bytes(word.try_into().expect("8 bytes")))
            .collect();
        Some(Self { words })
    }

    /// The filter as the database stores it.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        self.words
            .iter()
            .flat_map(|word| word.to_le_bytes())
            .collect()
    }

    /// Adds `consumer`'s `key`.
    pub(crate) fn insert(&mut self, consumer: &str, key: &str) {
        for bit in Positions::of(consumer, key).0 {
            self.words[bit / 64] |= 1 << (bit % 64);
        }
    }

    /// Whether the key of `positions` may have been added (false positives at the rate above).
    pub(crate) fn contains(&self, positions: &Positions) -> bool {
        (positions.0.iter()).all(|bit| self.words[bit / 64] & (1 << (bit % 64)) != 0)
    }
}

/// The bits of a key, computed once for all the filters it is checked against.
#[derive(Debug)]
pub(crate) struct Positions([usize; PROBES as usize]);

impl Positions {
    /// The bits of `consumer`'s `key`.
    pub(crate) fn of(consumer: &str, key: &str) -> Self {
        let mut bits = [0; PROBES as usize];
        for (slot, bit) in bits.iter_mut().zip(positions(consumer, key)) {
            *slot = bit;
        }
        Self(bits)
    }
}

/// The bits of a key: double hashing over two halves of its SHA-256.
fn positions(consumer: &str, key: &str) -> impl Iterator<Item = usize> {
    let mut hash = Sha256::new();
    hash.update((consumer.len() as u64).to_le_bytes());
    hash.update(consumer.as_bytes());
    hash.update(key.as_bytes());
    let digest = hash.finalize();
    let half = |at: usize| u64::from_le_bytes(digest[at..at + 8].try_into().expect("8 bytes"));
    let (first, step) = (half(0), half(8) | 1);
    (0..PROBES).map(move |i| (first.wrapping_add(i.wrapping_mul(step)) % BITS as u64) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn added_keys_are_found_and_survive_storage() {
        let mut bloom = Bloom::default();
        for i in 0..1000 {
            bloom.insert("c", &format!("k{i}"));
        }
        let stored = Bloom::from_bytes(&bloom.to_bytes()).unwrap();
        assert_eq!(stored, bloom);
        assert!((0..1000).all(|i| stored.contains(&Positions::of("c", &format!("k{i}")))));
        assert!(
            !stored.contains(&Positions::of("other", "k1")),
            "keyed by consumer too"
        );
        assert!(Bloom::from_bytes(&[0; 16]).is_none());
    }

    #[test]
    fn at_capacity_false_positives_stay_under_a_tenth_of_a_percent() {
        let mut bloom = Bloom::default();
        for i in 0..CAPACITY {
            bloom.insert("c", &format!("in-{i}"));
        }
        let trials = 100_000;
        let hits = (0..trials)
            .filter(|i| bloom.contains(&Positions::of("c", &format!("out-{i}"))))
            .count();
        let rate = hits as f64 / f64::from(trials);
        assert!(rate < 0.001, "false-positive rate {rate}");
    }
}

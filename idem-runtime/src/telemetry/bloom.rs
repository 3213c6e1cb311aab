//! Bloom filters of deleted keys, in pieces the database stores apart: every bit of a key lies
//! in one piece of 4 KiB, chosen by its hash, so that adding a key rewrites one piece, and a
//! check reads one piece per filter. A key's piece and bits are slices of its SHA-256 (the
//! same in every process and version), each probe an independent one.

use sha2::{Digest, Sha256};

/// Pieces per filter: a filter is 128 × 4 KiB = 512 KiB.
pub(crate) const PIECES: usize = 1 << PIECE_INDEX_BITS;

/// Bits per piece: 2^15 (4 KiB).
pub(crate) const PIECE_BITS: usize = 1 << PROBE_BITS;

/// Probes per key, each 15 bits of its hash: 7 + 16 × 15 = 247 of its 256 bits.
const PROBES: usize = 16;

const PIECE_INDEX_BITS: usize = 7;
const PROBE_BITS: usize = 15;

/// Keys a filter takes before a new one is begun: 33.6 bits a key, about 980 keys a piece,
/// where a check errs with probability about 1.8 × 10⁻⁷ ([`false_positive`]).
pub(crate) const CAPACITY: u64 = 125_000;

/// The probability that a check against a piece holding `keys` keys takes a key it does not
/// hold for one it holds: `(1 - e^(-16 keys / 2^15))^16`.
pub(crate) fn false_positive(keys: u64) -> f64 {
    if keys == 0 {
        return 0.0;
    }
    let per_bit = PROBES as f64 * keys as f64 / PIECE_BITS as f64;
    (1.0 - (-per_bit).exp()).powi(PROBES as i32)
}

/// One piece of a filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Piece {
    words: Box<[u64]>,
}

impl Default for Piece {
    fn default() -> Self {
        Self {
            words: vec![0; PIECE_BITS / 64].into_boxed_slice(),
        }
    }
}

impl Piece {
    /// The piece stored as `bytes` (little-endian words); `None` when they are not one.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != PIECE_BITS / 8 {
            return None;
        }
        let words = bytes
            .chunks_exact(8)
            .map(|word| u64::from_le_bytes(word.try_into().expect("8 bytes")))
            .collect();
        Some(Self { words })
    }

    /// The piece as the database stores it.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        self.words
            .iter()
            .flat_map(|word| word.to_le_bytes())
            .collect()
    }

    /// Adds the key of `positions` (which must belong to this piece).
    pub(crate) fn insert(&mut self, positions: &Positions) {
        for &bit in &positions.bits {
            let bit = usize::from(bit);
            self.words[bit / 64] |= 1 << (bit % 64);
        }
    }

    /// Whether the key of `positions` may have been added; stops at the first bit unset.
    pub(crate) fn contains(&self, positions: &Positions) -> bool {
        (positions.bits.iter()).all(|&bit| {
            let bit = usize::from(bit);
            self.words[bit / 64] & (1 << (bit % 64)) != 0
        })
    }

    /// Adds every key of `other`.
    pub(crate) fn merge(&mut self, other: &Piece) {
        for (word, other) in self.words.iter_mut().zip(other.words.iter()) {
            *word |= other;
        }
    }
}

/// A key's piece and bits, computed once for all the filters it is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Positions {
    piece: usize,
    bits: [u16; PROBES],
}

impl Positions {
    /// The piece and bits of `consumer`'s `key`.
    pub(crate) fn of(consumer: &str, key: &str) -> Self {
        let mut hash = Sha256::new();
        hash.update((consumer.len() as u64).to_le_bytes());
        hash.update(consumer.as_bytes());
        hash.update(key.as_bytes());
        let digest: [u8; 32] = hash.finalize().into();
        let piece = slice(&digest, 0, PIECE_INDEX_BITS);
        let mut bits = [0; PROBES];
        for (probe, bit) in bits.iter_mut().enumerate() {
            let at = PIECE_INDEX_BITS + probe * PROBE_BITS;
            *bit = u16::try_from(slice(&digest, at, PROBE_BITS)).expect("15 bits");
        }
        Self { piece, bits }
    }

    /// The piece of the filter that holds the key's bits.
    pub(crate) fn piece(&self) -> usize {
        self.piece
    }
}

/// The `width` bits (at most 17) of `digest` from bit `at` on.
fn slice(digest: &[u8; 32], at: usize, width: usize) -> usize {
    let mut window = [0; 4];
    let bytes = &digest[at / 8..(at / 8 + 3).min(32)];
    window[..bytes.len()].copy_from_slice(bytes);
    let word = u32::from_le_bytes(window) as usize;
    (word >> (at % 8)) & ((1 << width) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn added(keys: impl Iterator<Item = String>) -> Vec<Piece> {
        let mut pieces = vec![Piece::default(); PIECES];
        for key in keys {
            let positions = Positions::of("c", &key);
            pieces[positions.piece()].insert(&positions);
        }
        pieces
    }

    #[test]
    fn added_keys_are_found_and_survive_storage() {
        let pieces = added((0..1000).map(|i| format!("k{i}")));
        let stored: Vec<Piece> = (pieces.iter())
            .map(|piece| Piece::from_bytes(&piece.to_bytes()).unwrap())
            .collect();
        assert_eq!(stored, pieces);
        let found = |consumer: &str, key: &str| {
            let positions = Positions::of(consumer, key);
            stored[positions.piece()].contains(&positions)
        };
        assert!((0..1000).all(|i| found("c", &format!("k{i}"))));
        assert!(!found("other", "k1"), "keyed by consumer too");
        assert!(Piece::from_bytes(&[0; 16]).is_none());
    }

    #[test]
    fn keys_spread_over_the_pieces_and_their_bits() {
        let mut per_piece = [0u32; PIECES];
        let mut highest = 0;
        for i in 0..128_000 {
            let positions = Positions::of("c", &format!("k{i}"));
            per_piece[positions.piece()] += 1;
            highest = highest.max(*positions.bits.iter().max().unwrap());
        }
        // A thousand a piece, give or take a few standard deviations (about 32).
        assert!(
            per_piece.iter().all(|n| (850..1150).contains(n)),
            "{per_piece:?}"
        );
        assert_eq!(usize::from(highest), PIECE_BITS - 1);
    }

    #[test]
    fn merged_pieces_hold_the_keys_of_both() {
        let (one, two) = (Positions::of("c", "one"), Positions::of("c", "two"));
        let (mut first, mut second) = (Piece::default(), Piece::default());
        first.insert(&one);
        second.insert(&two);
        first.merge(&second);
        assert!(first.contains(&one) && first.contains(&two));
    }

    #[test]
    fn the_false_positive_rate_follows_the_keys_held() {
        assert_eq!(false_positive(0), 0.0);
        assert!(false_positive(3) < 1e-40);
        let at_capacity = false_positive(CAPACITY / PIECES as u64);
        assert!((1e-7..3e-7).contains(&at_capacity), "{at_capacity}");
    }
}

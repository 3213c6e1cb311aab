//! Content fingerprints: telling a redelivery from a reused key.

use std::fmt;

use serde::Serialize;
use sha2::{Digest, Sha256};

mod canonical;

/// A SHA-256 hash of a message's content.
///
/// Two deliveries with the same key and the same fingerprint are the same message; the same key
/// with a different fingerprint is a reused key or a changed message, refused with
/// [`Error::FingerprintMismatch`](crate::Error::FingerprintMismatch).
///
/// # The canonical form
///
/// [`Fingerprint::of_json`] hashes a message *as received*, and [`Fingerprint::of`] a value by
/// its JSON serialization, in one canonical form, so that changes a serde user considers
/// compatible leave a fingerprint unchanged:
///
/// - object members are sorted by name, so field order (a `HashMap`, another producer) does not
///   count;
/// - members whose value is `null` are left out, so an added `Option` field that is `None`, or a
///   field a newer producer sends as `null`, does not count;
/// - strings are compared by their characters, not their escapes (`"\u0041"` is `"A"`);
/// - numbers are compared as written, at any size (`u128` and `i128` included): `10` and `1e1`
///   differ, and so do `1` and `1.0`.
///
/// Everything else is content: a member added with a value, a value changed, array order. A
/// transport fingerprints the payload as received ([`Metadata::payload_fingerprint`]), so a
/// field added to the message type with `#[serde(default)]` does not change the fingerprint of
/// messages produced before it existed; a message processed without a transport is fingerprinted
/// by its serialization, where such a field appears with its default value.
///
/// [`Metadata::payload_fingerprint`]: crate::Metadata::payload_fingerprint
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

/// The message could not be fingerprinted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FingerprintError {
    /// The value does not serialize as JSON (a map with keys that are not strings or numbers, a
    /// `Serialize` implementation that fails).
    #[error("cannot fingerprint the message: {0}")]
    Serialize(#[source] serde_json::Error),
    /// The payload is not JSON.
    #[error("cannot fingerprint the payload: {0}")]
    NotJson(String),
}

impl Fingerprint {
    /// Fingerprints a serializable value by its canonical JSON form.
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use idem_runtime::fingerprint::Fingerprint;
    /// let a: HashMap<_, _> = [("x", 1), ("y", 2)].into();
    /// let b: HashMap<_, _> = [("y", 2), ("x", 1)].into();
    /// assert_eq!(Fingerprint::of(&a).unwrap(), Fingerprint::of(&b).unwrap());
    /// ```
    pub fn of<T: Serialize + ?Sized>(value: &T) -> Result<Self, FingerprintError> {
        let json = serde_json::to_vec(value).map_err(FingerprintError::Serialize)?;
        Self::of_json(&json)
    }

    /// Fingerprints a JSON document as received, by its canonical form.
    ///
    /// ```
    /// use idem_runtime::fingerprint::Fingerprint;
    /// let v1 = Fingerprint::of_json(br#"{"id":"o-1","amount":5}"#).unwrap();
    /// let v2 = Fingerprint::of_json(br#"{ "amount": 5, "note": null, "id": "o-1" }"#).unwrap();
    /// assert_eq!(v1, v2);
    /// ```
    pub fn of_json(json: &[u8]) -> Result<Self, FingerprintError> {
        let mut hasher = Sha256::new();
        canonical::write(json, &mut hasher).map_err(FingerprintError::NotJson)?;
        Ok(Self(hasher.finalize().into()))
    }

    /// Fingerprints raw bytes (a payload as received), without interpreting them.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }

    /// The 32 bytes of the hash, as stored in the inbox.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A fingerprint from the 32 bytes [`Fingerprint::as_bytes`] gives; `None` for any other
    /// length.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    /// Reads the lowercase hexadecimal form written by [`Fingerprint::to_hex`].
    pub fn from_hex(hex: &str) -> Option<Self> {
        if hex.len() != 64 {
            return None;
        }
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
            let pair = std::str::from_utf8(pair).ok()?;
            *byte = u8::from_str_radix(pair, 16).ok()?;
        }
        Some(Self(bytes))
    }

    /// The fingerprint as 64 lowercase hexadecimal digits.
    pub fn to_hex(&self) -> String {
        use fmt::Write;
        let mut hex = String::with_capacity(64);
        for byte in self.0 {
            let _ = write!(hex, "{byte:02x}");
        }
        hex
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", &self.to_hex()[..16])
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn key_order_does_not_matter() {
        let a = json!({"b": 1, "a": {"y": [1, 2], "x": null}});
        let b: Value = serde_json::from_str(r#"{"a":{"x":null,"y":[1,2]},"b":1}"#).unwrap();
        assert_eq!(Fingerprint::of(&a).unwrap(), Fingerprint::of(&b).unwrap());
    }

    #[test]
    fn content_changes_the_fingerprint() {
        let a = Fingerprint::of(&json!({"amount": 10})).unwrap();
        let b = Fingerprint::of(&json!({"amount": 11})).unwrap();
        assert_ne!(a, b);
        // Array order is content.
        assert_ne!(
            Fingerprint::of(&json!([1, 2])).unwrap(),
            Fingerprint::of(&json!([2, 1])).unwrap()
        );
    }

    #[test]
    fn stable_across_runs() {
        // A fixed value whose hash must never change: stored fingerprints outlive the process.
        let fp = Fingerprint::of(&json!({"id": "o-1", "amount": 5})).unwrap();
        assert_eq!(
            fp.to_hex(),
            hex_sha256(br#"{"amount":5,"id":"o-1"}"#),
            "canonical form is sorted, compact JSON"
        );
        assert_eq!(Fingerprint::from_hex(&fp.to_hex()), Some(fp));
        assert_eq!(Fingerprint::from_hex("zz"), None);
    }

    #[test]
    fn integers_beyond_64_bits_fingerprint() {
        #[derive(Serialize)]
        struct Transfer {
            id: u128,
            delta: i128,
        }
        let big = Fingerprint::of(&Transfer {
            id: u128::MAX,
            delta: i128::MIN,
        })
        .unwrap();
        let other = Fingerprint::of(&Transfer {
            id: u128::MAX - 1,
            delta: i128::MIN,
        })
        .unwrap();
        assert_ne!(big, other);
        let received = format!(r#"{{"delta":{},"id":{}}}"#, i128::MIN, u128::MAX);
        assert_eq!(Fingerprint::of_json(received.as_bytes()).unwrap(), big);
    }

    #[test]
    fn compatible_changes_keep_the_fingerprint() {
        let v1 = Fingerprint::of_json(br#"{"id":"o-1","lines":[{"sku":"a","qty":1}]}"#).unwrap();
        for same in [
            r#"{"lines":[{"qty":1,"sku":"a"}],"id":"o-1"}"#,
            r#"{"id":"o-1","note":null,"lines":[{"sku":"a","qty":1,"gift":null}]}"#,
            "{ \"id\" : \"o-\\u0031\", \"lines\" : [ { \"sku\" : \"a\", \"qty\" : 1 } ] }\n",
        ] {
            assert_eq!(Fingerprint::of_json(same.as_bytes()).unwrap(), v1, "{same}");
        }
        for changed in [
            r#"{"id":"o-1","lines":[{"sku":"a","qty":2}]}"#,
            r#"{"id":"o-1","lines":[{"sku":"a","qty":1}],"note":"gift"}"#,
            r#"{"id":"o-1","lines":[]}"#,
            r#"{"id":"o-1","lines":[{"sku":"a","qty":1},null]}"#,
        ] {
            assert_ne!(
                Fingerprint::of_json(changed.as_bytes()).unwrap(),
                v1,
                "{changed}"
            );
        }
        assert!(Fingerprint::of_json(b"{not json").is_err());
        assert!(Fingerprint::of_json(b"[1] 2").is_err());
    }

    #[test]
    fn a_value_and_its_json_fingerprint_alike() {
        let value: Value = json!({"b": [1, "x", {"z": null, "y": true}], "a": -2.5e3});
        let text = serde_json::to_vec(&value).unwrap();
        assert_eq!(
            Fingerprint::of(&value).unwrap(),
            Fingerprint::of_json(&text).unwrap()
        );
    }

    fn hex_sha256(bytes: &[u8]) -> String {
        Fingerprint::of_bytes(bytes).to_hex()
    }
}

//! Content fingerprints: telling a redelivery from a reused key.

use std::fmt;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// A SHA-256 hash of a message's content.
///
/// Two deliveries with the same key and the same fingerprint are the same message; the same key
/// with a different fingerprint is a reused key or a changed message, refused with
/// [`Error::FingerprintMismatch`](crate::Error::FingerprintMismatch).
///
/// [`Fingerprint::of`] hashes a canonical JSON form of the value: object keys are sorted, so a
/// `HashMap` field or a producer that orders fields differently gives the same fingerprint in
/// every process and every run.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

/// The message could not be turned into JSON for fingerprinting.
#[derive(Debug, thiserror::Error)]
#[error("cannot fingerprint the message: {0}")]
pub struct FingerprintError(#[source] serde_json::Error);

impl Fingerprint {
    /// Fingerprints a serializable value by its canonical JSON form.
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use idem_runtime::Fingerprint;
    /// let a: HashMap<_, _> = [("x", 1), ("y", 2)].into();
    /// let b: HashMap<_, _> = [("y", 2), ("x", 1)].into();
    /// assert_eq!(Fingerprint::of(&a).unwrap(), Fingerprint::of(&b).unwrap());
    /// ```
    pub fn of<T: Serialize + ?Sized>(value: &T) -> Result<Self, FingerprintError> {
        let value = serde_json::to_value(value).map_err(FingerprintError)?;
        let mut hasher = Sha256::new();
        write_canonical(&value, &mut hasher);
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

/// Feeds `value` to the hasher as JSON with object keys in sorted order, whatever order the map
/// holds them in (serde_json keeps insertion order when its `preserve_order` feature is on).
fn write_canonical(value: &Value, out: &mut Sha256) {
    match value {
        Value::Null => out.update(b"null"),
        Value::Bool(b) => out.update(if *b { &b"true"[..] } else { &b"false"[..] }),
        Value::Number(n) => out.update(n.to_string().as_bytes()),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.update(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.update(b",");
                }
                write_canonical(item, out);
            }
            out.update(b"]");
        }
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.update(b"{");
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.update(b",");
                }
                write_string(key, out);
                out.update(b":");
                write_canonical(item, out);
            }
            out.update(b"}");
        }
    }
}

fn write_string(s: &str, out: &mut Sha256) {
    // Serializing a `str` cannot fail.
    let quoted = serde_json::to_string(s).unwrap_or_default();
    out.update(quoted.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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

    fn hex_sha256(bytes: &[u8]) -> String {
        Fingerprint::of_bytes(bytes).to_hex()
    }
}

//! The `Idempotency-Key` header: a structured-field string (RFC 8941, section 3.3.3), and the
//! inbox key a request's key is kept under.

use http::HeaderMap;
use idem_runtime::fingerprint::Fingerprint;
use idem_runtime::{KeyError, MessageKey};

use crate::sf;

/// The header's name, as the draft spells it.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The longest key accepted, in bytes once unquoted.
pub const MAX_KEY_LEN: usize = 255;

/// Why a request's `Idempotency-Key` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// The request has no `Idempotency-Key`.
    #[error("the request has no Idempotency-Key header")]
    Missing,
    /// The header is there but is not one structured-field string (parameters allowed) of 1
    /// to [`MAX_KEY_LEN`] bytes.
    #[error("the Idempotency-Key header is malformed: {0}")]
    Malformed(&'static str),
}

/// The key a request carries: the header's one value, parsed as a structured-field string
/// (`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, quotes included; `\"` and `\\` escape).
/// Parameters (`"k";v=1`) are accepted, as RFC 8941 allows them on any item, and ignored: the
/// key is the string.
///
/// ```
/// use http::HeaderMap;
/// use idem_http::{HeaderError, request_key};
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(request_key(&headers), Err(HeaderError::Missing));
/// headers.insert("idempotency-key", r#""a\"b""#.parse().unwrap());
/// assert_eq!(request_key(&headers).unwrap(), r#"a"b"#);
/// headers.insert("idempotency-key", r#""k-1";v=2"#.parse().unwrap());
/// assert_eq!(request_key(&headers).unwrap(), "k-1");
/// headers.insert("idempotency-key", "unquoted".parse().unwrap());
/// assert!(matches!(request_key(&headers), Err(HeaderError::Malformed(_))));
/// ```
pub fn request_key(headers: &HeaderMap) -> Result<String, HeaderError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let value = values.next().ok_or(HeaderError::Missing)?;
    if values.next().is_some() {
        return Err(HeaderError::Malformed("it is given more than once"));
    }
    let key = sf::string_item(value.as_bytes()).map_err(HeaderError::Malformed)?;
    if key.is_empty() {
        return Err(HeaderError::Malformed("the key is empty"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(HeaderError::Malformed("the key is longer than 255 bytes"));
    }
    Ok(key)
}

/// The inbox key under which a request's `key` (unquoted) is kept, for `principal` (what
/// [`Principal::of`](crate::Principal::of) tells of the request: `None` for an anonymous
/// request, or for every request with [`Principal::shared`](crate::Principal::shared)). Keys
/// are scoped per principal only: the same key sent with another method, to another path or
/// with another body is the same key reused, refused with 422. It reads
/// `<principal's length>:<principal><key>`, or `-:<key>` without a principal; one longer than
/// [`MessageKey::MAX_LEN`] is replaced by its SHA-256 (`sha256:<hex>`).
///
/// For operators (`idem` looks a record up by it) and for what derives from a request: the
/// events a transactional endpoint stages get the ids
/// [`derived_id`](idem_runtime::outbox::derived_id) gives for this key under the guard's consumer.
///
/// ```
/// let key = idem_http::message_key(None, "k-1").unwrap();
/// assert_eq!(key.as_str(), "-:k-1");
/// let key = idem_http::message_key(Some("ada"), "k-1").unwrap();
/// assert_eq!(key.as_str(), "3:adak-1");
/// ```
pub fn message_key(principal: Option<&str>, key: &str) -> Result<MessageKey, KeyError> {
    let scoped = match principal {
        Some(principal) => format!("{}:{principal}{key}", principal.len()),
        None => format!("-:{key}"),
    };
    if scoped.len() <= MessageKey::MAX_LEN {
        MessageKey::new(scoped)
    } else {
        MessageKey::new(format!(
            "sha256:{}",
            Fingerprint::of_bytes(scoped.as_bytes()).to_hex()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(raw: &str) -> Result<String, HeaderError> {
        let mut headers = HeaderMap::new();
        let value = http::HeaderValue::from_bytes(raw.as_bytes()).unwrap();
        headers.insert(IDEMPOTENCY_KEY, value);
        request_key(&headers)
    }

    #[test]
    fn structured_field_strings_are_read_and_anything_else_refused() {
        assert_eq!(parsed(r#" "k-1" "#).unwrap(), "k-1");
        assert_eq!(parsed(r#""a\\b""#).unwrap(), r"a\b");
        assert_eq!(parsed(r#""k";p=1"#).unwrap(), "k");
        for bad in [
            r#""""#,
            r#""";p=1"#,
            "k-1",
            r#""open"#,
            r#""a"b"#,
            r#""a\nb""#,
            r#""k";P=1"#,
            "\"é\"",
        ] {
            assert!(
                matches!(parsed(bad), Err(HeaderError::Malformed(_))),
                "{bad}"
            );
        }
        assert!(parsed(&format!("\"{}\"", "k".repeat(MAX_KEY_LEN))).is_ok());
        assert!(parsed(&format!("\"{}\"", "k".repeat(MAX_KEY_LEN + 1))).is_err());
    }

    #[test]
    fn two_values_are_malformed() {
        let mut headers = HeaderMap::new();
        headers.append(IDEMPOTENCY_KEY, "\"a\"".parse().unwrap());
        headers.append(IDEMPOTENCY_KEY, "\"b\"".parse().unwrap());
        assert!(matches!(
            request_key(&headers),
            Err(HeaderError::Malformed(_))
        ));
    }

    #[test]
    fn principals_keep_keys_apart() {
        let one = message_key(Some("a:b"), "c").unwrap();
        let two = message_key(Some("a"), "b:c").unwrap();
        assert_ne!(one, two);
        let anonymous = message_key(None, "k").unwrap();
        assert_ne!(anonymous, message_key(Some(""), "k").unwrap());
        assert_ne!(anonymous, message_key(Some("-"), "k").unwrap());
        let long = message_key(Some(&"p".repeat(200)), &"k".repeat(200)).unwrap();
        assert!(long.as_str().starts_with("sha256:"));
    }
}

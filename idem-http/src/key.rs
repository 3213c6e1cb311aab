//! The `Idempotency-Key` header: a structured-field string (RFC 8941, section 3.3.3), and the
//! inbox key a request's key is scoped to.

use http::HeaderMap;
use http::request::Parts;
use idem_runtime::{Fingerprint, KeyError, MessageKey};

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
    /// The header is there but is not one structured-field string of 1 to
    /// [`MAX_KEY_LEN`] bytes.
    #[error("the Idempotency-Key header is malformed: {0}")]
    Malformed(&'static str),
}

/// The key a request carries: the header's one value, parsed as a structured-field string
/// (`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, quotes included; `\"` and `\\` escape).
/// Parameters are not accepted.
///
/// ```
/// use http::HeaderMap;
/// use idem_http::{HeaderError, request_key};
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(request_key(&headers), Err(HeaderError::Missing));
/// headers.insert("idempotency-key", r#""a\"b""#.parse().unwrap());
/// assert_eq!(request_key(&headers).unwrap(), r#"a"b"#);
/// headers.insert("idempotency-key", "unquoted".parse().unwrap());
/// assert!(matches!(request_key(&headers), Err(HeaderError::Malformed(_))));
/// ```
pub fn request_key(headers: &HeaderMap) -> Result<String, HeaderError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let value = values.next().ok_or(HeaderError::Missing)?;
    if values.next().is_some() {
        return Err(HeaderError::Malformed("it is given more than once"));
    }
    let key = parse_sf_string(value.as_bytes())?;
    if key.is_empty() {
        return Err(HeaderError::Malformed("the key is empty"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(HeaderError::Malformed("the key is longer than 255 bytes"));
    }
    Ok(key)
}

/// Parses a structured-field string item without parameters, surrounding spaces allowed.
fn parse_sf_string(raw: &[u8]) -> Result<String, HeaderError> {
    let trimmed = raw.trim_ascii();
    let Some(rest) = trimmed.strip_prefix(b"\"") else {
        return Err(HeaderError::Malformed("it is not a quoted string"));
    };
    let mut key = String::with_capacity(rest.len());
    let mut bytes = rest.iter();
    while let Some(&byte) = bytes.next() {
        match byte {
            b'"' => {
                return if bytes.as_slice().is_empty() {
                    Ok(key)
                } else {
                    Err(HeaderError::Malformed(
                        "something follows the quoted string",
                    ))
                };
            }
            b'\\' => match bytes.next() {
                Some(&escaped @ (b'"' | b'\\')) => key.push(char::from(escaped)),
                _ => return Err(HeaderError::Malformed("a backslash escapes only \" and \\")),
            },
            0x20..=0x7e => key.push(char::from(byte)),
            _ => {
                return Err(HeaderError::Malformed(
                    "it holds a character outside printable ASCII",
                ));
            }
        }
    }
    Err(HeaderError::Malformed("the quoted string is not closed"))
}

/// The inbox key under which a request's `key` (unquoted) is kept: the key sent with `method`
/// to the route `scope` (its path, unless [`Idempotency::scope`](crate::Idempotency::scope)
/// says otherwise) by `principal` (`None` without
/// [`Idempotency::principal`](crate::Idempotency::principal), or when it tells none). Keys are
/// scoped per route and principal, so the same key on another route or from another principal
/// is another request. It reads `METHOD scope#<principal's length>:<principal><key>`, or
/// `METHOD scope#-:<key>` without a principal; one longer than [`MessageKey::MAX_LEN`] is
/// replaced by its SHA-256 (`sha256:<hex>`).
///
/// For operators (`idem` looks a record up by it) and for what derives from a request: the
/// events a transactional endpoint stages get the ids
/// [`derived_id`](idem_runtime::derived_id) gives for this key under the guard's consumer.
///
/// ```
/// let key = idem_http::message_key("POST", "/orders", None, "k-1").unwrap();
/// assert_eq!(key.as_str(), "POST /orders#-:k-1");
/// let key = idem_http::message_key("POST", "/orders", Some("ada"), "k-1").unwrap();
/// assert_eq!(key.as_str(), "POST /orders#3:adak-1");
/// ```
pub fn message_key(
    method: &str,
    scope: &str,
    principal: Option<&str>,
    key: &str,
) -> Result<MessageKey, KeyError> {
    let principal = match principal {
        Some(principal) => format!("{}:{principal}", principal.len()),
        None => "-:".to_owned(),
    };
    let scoped = format!("{method} {scope}#{principal}{key}");
    if scoped.len() <= MessageKey::MAX_LEN {
        MessageKey::new(scoped)
    } else {
        MessageKey::new(format!(
            "sha256:{}",
            Fingerprint::of_bytes(scoped.as_bytes()).to_hex()
        ))
    }
}

/// [`message_key`] of a request to `scope`.
pub(crate) fn scoped(
    parts: &Parts,
    scope: &str,
    principal: Option<&str>,
    key: &str,
) -> Result<MessageKey, KeyError> {
    message_key(parts.method.as_str(), scope, principal, key)
}

/// What makes two requests with one key "the same request": the method, the path with its
/// query, and the body, byte for byte.
pub(crate) fn request_fingerprint(parts: &Parts, body: &[u8]) -> Fingerprint {
    let target = parts
        .uri
        .path_and_query()
        .map_or("/", |target| target.as_str());
    let mut input = Vec::with_capacity(target.len() + body.len() + 16);
    input.extend_from_slice(parts.method.as_str().as_bytes());
    input.push(0);
    input.extend_from_slice(target.as_bytes());
    input.push(0);
    input.extend_from_slice(body);
    Fingerprint::of_bytes(&input)
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
        for bad in [
            r#""""#,
            "k-1",
            r#""open"#,
            r#""a"b"#,
            r#""a\nb""#,
            r#""k";p=1"#,
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
    fn scopes_keep_principals_and_routes_apart() {
        let parts = |uri: &str| http::Request::post(uri).body(()).unwrap().into_parts().0;
        let orders = parts("/orders");
        let one = scoped(&orders, "/orders", Some("a:b"), "c").unwrap();
        let two = scoped(&orders, "/orders", Some("a"), "b:c").unwrap();
        assert_ne!(one, two);
        let anonymous = scoped(&orders, "/orders", None, "k").unwrap();
        assert_ne!(
            anonymous,
            scoped(&orders, "/orders", Some(""), "k").unwrap()
        );
        assert_ne!(scoped(&orders, "/refunds", None, "k").unwrap(), anonymous);
        let long = scoped(&orders, "/orders", Some(&"p".repeat(200)), &"k".repeat(200)).unwrap();
        assert!(long.as_str().starts_with("sha256:"));
    }
}

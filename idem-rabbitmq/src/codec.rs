//! Payload decoding: JSON by default, swappable per binding.

use idem_runtime::fingerprint::Fingerprint;
use serde::de::DeserializeOwned;

/// Why a payload could not be decoded. The delivery is dead-lettered with this text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The delivery's `content_type` is not one the codec reads.
    #[error("unsupported content type {0:?}")]
    UnsupportedContentType(String),
    /// The payload does not parse as the handler's message type.
    #[error("malformed payload: {0}")]
    Malformed(String),
}

/// Turns payload bytes into a handler's message.
pub trait Codec: Send + Sync + 'static {
    /// Decodes `payload`, checking `content_type` when the producer set one.
    fn decode<M: DeserializeOwned>(
        &self,
        content_type: Option<&str>,
        payload: &[u8],
    ) -> Result<M, DecodeError>;

    /// The fingerprint of a payload this codec decoded, by the content it carries: two payloads
    /// that decode to the same message under every version of its type should fingerprint
    /// alike. By default the bytes themselves.
    fn fingerprint(&self, content_type: Option<&str>, payload: &[u8]) -> Option<Fingerprint> {
        let _ = content_type;
        Some(Fingerprint::of_bytes(payload))
    }
}

/// JSON, the default codec. Accepts no content type, `application/json`, `text/json` and any
/// `+json` type (`application/vnd.acme.order+json`), parameters such as `charset` aside.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl Json {
    fn accepts(content_type: &str) -> bool {
        let essence = content_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        essence == "application/json" || essence == "text/json" || essence.ends_with("+json")
    }
}

impl Codec for Json {
    fn decode<M: DeserializeOwned>(
        &self,
        content_type: Option<&str>,
        payload: &[u8],
    ) -> Result<M, DecodeError> {
        if let Some(content_type) = content_type.filter(|ct| !ct.is_empty())
            && !Self::accepts(content_type)
        {
            return Err(DecodeError::UnsupportedContentType(content_type.to_owned()));
        }
        serde_json::from_slice(payload).map_err(|e| DecodeError::Malformed(e.to_string()))
    }

    /// The canonical form of the JSON document ([`Fingerprint::of_json`]): field order, `null`
    /// members and escapes do not count, so messages from an older producer fingerprint as
    /// before when the message type gains a defaulted or optional field.
    fn fingerprint(&self, _: Option<&str>, payload: &[u8]) -> Option<Fingerprint> {
        Fingerprint::of_json(payload).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_checks_the_content_type_when_present() {
        let ok: Result<Vec<u8>, _> = Json.decode(Some("application/json; charset=utf-8"), b"[1]");
        assert_eq!(ok.unwrap(), vec![1]);
        let vendor: Result<Vec<u8>, _> = Json.decode(Some("application/vnd.x+json"), b"[]");
        assert!(vendor.is_ok());
        let none: Result<Vec<u8>, _> = Json.decode(None, b"[2]");
        assert!(none.is_ok());
        let xml: Result<Vec<u8>, _> = Json.decode(Some("application/xml"), b"<a/>");
        assert!(matches!(xml, Err(DecodeError::UnsupportedContentType(_))));
        let bad: Result<Vec<u8>, _> = Json.decode(Some("application/json"), b"{not json");
        assert!(matches!(bad, Err(DecodeError::Malformed(_))));
    }
}

//! A completed request's response as the inbox record keeps it: its status, the headers chosen
//! for replay, and its body.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use serde::{Deserialize, Serialize};

/// The response a request completed with: the record's output, and what a retry gets back.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StoredResponse {
    status: u16,
    /// The replayed headers, by name, in order.
    headers: Vec<(String, StoredValue)>,
    /// The body, in base64 (the record's output is JSON text).
    body: String,
    /// Every header of the response as the endpoint made it, for the request that ran it; a
    /// replay has the chosen ones only.
    #[serde(skip)]
    sent_headers: Option<HeaderMap>,
}

impl StoredResponse {
    /// `response`, keeping the headers named in `replayed` for replays.
    pub(crate) fn new(response: Response<Bytes>, replayed: &[HeaderName]) -> Self {
        let (parts, body) = response.into_parts();
        let headers = replayed
            .iter()
            .flat_map(|name| {
                let values = parts.headers.get_all(name).iter();
                values.map(move |value| (name.to_string(), StoredValue::of(value)))
            })
            .collect();
        Self {
            status: parts.status.as_u16(),
            headers,
            body: base64::encode(&body),
            sent_headers: Some(parts.headers),
        }
    }

    /// The response to send: as made for the request that ran it, the stored one for a replay.
    /// `None` when the record no longer reads as a response (changed by hand).
    pub(crate) fn into_response(self) -> Option<Response<Bytes>> {
        let body = base64::decode(&self.body)?;
        let mut response = Response::new(Bytes::from(body));
        *response.status_mut() = StatusCode::from_u16(self.status).ok()?;
        match self.sent_headers {
            Some(headers) => *response.headers_mut() = headers,
            None => {
                for (name, value) in self.headers {
                    let name = HeaderName::try_from(name).ok()?;
                    response.headers_mut().append(name, value.into_value()?);
                }
            }
        }
        Some(response)
    }
}

/// A replayed header's value: its text, or its bytes when they are not UTF-8 (a value may
/// hold any byte from 0x80 up, as obs-text).
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum StoredValue {
    Text(String),
    Bytes {
        /// The value's bytes, in base64.
        base64: String,
    },
}

impl StoredValue {
    fn of(value: &HeaderValue) -> Self {
        match std::str::from_utf8(value.as_bytes()) {
            Ok(text) => Self::Text(text.to_owned()),
            Err(_) => Self::Bytes {
                base64: base64::encode(value.as_bytes()),
            },
        }
    }

    /// The value; `None` when the record no longer reads as one (changed by hand).
    fn into_value(self) -> Option<HeaderValue> {
        match self {
            Self::Text(text) => HeaderValue::try_from(text).ok(),
            Self::Bytes { base64 } => HeaderValue::from_bytes(&base64::decode(&base64)?).ok(),
        }
    }
}

/// Standard base64 with padding (RFC 4648, section 4).
mod base64 {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub(super) fn encode(bytes: &[u8]) -> String {
        let mut text = String::with_capacity(bytes.len().div_ceil(3) * 4);
        for chunk in bytes.chunks(3) {
            let word = chunk.iter().enumerate().fold(0u32, |word, (i, &byte)| {
                word | u32::from(byte) << (16 - 8 * i)
            });
            for i in 0..4 {
                if i <= chunk.len() {
                    text.push(char::from(ALPHABET[(word >> (18 - 6 * i)) as usize & 63]));
                } else {
                    text.push('=');
                }
            }
        }
        text
    }

    pub(super) fn decode(text: &str) -> Option<Vec<u8>> {
        let text = text.as_bytes();
        if !text.len().is_multiple_of(4) {
            return None;
        }
        let mut bytes = Vec::with_capacity(text.len() / 4 * 3);
        for chunk in text.chunks(4) {
            let padding = chunk.iter().rev().take_while(|&&c| c == b'=').count();
            if padding > 2 {
                return None;
            }
            let mut word = 0u32;
            for (i, &c) in chunk[..4 - padding].iter().enumerate() {
                let value = ALPHABET.iter().position(|&a| a == c)? as u32;
                word |= value << (18 - 6 * i);
            }
            let word = word.to_be_bytes();
            bytes.extend_from_slice(&word[1..4 - padding]);
        }
        Some(bytes)
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn round_trips_every_length_and_reads_the_rfc_vectors() {
            for (plain, coded) in [
                ("", ""),
                ("f", "Zg=="),
                ("fo", "Zm8="),
                ("foo", "Zm9v"),
                ("foobar", "Zm9vYmFy"),
            ] {
                assert_eq!(super::encode(plain.as_bytes()), coded);
                assert_eq!(super::decode(coded).unwrap(), plain.as_bytes());
            }
            let all: Vec<u8> = (0..=255).collect();
            for len in 0..all.len() {
                assert_eq!(
                    super::decode(&super::encode(&all[..len])).unwrap(),
                    &all[..len]
                );
            }
            assert!(super::decode("Zg=").is_none());
            assert!(super::decode("Z===").is_none());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replayed(response: Response<Bytes>, names: &[&'static str]) -> Response<Bytes> {
        let names: Vec<_> = names
            .iter()
            .map(|name| HeaderName::from_static(name))
            .collect();
        let json = serde_json::to_string(&StoredResponse::new(response, &names)).unwrap();
        let stored: StoredResponse = serde_json::from_str(&json).unwrap();
        stored.into_response().expect("a response")
    }

    #[test]
    fn header_values_are_replayed_byte_for_byte() {
        let response = Response::builder()
            .header("x-label", HeaderValue::from_bytes(b"caf\xe9").unwrap())
            .header("x-label", "plain")
            .header("x-other", "not replayed")
            .body(Bytes::from_static(b"body"))
            .unwrap();
        let replay = replayed(response, &["x-label"]);
        let labels: Vec<_> = replay.headers().get_all("x-label").iter().collect();
        assert_eq!(labels, [&b"caf\xe9"[..], b"plain"]);
        assert!(!replay.headers().contains_key("x-other"));
        assert_eq!(replay.body().as_ref(), b"body");
    }

    #[test]
    fn records_of_text_headers_read_as_before() {
        let json = r#"{"status":201,"headers":[["location","/orders/1"]],"body":"Ym9keQ=="}"#;
        let stored: StoredResponse = serde_json::from_str(json).unwrap();
        let response = stored.into_response().unwrap();
        assert_eq!(response.headers()["location"], "/orders/1");
    }
}

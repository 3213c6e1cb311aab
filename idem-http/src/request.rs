//! What makes two requests with one key the same request: the method, the target (the full
//! path, normalised, and the query) and the body.

use http::Uri;
use http::request::Parts;
use idem_runtime::fingerprint::Fingerprint;

/// How request bodies are compared, to tell a retry from a key reused for another request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum BodyComparison {
    /// Byte for byte: a body sent again with other spacing is another request (422).
    #[default]
    Bytes,
    /// As JSON documents, in the canonical form idem fingerprints messages with
    /// ([`Fingerprint::of_json`]): spacing, member order and string escapes do not count, nor
    /// do members whose value is `null` (`{"a":null}` is `{}`); numbers count as written (`1`
    /// and `1.0` differ). A body that is not JSON is compared byte for byte.
    Json,
}

/// The fingerprint of a request: its method, its [`target`] and its body.
pub(crate) fn fingerprint(parts: &Parts, body: &[u8], comparison: BodyComparison) -> Fingerprint {
    let json = match comparison {
        BodyComparison::Json => Fingerprint::of_json(body).ok(),
        BodyComparison::Bytes => None,
    };
    let (kind, body) = match json {
        Some(json) => ("json", json),
        None => ("bytes", Fingerprint::of_bytes(body)),
    };
    let target = target(parts);
    let mut input = Vec::with_capacity(target.len() + 64);
    for part in [parts.method.as_str(), &target, kind] {
        input.extend_from_slice(part.as_bytes());
        input.push(0);
    }
    input.extend_from_slice(body.as_bytes());
    Fingerprint::of_bytes(&input)
}

/// The request's target as the client sent it, normalised: the full path (under axum's
/// `Router::nest`, from the `OriginalUri` axum keeps, with the feature `axum`), its unreserved
/// characters decoded and its dot segments removed (RFC 3986, section 6.2.2), then the query,
/// its unreserved characters decoded.
pub(crate) fn target(parts: &Parts) -> String {
    let uri = original_uri(parts);
    let mut target = remove_dot_segments(&decode_unreserved(uri.path()));
    if target.is_empty() {
        target.push('/');
    }
    if let Some(query) = uri.query() {
        target.push('?');
        target.push_str(&decode_unreserved(query));
    }
    target
}

/// The URI the request arrived with, before a router rewrote it.
fn original_uri(parts: &Parts) -> &Uri {
    #[cfg(feature = "axum")]
    if let Some(axum::extract::OriginalUri(uri)) = parts.extensions.get() {
        return uri;
    }
    &parts.uri
}

/// `text` with its percent-encoded unreserved characters (letters, digits, `-`, `.`, `_`, `~`)
/// decoded and every other percent-encoding's hexadecimal digits in upper case (RFC 3986,
/// sections 6.2.2.1 and 6.2.2.2).
fn decode_unreserved(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = String::with_capacity(text.len());
    let mut at = 0;
    while at < bytes.len() {
        let encoded = (bytes[at] == b'%')
            .then(|| bytes.get(at + 1..at + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok());
        match encoded {
            Some(byte) if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) => {
                decoded.push(char::from(byte));
                at += 3;
            }
            Some(byte) => {
                decoded.push_str(&format!("%{byte:02X}"));
                at += 3;
            }
            None => {
                // The URI parser let through only ASCII: one byte, one character.
                decoded.push(char::from(bytes[at]));
                at += 1;
            }
        }
    }
    decoded
}

/// `path` without its `.` and `..` segments (RFC 3986, section 5.2.4).
fn remove_dot_segments(path: &str) -> String {
    let mut input = path;
    let mut output: Vec<&str> = Vec::new();
    while !input.is_empty() {
        if let Some(rest) = input.strip_prefix("../") {
            input = rest;
        } else if let Some(rest) = input.strip_prefix("./") {
            input = rest;
        } else if input.starts_with("/./") {
            input = &input[2..];
        } else if input == "/." {
            input = "/";
        } else if input.starts_with("/../") || input == "/.." {
            input = if input == "/.." { "/" } else { &input[3..] };
            output.pop();
        } else if input == "." || input == ".." {
            input = "";
        } else {
            // The first segment, with its leading slash, up to the next slash.
            let end = (input.char_indices().skip(1))
                .find(|&(_, c)| c == '/')
                .map_or(input.len(), |(slash, _)| slash);
            output.push(&input[..end]);
            input = &input[end..];
        }
    }
    output.concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target_of(uri: &str) -> String {
        target(&http::Request::post(uri).body(()).unwrap().into_parts().0)
    }

    #[test]
    fn spellings_of_one_path_are_one_target() {
        for spelling in [
            "/accounts/acct/charges",
            "/accounts/%61cct/charges",
            "/accounts/%61%63%63%74/charges",
            "/accounts/x/../acct/charges",
            "/accounts/./acct/charges",
            "/accounts/acct/./charges",
            "/../accounts/acct/charges",
        ] {
            assert_eq!(target_of(spelling), "/accounts/acct/charges", "{spelling}");
        }
        assert_eq!(
            target_of("/a%2fb"),
            "/a%2Fb",
            "a reserved character stays encoded"
        );
        assert_ne!(target_of("/a%2Fb"), target_of("/a/b"));
        assert_eq!(target_of("/a/..").as_str(), "/");
        assert_eq!(target_of("/p?x=%7e&y=1"), "/p?x=~&y=1");
        assert_ne!(target_of("/p?y=1"), target_of("/p?y=2"));
        assert_eq!(target_of("http://example.com"), "/");
    }

    #[test]
    fn dot_segments_are_removed_as_rfc_3986_says() {
        // RFC 3986, section 5.2.4's examples.
        assert_eq!(remove_dot_segments("/a/b/c/./../../g"), "/a/g");
        assert_eq!(remove_dot_segments("mid/content=5/../6"), "mid/6");
    }

    #[test]
    fn the_method_the_target_and_the_body_make_the_request() {
        let parts = |method: &str, uri: &str| {
            http::Request::builder()
                .method(method)
                .uri(uri)
                .body(())
                .unwrap()
                .into_parts()
                .0
        };
        let post = parts("POST", "/orders");
        let bytes = |body: &[u8]| fingerprint(&post, body, BodyComparison::Bytes);
        let json = |body: &[u8]| fingerprint(&post, body, BodyComparison::Json);
        assert_eq!(bytes(b"{}"), bytes(b"{}"));
        assert_ne!(bytes(br#"{"a":1}"#), bytes(br#"{ "a": 1 }"#));
        assert_eq!(json(br#"{"a":1,"b":2}"#), json(b"{ \"b\": 2,\n \"a\": 1 }"));
        assert_ne!(json(br#"{"a":1}"#), json(br#"{"a":2}"#));
        assert_eq!(json(b"not json"), bytes(b"not json"));
        let put = parts("PUT", "/orders");
        assert_ne!(
            fingerprint(&put, b"{}", BodyComparison::Bytes),
            bytes(b"{}")
        );
        let other = parts("POST", "/refunds");
        assert_ne!(
            fingerprint(&other, b"{}", BodyComparison::Bytes),
            bytes(b"{}")
        );
    }
}

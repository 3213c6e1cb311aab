//! Whose keys a request's key is among: keys are scoped per principal, so that a request never
//! gets the response kept for another principal's.

use std::sync::Arc;

use http::header::AUTHORIZATION;
use http::request::Parts;
use idem_runtime::fingerprint::Fingerprint;

/// Tells a request's principal from its parts.
type Tell = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// Who a request is from, as far as its `Idempotency-Key` goes: keys are scoped per principal,
/// as payment APIs scope them per account. The same key from two principals is two requests,
/// and a request never gets the response kept for another principal's.
///
/// A request whose principal cannot be told is anonymous: anonymous requests share their keys
/// among themselves only, never with a principal's.
#[derive(Clone)]
pub struct Principal(Kind);

#[derive(Clone)]
enum Kind {
    Authorization,
    Told(Arc<Tell>),
    Shared,
}

impl std::fmt::Debug for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.0 {
            Kind::Authorization => "authorization",
            Kind::Told(_) => "from_request",
            Kind::Shared => "shared",
        };
        f.debug_tuple("Principal").field(&kind).finish()
    }
}

impl Principal {
    /// The request's credentials: its `Authorization` header, hashed (SHA-256, so that the
    /// credential is never kept in clear; a guessable one, such as a Basic password, could
    /// still be guessed from its hash by whoever reads the inbox table). Each credential is a
    /// principal; a request without the header is anonymous.
    ///
    /// For API keys and other credentials a client keeps from one request to its retry. A
    /// client that refreshes its token in between gets another scope, and its retry runs
    /// again; where tokens are refreshed, or credentials come in cookies, tell the principal
    /// with [`Principal::from_request`] instead.
    pub fn authorization() -> Self {
        Self(Kind::Authorization)
    }

    /// The principal `tell` reads from the request: typically the id of the user or account
    /// that the authentication in front put in its extensions (kept in clear in the key's
    /// record). A request for which it tells none is anonymous.
    ///
    /// ```
    /// # #[derive(Clone)] struct User { id: String }
    /// let principal = idem_http::Principal::from_request(|parts| {
    ///     parts.extensions.get::<User>().map(|user| user.id.clone())
    /// });
    /// ```
    pub fn from_request(tell: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        Self(Kind::Told(Arc::new(tell)))
    }

    /// No principal: every client of the routes shares their keys.
    ///
    /// **Warning**: any client that sends a key another client used, with the same request,
    /// gets that client's response, whoever either is. Only for routes whose every client acts
    /// for one party (a service calling another on its own behalf), never for an API with
    /// users.
    pub fn shared() -> Self {
        Self(Kind::Shared)
    }

    /// The principal the request `parts` are of, as [`message_key`](crate::message_key) takes
    /// it: `None` for an anonymous request, and for every request with [`Principal::shared`].
    pub fn of(&self, parts: &Parts) -> Option<String> {
        match &self.0 {
            Kind::Authorization => credentials(parts),
            Kind::Told(tell) => tell(parts),
            Kind::Shared => None,
        }
    }
}

/// `sha256:<hex>` of the request's `Authorization` values, if it has any.
fn credentials(parts: &Parts) -> Option<String> {
    let mut values = parts.headers.get_all(AUTHORIZATION).iter().peekable();
    values.peek()?;
    let mut all = Vec::new();
    for value in values {
        all.extend_from_slice(value.as_bytes());
        // A header value holds no line feed: values stay apart.
        all.push(b'\n');
    }
    Some(format!("sha256:{}", Fingerprint::of_bytes(&all).to_hex()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(authorization: &[&str]) -> Parts {
        let mut request = http::Request::post("/orders");
        for value in authorization {
            request = request.header(AUTHORIZATION, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn each_credential_is_a_principal_and_none_is_anonymous() {
        let principal = Principal::authorization();
        let ada = principal.of(&parts(&["Bearer ada"])).unwrap();
        assert!(ada.starts_with("sha256:") && !ada.contains("ada"), "{ada}");
        assert_eq!(principal.of(&parts(&["Bearer ada"])), Some(ada.clone()));
        assert_ne!(principal.of(&parts(&["Bearer bob"])), Some(ada.clone()));
        assert_ne!(principal.of(&parts(&["Bearer ada", "x"])), Some(ada));
        assert_eq!(principal.of(&parts(&[])), None);
    }

    #[test]
    fn shared_keys_have_no_principal() {
        assert_eq!(Principal::shared().of(&parts(&["Bearer ada"])), None);
        let told = Principal::from_request(|parts| Some(parts.uri.path().to_owned()));
        assert_eq!(told.of(&parts(&[])).as_deref(), Some("/orders"));
    }
}

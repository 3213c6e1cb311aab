//! AMQP URLs that never show their password.

use std::fmt;

/// An AMQP URL (`amqp://user:password@host:port/vhost`, or `amqps://` with the `tls` feature)
/// whose `Display` and `Debug` forms hide the password, so it can be logged and put in errors.
#[derive(Clone, PartialEq, Eq)]
pub struct AmqpUrl(String);

impl AmqpUrl {
    /// Wraps a URL.
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The full URL, password included: for connecting only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with the password replaced by `***`.
    pub fn redacted(&self) -> String {
        let Some(scheme_end) = self.0.find("://") else {
            return self.0.clone();
        };
        let rest = &self.0[scheme_end + 3..];
        let authority_end = rest.find('/').unwrap_or(rest.len());
        let Some(at) = rest[..authority_end].rfind('@') else {
            return self.0.clone();
        };
        let userinfo = &rest[..at];
        let user = userinfo.split(':').next().unwrap_or_default();
        let hidden = if userinfo.contains(':') {
            format!("{user}:***")
        } else {
            user.to_owned()
        };
        format!("{}{hidden}{}", &self.0[..scheme_end + 3], &rest[at..])
    }
}

impl From<&str> for AmqpUrl {
    fn from(url: &str) -> Self {
        Self::new(url)
    }
}

impl From<String> for AmqpUrl {
    fn from(url: String) -> Self {
        Self::new(url)
    }
}

impl fmt::Display for AmqpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Debug for AmqpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AmqpUrl({:?})", self.redacted())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden() {
        let url = AmqpUrl::new("amqp://guest:s3cr3t@rabbit:5672/%2f");
        assert_eq!(url.to_string(), "amqp://guest:***@rabbit:5672/%2f");
        assert!(!format!("{url:?}").contains("s3cr3t"));
        assert_eq!(
            AmqpUrl::new("amqp://rabbit/%2f").to_string(),
            "amqp://rabbit/%2f"
        );
        assert_eq!(
            AmqpUrl::new("amqps://u:p@a@h/v").to_string(),
            "amqps://u:***@h/v"
        );
    }
}

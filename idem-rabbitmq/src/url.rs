//! URLs that never show their password.

use std::fmt;

use crate::tls::TlsSettings;

/// The URL of a RabbitMQ broker (`amqp://user:password@host:port/vhost`, or `amqps://` with the
/// `tls` feature), or of the nodes of a cluster, whose `Display` and `Debug` forms hide every
/// password, so it can be logged and put in errors.
///
/// A cluster's nodes are URLs separated by commas (`amqp://u:p@rabbit-1/%2f,amqp://u:p@rabbit-2/%2f`,
/// as `AMQP_URL` holds them), or given as a list ([`AmqpUrl::nodes`]). Every connection idem opens
/// tries them in order, starting from the last one it reached (or from a random one, see
/// [`AmqpUrl::shuffled`]), and moves to the next when its node cannot be reached or goes away.
/// The nodes share the first URL's user, password and virtual host; only their schemes, hosts
/// and ports are used.
///
/// A password with a reserved character (`/ # ? @ %`) must be percent-encoded in the URL
/// (`s3cr%2Fet`); one that is not is still hidden, see [`redact_url`].
#[derive(Clone, PartialEq, Eq)]
pub struct AmqpUrl {
    text: String,
    shuffled: bool,
    tls: TlsSettings,
}

impl AmqpUrl {
    /// Wraps a URL, or comma-separated URLs of a cluster's nodes.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            text: url.into(),
            shuffled: false,
            tls: TlsSettings::default(),
        }
    }

    /// The URLs of a cluster's nodes, tried in this order.
    pub fn nodes<I>(urls: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        let urls: Vec<String> = urls.into_iter().map(Into::into).collect();
        Self::new(urls.join(","))
    }

    /// Each connection starts from a node chosen at random instead of the first, so that the
    /// processes of a fleet spread over the cluster.
    pub fn shuffled(mut self) -> Self {
        self.shuffled = true;
        self
    }

    /// Connects to `amqps://` nodes with `tls`: a private CA, a client certificate (the `tls`
    /// feature; without them, the platform's root certificates and no client certificate).
    pub fn tls(mut self, tls: TlsSettings) -> Self {
        self.tls = tls;
        self
    }

    /// The TLS settings of `amqps://` nodes.
    pub fn tls_settings(&self) -> &TlsSettings {
        &self.tls
    }

    /// Whether connections start from a random node.
    pub fn is_shuffled(&self) -> bool {
        self.shuffled
    }

    /// The full URL, password included: for connecting only.
    pub fn expose(&self) -> &str {
        &self.text
    }

    /// Each node's URL, password included: for connecting only.
    pub fn node_urls(&self) -> Vec<&str> {
        split_nodes(&self.text)
    }

    /// The URL with every password replaced by `***`; see [`redact_url`].
    pub fn redacted(&self) -> String {
        redact_url(&self.text)
    }
}

/// The URLs in `text`: a comma followed by a scheme (`amqp://`, `amqps://`) starts the next one,
/// so that a comma in a password is no separator.
fn split_nodes(text: &str) -> Vec<&str> {
    let mut nodes = Vec::new();
    let mut start = 0;
    for (comma, _) in text.match_indices(',') {
        let rest = text[comma + 1..].trim_start().to_ascii_lowercase();
        if rest.starts_with("amqp://") || rest.starts_with("amqps://") {
            nodes.push(text[start..comma].trim());
            start = comma + 1;
        }
    }
    nodes.push(text[start..].trim());
    nodes
}

/// Any URL (AMQP, PostgreSQL, MySQL, SQLite...) with its password, and the value of any query
/// parameter whose name contains `password`, replaced by `***`, for logs and errors.
///
/// The URL is read the way the `url` crate (which lapin and sqlx use) reads it. A text it cannot
/// read, or reads with a fragment or with an `@` outside the user information (what an
/// unencoded `#`, `?` or `/` in a password gives), is shown as its scheme and what follows its
/// last `@`, so that no part of a password shows. A cluster's AMQP URLs separated by commas (as
/// `AMQP_URL` holds them) are each redacted.
///
/// ```
/// use idem_rabbitmq::amqp::redact_url;
///
/// assert_eq!(redact_url("amqp://guest:s3cr%2Fet@rabbit/%2f"), "amqp://guest:***@rabbit/%2f");
/// assert_eq!(
///     redact_url("amqp://a:one@r1/%2f,amqp://b:two@r2/%2f"),
///     "amqp://a:***@r1/%2f,amqp://b:***@r2/%2f"
/// );
/// assert!(!redact_url("amqp://a:one@r1/%2f, AMQP://b:two@r2/%2f").contains("two"));
/// assert_eq!(redact_url("postgres://app:s3cr/et@db:5432/orders"), "postgres://***@db:5432/orders");
/// assert_eq!(redact_url("sqlite://billing.db?mode=rwc"), "sqlite://billing.db?mode=rwc");
/// ```
pub fn redact_url(text: &str) -> String {
    let nodes: Vec<String> = split_nodes(text).into_iter().map(redact_one).collect();
    nodes.join(",")
}

fn redact_one(text: &str) -> String {
    match ::url::Url::parse(text) {
        Ok(url) if !ambiguous(text, &url) => redact_parsed(url),
        _ => redact_unreadable(text),
    }
}

/// Whether `url`, parsed from `text`, may have split a password: a fragment (no broker or
/// database URL has one), or an `@` in `text` although no user information was found.
fn ambiguous(text: &str, url: &::url::Url) -> bool {
    let has_userinfo = !url.username().is_empty() || url.password().is_some();
    url.fragment().is_some() || (!has_userinfo && text.contains('@'))
}

fn redact_parsed(mut url: ::url::Url) -> String {
    if url.password().is_some() {
        // Cannot fail: a URL with a password has a host.
        let _ = url.set_password(Some("***"));
    }
    let secret_query = url
        .query_pairs()
        .any(|(name, _)| name.to_ascii_lowercase().contains("password"));
    if secret_query {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(name, value)| {
                let value = if name.to_ascii_lowercase().contains("password") {
                    "***".to_owned()
                } else {
                    value.into_owned()
                };
                (name.into_owned(), value)
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    url.to_string()
}

/// The scheme, `***`, and what follows the last `@`; without an `@`, the text up to its query.
fn redact_unreadable(text: &str) -> String {
    let (scheme, rest) = match text.find("://") {
        Some(end) => text.split_at(end + 3),
        None => ("", text),
    };
    match rest.rfind('@') {
        Some(at) => format!("{scheme}***{}", &rest[at..]),
        None => match rest.find('?') {
            Some(query) => format!("{scheme}{}?***", &rest[..query]),
            None => text.to_owned(),
        },
    }
}

impl<const N: usize> From<[&str; N]> for AmqpUrl {
    fn from(urls: [&str; N]) -> Self {
        Self::nodes(urls)
    }
}

impl From<Vec<String>> for AmqpUrl {
    fn from(urls: Vec<String>) -> Self {
        Self::nodes(urls)
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
        if self.shuffled {
            write!(f, "AmqpUrl({:?}, shuffled)", self.redacted())
        } else {
            write!(f, "AmqpUrl({:?})", self.redacted())
        }
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
        assert_eq!(
            AmqpUrl::new("amqp://guest@rabbit/%2f").to_string(),
            "amqp://guest@rabbit/%2f"
        );
    }

    /// Every reserved character in a password, raw (as people paste them) and percent-encoded
    /// (as they should be), in AMQP and database URLs: no fragment of the password shows.
    #[test]
    fn passwords_with_reserved_characters_are_hidden() {
        let urls = [
            ("amqp://guest:s3cr/et@rabbit:5672/%2f", "s3cr", "et"),
            ("amqp://guest:s3cr#et@rabbit:5672/%2f", "s3cr", "et"),
            ("amqp://guest:1234#et@rabbit:5672/%2f", "1234", "et"),
            ("amqp://guest:1234?et@rabbit:5672/%2f", "1234", "et"),
            ("amqp://guest:1234/et@rabbit:5672/%2f", "1234", "et"),
            ("amqp://guest:s3cr?et@rabbit:5672/%2f", "s3cr", "et"),
            ("amqp://guest:s3cr@et@rabbit:5672/%2f", "s3cr", "et"),
            ("amqp://guest:s3cr%et@rabbit:5672/%2f", "s3cr", "et"),
            ("amqp://guest:s3cr%2Fet@rabbit:5672/%2f", "s3cr", "2Fet"),
            ("amqp://guest:s3%23cr%3F%40et%25@rabbit/%2f", "s3", "cr"),
            ("postgres://app:s3cr/et@db:5432/orders", "s3cr", "et"),
            ("postgres://app:s3cr#et@db:5432/orders", "s3cr", "et"),
            ("postgres://app:s3%2Fcr%23et@db:5432/orders", "s3", "cr"),
            ("mysql://root:s3cr@et@db:3306/test", "s3cr", "et@"),
            (
                "postgres://db/orders?user=app&password=s3cr%2Fet",
                "s3cr",
                "2Fet",
            ),
            (
                "postgres://db/orders?user=app&password=s3cr/et",
                "s3cr",
                "et",
            ),
        ];
        for (url, start, end) in urls {
            let shown = redact_url(url);
            assert!(
                !shown.contains(start) && !shown.contains(&format!(":{end}")),
                "{url} shown as {shown}"
            );
            assert!(shown.contains("***"), "{url} shown as {shown}");
        }
        assert_eq!(
            redact_url("amqp://guest:s3cr/et@rabbit:5672/%2f"),
            "amqp://***@rabbit:5672/%2f"
        );
        assert_eq!(
            redact_url("amqp://guest:s3cr%2Fet@rabbit:5672/%2f"),
            "amqp://guest:***@rabbit:5672/%2f"
        );
        assert_eq!(
            redact_url("postgres://db/orders?user=app&password=s3cr%2Fet"),
            "postgres://db/orders?user=app&password=***"
        );
    }

    #[test]
    fn a_cluster_s_nodes_are_split_at_a_scheme_and_each_hidden() {
        let url = AmqpUrl::new(
            "amqp://u:p,w@rabbit-1/%2f, amqp://u:p,w@rabbit-2/%2f,amqps://u:p@rabbit-3/%2f",
        );
        assert_eq!(
            url.node_urls(),
            [
                "amqp://u:p,w@rabbit-1/%2f",
                "amqp://u:p,w@rabbit-2/%2f",
                "amqps://u:p@rabbit-3/%2f"
            ]
        );
        assert_eq!(
            url.to_string(),
            "amqp://u:***@rabbit-1/%2f,amqp://u:***@rabbit-2/%2f,amqps://u:***@rabbit-3/%2f"
        );
        assert_eq!(
            AmqpUrl::nodes(["amqp://a/", "amqp://b/"]).node_urls(),
            ["amqp://a/", "amqp://b/"]
        );
        assert_eq!(AmqpUrl::new("amqp://a/").node_urls(), ["amqp://a/"]);
    }

    #[test]
    fn urls_without_a_password_are_shown_whole() {
        for url in [
            "sqlite://billing.db?mode=rwc",
            "sqlite::memory:",
            "postgres://postgres@127.0.0.1:5432/test",
            "amqp://127.0.0.1:5672/%2f?heartbeat=10",
        ] {
            assert_eq!(redact_url(url), url);
        }
    }
}

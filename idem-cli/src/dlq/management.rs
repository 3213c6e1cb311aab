//! What the broker's management API tells that AMQP does not: a queue's type and delivery limit
//! (its argument, its policies, the broker version's default), read before a look that returns
//! letters to a quorum queue, which counts each return toward that limit.

use std::time::Duration;

use base64::Engine;
use idem_rabbitmq::lapin::uri::AMQPUri;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::outcome::Result;

/// The port of the management API, where no URL names it.
const DEFAULT_PORT: u16 = 15672;

/// The delivery limit RabbitMQ 4 gives a quorum queue that states none.
const DEFAULT_LIMIT_4X: i64 = 20;

/// Where the management API is, and who asks.
#[derive(Debug, Clone)]
pub(super) struct Management {
    /// `host:port`.
    address: String,
    user: String,
    password: String,
    vhost: String,
}

/// A queue as the management API describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct QueueFacts {
    /// `quorum`, `classic` or `stream`.
    pub(super) kind: String,
    /// The queue's delivery limit, if a return counts toward one.
    pub(super) delivery_limit: Option<i64>,
}

impl Management {
    /// The management API of the broker at `amqp_url` (its first node): at `explicit`
    /// (`http://host:port`) when given, else on the node's host at port 15672, asked with the
    /// AMQP URL's user and for its virtual host.
    pub(super) fn of(amqp_url: &str, explicit: Option<&str>) -> Result<Self> {
        let first = amqp_url.split(',').next().unwrap_or(amqp_url).trim();
        let uri: AMQPUri = first
            .parse()
            .map_err(|error| format!("the AMQP URL cannot be read: {error}"))?;
        let address = match explicit {
            Some(url) => {
                let parsed = url::Url::parse(url)
                    .map_err(|error| format!("the management URL {url:?}: {error}"))?;
                if parsed.scheme() != "http" {
                    return Err(format!(
                        "the management URL {url:?}: only http:// is read (put a local proxy in \
                         front of an https:// one)"
                    )
                    .into());
                }
                let host = parsed
                    .host_str()
                    .ok_or("the management URL names no host")?;
                format!("{host}:{}", parsed.port().unwrap_or(DEFAULT_PORT))
            }
            None => format!("{}:{DEFAULT_PORT}", uri.authority.host),
        };
        Ok(Self {
            address,
            user: uri.authority.userinfo.username.clone(),
            password: uri.authority.userinfo.password.clone(),
            vhost: uri.vhost.clone(),
        })
    }

    /// The type and delivery limit of `queue`, each step given up after `limit`.
    pub(super) async fn queue(&self, queue: &str, limit: Duration) -> Result<QueueFacts> {
        let overview = self.get(&["api", "overview"], limit).await?;
        let version = overview["rabbitmq_version"].as_str().unwrap_or_default();
        let info = self
            .get(&["api", "queues", &self.vhost, queue], limit)
            .await?;
        let kind = info["type"].as_str().unwrap_or("classic").to_owned();
        let delivery_limit = delivery_limit(
            &kind,
            &info["arguments"],
            &info["effective_policy_definition"],
            major_version(version),
        );
        Ok(QueueFacts {
            kind,
            delivery_limit,
        })
    }

    /// `GET` of the path made of `segments` (each percent-encoded), as JSON.
    async fn get(&self, segments: &[&str], limit: Duration) -> Result<Value> {
        let mut url = url::Url::parse("http://management/").expect("a URL");
        url.path_segments_mut()
            .expect("a base URL")
            .pop_if_empty()
            .extend(segments);
        let credentials = format!("{}:{}", self.user, self.password);
        let request = format!(
            "GET {} HTTP/1.0\r\nHost: {}\r\nAuthorization: Basic {}\r\nAccept: \
             application/json\r\n\r\n",
            url.path(),
            self.address,
            base64::engine::general_purpose::STANDARD.encode(credentials)
        );
        let exchange = async {
            let mut stream = tokio::net::TcpStream::connect(&self.address).await?;
            stream.write_all(request.as_bytes()).await?;
            let mut answer = Vec::new();
            stream.read_to_end(&mut answer).await?;
            Ok::<_, std::io::Error>(answer)
        };
        let answer = match tokio::time::timeout(limit, exchange).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(error)) => {
                return Err(format!("the management API at {}: {error}", self.address).into());
            }
            Err(_) => {
                let why = format!("did not answer within {limit:?}");
                return Err(format!("the management API at {} {why}", self.address).into());
            }
        };
        let (status, body) = response(&answer)
            .ok_or_else(|| format!("the management API at {} answered no HTTP", self.address))?;
        match status {
            200 => Ok(serde_json::from_slice(body)?),
            404 => {
                let missing = format!("no queue {} on the broker", segments.last().unwrap_or(&""));
                Err(Box::new(crate::outcome::NotFound(missing)))
            }
            401 | 403 => Err(format!(
                "the management API at {} refused user {:?} ({status}): it needs a user with \
                 the monitoring or management tag",
                self.address, self.user
            )
            .into()),
            other => Err(format!("the management API at {} answered {other}", self.address).into()),
        }
    }
}

/// The status and body of an HTTP/1.0 response.
fn response(answer: &[u8]) -> Option<(u16, &[u8])> {
    let end = answer.windows(4).position(|window| window == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&answer[..end]).ok()?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, &answer[end + 4..]))
}

/// The major version of a RabbitMQ version string (`3.10.8` is 3).
fn major_version(version: &str) -> Option<u32> {
    version.split('.').next()?.parse().ok()
}

/// The delivery limit a queue of type `kind` has, from its `arguments` and effective policy
/// (`policy`, operator policies merged) on a broker of major version `major`: none for a queue
/// that is not a quorum queue. RabbitMQ 4 gives a quorum queue a limit of 20 unless a source
/// sets one (the lowest non-negative value wins; -1 says "none from this source"); RabbitMQ 3
/// gives none unless a source sets one, and takes every value as a limit (-1 drops a message at
/// its first return). A broker whose version is not told is taken as the stricter, 4.
fn delivery_limit(
    kind: &str,
    arguments: &Value,
    policy: &Value,
    major: Option<u32>,
) -> Option<i64> {
    if kind != "quorum" {
        return None;
    }
    let values: Vec<i64> = [&arguments["x-delivery-limit"], &policy["delivery-limit"]]
        .into_iter()
        .filter_map(Value::as_i64)
        .collect();
    if major.is_some_and(|major| major < 4) {
        return values.iter().min().map(|lowest| (*lowest).max(0));
    }
    match values.iter().filter(|value| **value >= 0).min() {
        Some(lowest) => Some(*lowest),
        None if values.is_empty() => Some(DEFAULT_LIMIT_4X),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn limits_follow_the_broker_version() {
        let none = json!({});
        let three = json!({"x-delivery-limit": 3});
        let unlimited = json!({"x-delivery-limit": -1});
        let policy = json!({"delivery-limit": 5});
        assert_eq!(delivery_limit("classic", &three, &none, Some(3)), None);
        assert_eq!(delivery_limit("quorum", &none, &none, Some(3)), None);
        assert_eq!(delivery_limit("quorum", &three, &none, Some(3)), Some(3));
        assert_eq!(delivery_limit("quorum", &three, &policy, Some(3)), Some(3));
        assert_eq!(delivery_limit("quorum", &none, &policy, Some(3)), Some(5));
        assert_eq!(
            delivery_limit("quorum", &unlimited, &none, Some(3)),
            Some(0),
            "-1 drops at the first return on 3.x"
        );
        assert_eq!(delivery_limit("quorum", &none, &none, Some(4)), Some(20));
        assert_eq!(delivery_limit("quorum", &unlimited, &none, Some(4)), None);
        assert_eq!(
            delivery_limit("quorum", &unlimited, &policy, Some(4)),
            Some(5)
        );
        assert_eq!(delivery_limit("quorum", &three, &policy, Some(4)), Some(3));
        assert_eq!(delivery_limit("quorum", &none, &none, None), Some(20));
    }

    #[test]
    fn responses_and_versions_are_read() {
        let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{\"a\":1}";
        assert_eq!(response(answer), Some((200, &b"{\"a\":1}"[..])));
        assert_eq!(response(b"garbage"), None);
        assert_eq!(major_version("3.10.8"), Some(3));
        assert_eq!(major_version("4.1.0-rc.1"), Some(4));
        assert_eq!(major_version(""), None);
    }

    #[test]
    fn the_api_is_found_beside_the_first_node() {
        let url = "amqp://ops:secret@rabbit-1:5672/%2fprod,amqp://ops:secret@rabbit-2:5672/%2fprod";
        let management = Management::of(url, None).unwrap();
        assert_eq!(management.address, "rabbit-1:15672");
        assert_eq!(management.user, "ops");
        assert_eq!(management.vhost, "/prod");
        let explicit = Management::of(url, Some("http://mgmt:8080")).unwrap();
        assert_eq!(explicit.address, "mgmt:8080");
        assert!(Management::of(url, Some("https://mgmt")).is_err());
    }
}

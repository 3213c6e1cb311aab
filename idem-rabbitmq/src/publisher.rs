//! Publishing with confirms, persistence, `mandatory` routing and stable message ids.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_runtime::transport::Backoff;
use lapin::options::ExchangeDeclareOptions;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use serde::Serialize;
use tokio::sync::Mutex;

use crate::confirm::{ConfirmChannel, NotTaken, confirm_channel};
use crate::connect::{close_within, open_within};
use crate::error::{Error, Result, SettingError};
use crate::link_runtime::Tasks;
use crate::opening::within;
use crate::url::AmqpUrl;

/// The waits between tries of a publish: 100 ms, doubling, at most 1.6 s.
const PUBLISH_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_millis(1600));

/// What to put on a message besides its payload.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishOptions {
    /// The message id; a UUIDv7 is generated when `None`. Keep it stable across retries of the
    /// same logical message: it is what consumers deduplicate on.
    pub message_id: Option<String>,
    /// The correlation id.
    pub correlation_id: Option<String>,
    /// Text headers.
    pub headers: Vec<(String, String)>,
    /// The content type; `application/json` for [`Publisher::publish`] when `None`.
    pub content_type: Option<String>,
    /// A per-message time-to-live.
    pub expiration: Option<Duration>,
}

impl PublishOptions {
    /// With feature `otel`, the options carrying the current span's trace context
    /// (`traceparent`, `tracestate`) unless their headers name one; as they are without.
    fn with_current_trace(self) -> Self {
        #[cfg(feature = "otel")]
        {
            use idem_runtime::trace_context::{TRACEPARENT, current_headers};
            let mut options = self;
            if !options.headers.iter().any(|(name, _)| name == TRACEPARENT) {
                let current = current_headers().into_iter();
                options
                    .headers
                    .extend(current.map(|(name, value)| (name.to_owned(), value)));
            }
            options
        }
        #[cfg(not(feature = "otel"))]
        self
    }

    /// Sets the message id.
    pub fn message_id(mut self, id: impl Into<String>) -> Self {
        self.message_id = Some(id.into());
        self
    }

    /// Sets the correlation id.
    pub fn correlation_id(mut self, id: impl Into<String>) -> Self {
        self.correlation_id = Some(id.into());
        self
    }

    /// Adds a text header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sets the content type.
    pub fn content_type(mut self, content_type: impl Into<String>) -> Self {
        self.content_type = Some(content_type.into());
        self
    }

    /// Sets a per-message time-to-live: the broker drops the message (or dead-letters it) when
    /// it has waited that long in a queue.
    pub fn expiration(mut self, ttl: Duration) -> Self {
        self.expiration = Some(ttl);
        self
    }

    /// Marks the message as a CloudEvent in binary content mode: `cloudEvents:specversion`,
    /// `cloudEvents:source`, `cloudEvents:id` and `cloudEvents:type` headers.
    pub fn cloud_event(
        self,
        source: impl Into<String>,
        id: impl Into<String>,
        event_type: impl Into<String>,
    ) -> Self {
        self.header("cloudEvents:specversion", "1.0")
            .header("cloudEvents:source", source)
            .header("cloudEvents:id", id)
            .header("cloudEvents:type", event_type)
    }
}

/// Publishes persistent messages with publisher confirms.
///
/// Every message is `mandatory`: one that no queue receives is an [`Error::Unroutable`], not a
/// silent loss. A publish whose confirm does not come in time, is negative, or whose channel
/// fails is retried with the *same* message id, so that consumers can recognise the copies.
///
/// The publishes of one `Publisher` take turns, each awaiting its confirm before the next is
/// sent, so that a message the broker returns is told to its own publish; for more publishes in
/// parallel, use several publishers (for many messages at once, idem's outbox relay pipelines
/// its confirms).
///
/// ```no_run
/// # async fn demo() -> Result<(), idem_rabbitmq::Error> {
/// use idem_rabbitmq::{PublishOptions, Publisher};
///
/// let publisher = Publisher::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
/// let id = publisher
///     .publish("orders", "order.placed", &serde_json::json!({"id": "o-1"}), PublishOptions::default())
///     .await?;
/// println!("published {id}");
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Publisher {
    /// Replaced by a new connection when lapin's recovery does not bring it back.
    connection: Mutex<Arc<Connection>>,
    url: AmqpUrl,
    connection_name: String,
    channel: Mutex<ConfirmChannel>,
    confirm_timeout: Duration,
    max_attempts: u32,
}

/// A connection named `name` to `url`, with lapin's automatic recovery, and a confirm channel on
/// it, each given up on after `limit` (a broker that accepts connections and never answers); the
/// connection of a channel that did not open is closed.
async fn open(url: &AmqpUrl, name: &str, limit: Duration) -> Result<(Connection, Channel)> {
    let properties = ConnectionProperties::default().enable_auto_recover();
    // The connection is the publisher's, its tasks on the caller's runtime.
    let connection = open_within(url, name, properties, limit, Tasks::Caller)
        .await?
        .connection;
    match within(limit, "opening the channel", confirm_channel(&connection)).await {
        Ok(channel) => Ok((connection, channel)),
        Err(error) => {
            let _ = close_within(&connection, "no channel", limit).await;
            Err(error)
        }
    }
}

/// Configures a [`Publisher`]; [`PublisherBuilder::connect`] refuses settings that cannot work.
#[derive(Debug, Clone)]
pub struct PublisherBuilder {
    url: AmqpUrl,
    connection_name: String,
    confirm_timeout: Duration,
    max_attempts: u32,
}

impl PublisherBuilder {
    /// The name the connection shows on the broker (default `idem publisher`).
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = name.into();
        self
    }

    /// How long to wait for the broker's confirm before publishing again (default 10 s).
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// How many times a message is published before giving up (default 5).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// Connects (with lapin's automatic recovery) and opens a channel in confirm mode, each
    /// given up on after the confirm timeout.
    ///
    /// # Errors
    ///
    /// [`Error::Settings`] naming every setting that is zero, [`Error::TimedOut`] for a broker
    /// that did not answer in time, or the broker's error.
    pub async fn connect(self) -> Result<Publisher> {
        let zeros = [
            ("the confirm timeout", self.confirm_timeout.is_zero()),
            ("max_attempts", self.max_attempts == 0),
        ];
        let problems: Vec<SettingError> = zeros
            .into_iter()
            .filter(|(_, zero)| *zero)
            .map(|(what, _)| SettingError::Zero(what))
            .collect();
        if !problems.is_empty() {
            return Err(Error::Settings(problems));
        }
        let (connection, channel) =
            open(&self.url, &self.connection_name, self.confirm_timeout).await?;
        Ok(Publisher {
            connection: Mutex::new(Arc::new(connection)),
            url: self.url,
            connection_name: self.connection_name,
            channel: Mutex::new(ConfirmChannel::new(channel)),
            confirm_timeout: self.confirm_timeout,
            max_attempts: self.max_attempts,
        })
    }
}

impl Publisher {
    /// A publisher of the broker at `url`, to configure.
    pub fn builder(url: impl Into<AmqpUrl>) -> PublisherBuilder {
        PublisherBuilder {
            url: url.into(),
            connection_name: "idem publisher".to_owned(),
            confirm_timeout: Duration::from_secs(10),
            max_attempts: 5,
        }
    }

    /// Connects with the default settings: `Publisher::builder(url).connect()`.
    pub async fn connect(url: impl Into<AmqpUrl>) -> Result<Self> {
        Self::builder(url).connect().await
    }

    /// Declares a durable exchange of `kind` (a no-op if it exists with the same type), for a
    /// producer that owns the exchange it publishes to. A channel lost with its node is waited
    /// for (or replaced) and the declaration tried again, up to the publisher's attempts, as a
    /// publish is; the broker's refusal (an exchange of another type) is returned at once.
    pub async fn declare_exchange(&self, name: &str, kind: ExchangeKind) -> Result<()> {
        let options = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        let mut attempt = 1;
        loop {
            let channel = self.channel.lock().await.clone();
            let declaring = channel.channel().exchange_declare(
                name.into(),
                kind.clone(),
                options,
                FieldTable::default(),
            );
            // lapin holds a call on a connection it is recovering for as long as its recovery
            // runs (minutes, against a node that is gone and a host that never answers): a
            // declaration not answered within the confirm timeout is made on a new connection.
            let Ok(declared) = tokio::time::timeout(self.confirm_timeout, declaring).await else {
                if attempt >= self.max_attempts {
                    return Err(Error::TimedOut {
                        operation: format!("declaring exchange {name:?}"),
                        after: self.confirm_timeout,
                    });
                }
                tracing::warn!(exchange = name, attempt, timeout = ?self.confirm_timeout, "exchange not declared in time; retrying on a new connection");
                self.replace_channel(&channel).await;
                attempt += 1;
                continue;
            };
            match declared {
                Ok(()) => return Ok(()),
                // The broker's refusal of the declaration itself is a channel (soft) error;
                // anything else is the connection's (a node stopping or gone).
                Err(error) if attempt < self.max_attempts && !error.is_amqp_soft_error() => {
                    tracing::warn!(exchange = name, attempt, %error, "exchange not declared; retrying");
                    self.repair(&channel, error).await;
                    tokio::time::sleep(PUBLISH_BACKOFF.after(attempt)).await;
                    attempt += 1;
                }
                Err(error) => {
                    return Err(Error::amqp(format!("declaring exchange {name:?}"))(error));
                }
            }
        }
    }

    /// Publishes `message` as JSON and returns its message id.
    pub async fn publish<T: Serialize + ?Sized>(
        &self,
        exchange: &str,
        routing_key: &str,
        message: &T,
        mut options: PublishOptions,
    ) -> Result<String> {
        let payload = serde_json::to_vec(message).map_err(Error::Encode)?;
        options
            .content_type
            .get_or_insert_with(|| "application/json".to_owned());
        self.publish_bytes(exchange, routing_key, &payload, options)
            .await
    }

    /// Publishes raw bytes and returns the message id.
    pub async fn publish_bytes(
        &self,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        options: PublishOptions,
    ) -> Result<String> {
        let message_id = options
            .message_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let options = options.with_current_trace();
        let properties = properties(&message_id, &options).map_err(Error::InvalidMessage)?;
        let mut last = String::new();
        for attempt in 1..=self.max_attempts {
            if attempt > 1 {
                tokio::time::sleep(PUBLISH_BACKOFF.after(attempt - 1)).await;
            }
            let channel = self.channel.lock().await.clone();
            let published = channel
                .publish(
                    exchange,
                    routing_key,
                    payload,
                    properties.clone(),
                    self.confirm_timeout,
                )
                .await;
            match published {
                Ok(()) => return Ok(message_id),
                Err(NotTaken::Unroutable { reply_text }) => {
                    return Err(Error::Unroutable {
                        message_id,
                        exchange: exchange.to_owned(),
                        routing_key: routing_key.to_owned(),
                        reply_text,
                    });
                }
                // A channel that confirms nothing keeps its turn until it does: the next
                // attempt goes on a new one.
                Err(problem @ (NotTaken::NotConfirmMode | NotTaken::NoConfirm(_))) => {
                    last = problem.to_string();
                    self.replace_channel(&channel).await;
                }
                Err(NotTaken::Channel(error)) => {
                    last = error.to_string();
                    self.repair(&channel, error).await;
                }
                Err(problem) => last = problem.to_string(),
            }
            tracing::warn!(message_id, attempt, problem = %last, "publish not confirmed; retrying with the same message id");
        }
        Err(Error::NotConfirmed {
            message_id,
            attempts: self.max_attempts,
            last,
        })
    }

    /// After a channel error: waits (bounded) for lapin's recovery, else opens a new channel.
    async fn repair(&self, used: &ConfirmChannel, error: lapin::Error) {
        let recovery = used.channel().wait_for_recovery(error);
        let recovered = tokio::time::timeout(self.confirm_timeout, recovery).await;
        if !matches!(recovered, Ok(Ok(()))) {
            self.replace_channel(used).await;
        }
    }

    /// Publishes on a new channel from now on instead of `used`, which is closed; unless
    /// another publish replaced it already. A connection that gives no channel within the
    /// confirm timeout (lapin's recovery failed, or is stuck on a node going down) is replaced
    /// by a new one.
    async fn replace_channel(&self, used: &ConfirmChannel) {
        let mut current = self.channel.lock().await;
        if !current.is_same(used) {
            return;
        }
        let connection = Arc::clone(&*self.connection.lock().await);
        let opened = tokio::time::timeout(self.confirm_timeout, confirm_channel(&connection)).await;
        let channel = match opened {
            Ok(Ok(channel)) => channel,
            failed => {
                let why = match failed {
                    Ok(Err(error)) => error.to_string(),
                    _ => format!("no channel within {:?}", self.confirm_timeout),
                };
                tracing::warn!(%why, "the publisher's connection did not recover; connecting again");
                match self.reconnect().await {
                    Ok(channel) => channel,
                    Err(error) => {
                        tracing::warn!(%error, "cannot open a new publisher connection");
                        return;
                    }
                }
            }
        };
        let old = std::mem::replace(&mut *current, ConfirmChannel::new(channel));
        drop(current);
        let closing = old.channel().close(200, "replaced".into());
        let _ = tokio::time::timeout(self.confirm_timeout, closing).await;
    }

    /// Opens a new connection (from the next node) in place of the current one, which is
    /// closed, and a confirm channel on it.
    async fn reconnect(&self) -> Result<Channel> {
        let (connection, channel) =
            open(&self.url, &self.connection_name, self.confirm_timeout).await?;
        let old = std::mem::replace(&mut *self.connection.lock().await, Arc::new(connection));
        let _ = close_within(&old, "replaced", self.confirm_timeout).await;
        Ok(channel)
    }

    /// Closes the channel and the connection, each given up after the confirm timeout (a
    /// connection the broker is closing too is not waited for).
    pub async fn close(self) {
        let limit = self.confirm_timeout;
        let channel = self.channel.into_inner();
        let _ = tokio::time::timeout(limit, channel.channel().close(200, "closing".into())).await;
        let _ = close_within(&self.connection.into_inner(), "closing", limit).await;
    }
}

/// The AMQP properties of a message; an error says which of its short strings (255 bytes at
/// most) is too long.
pub(crate) fn properties(
    message_id: &str,
    options: &PublishOptions,
) -> std::result::Result<BasicProperties, String> {
    let short = |what: &str, value: &str| {
        ShortString::try_new(value).map_err(|_| format!("the {what} is longer than 255 bytes"))
    };
    let mut properties = BasicProperties::default()
        .with_message_id(short("message id", message_id)?)
        .with_delivery_mode(2)
        .with_timestamp(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or_default(),
        );
    if let Some(content_type) = &options.content_type {
        properties = properties.with_content_type(short("content type", content_type)?);
    }
    if let Some(ttl) = options.expiration {
        properties = properties.with_expiration(ttl.as_millis().to_string().into());
    }
    if let Some(correlation_id) = &options.correlation_id {
        properties = properties.with_correlation_id(short("correlation id", correlation_id)?);
    }
    if !options.headers.is_empty() {
        let mut table = FieldTable::default();
        for (name, value) in &options.headers {
            table.insert(
                short("header name", name)?,
                AMQPValue::LongString(value.as_str().into()),
            );
        }
        properties = properties.with_headers(table);
    }
    Ok(properties)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_too_long_for_amqp_are_an_error_not_a_panic() {
        let fine = PublishOptions::default().header("h", "v");
        assert!(properties("id", &fine).is_ok());
        let long = "x".repeat(256);
        let named = PublishOptions::default().header(long.as_str(), "v");
        assert_eq!(
            properties("id", &named).unwrap_err(),
            "the header name is longer than 255 bytes"
        );
        assert!(properties(&long, &fine).is_err());
        let correlated = PublishOptions {
            correlation_id: Some(long),
            ..PublishOptions::default()
        };
        assert!(properties("id", &correlated).is_err());
    }
}

//! Publishing with publisher confirms: the one path every message idem publishes takes (a
//! producer's message, a dead-letter copy, a requeued copy).

use std::fmt;
use std::time::Duration;

use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Channel, Confirmation};

/// Why the broker did not take a message.
#[derive(Debug)]
pub(crate) enum NotTaken {
    /// The exchange routed it to no queue: the broker returned it (`mandatory`).
    Unroutable {
        /// The broker's explanation.
        reply_text: String,
    },
    /// The broker refused it (`basic.nack`).
    Refused,
    /// The channel is not in confirm mode, so the broker confirms nothing.
    NotConfirmMode,
    /// The channel failed.
    Channel(lapin::Error),
    /// No confirm came within the wait.
    NoConfirm(Duration),
}

impl NotTaken {
    /// A short label for metrics.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            NotTaken::Unroutable { .. } => "unroutable",
            NotTaken::Refused => "refused",
            NotTaken::NotConfirmMode | NotTaken::Channel(_) => "channel",
            NotTaken::NoConfirm(_) => "no-confirm",
        }
    }
}

impl fmt::Display for NotTaken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotTaken::Unroutable { reply_text } => write!(f, "routed to no queue ({reply_text})"),
            NotTaken::Refused => f.write_str("the broker refused it"),
            NotTaken::NotConfirmMode => f.write_str("the channel is not in confirm mode"),
            NotTaken::Channel(error) => write!(f, "{error}"),
            NotTaken::NoConfirm(wait) => write!(f, "no confirm within {wait:?}"),
        }
    }
}

/// Publishes `payload` with `properties` to `exchange`, `mandatory`, on a channel in confirm
/// mode, and waits at most `wait` for the broker's confirm.
pub(crate) async fn publish_confirmed(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    payload: &[u8],
    properties: BasicProperties,
    wait: Duration,
) -> Result<(), NotTaken> {
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let published = async {
        channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                options,
                payload,
                properties,
            )
            .await?
            .await
    };
    match tokio::time::timeout(wait, published).await {
        Ok(Ok(Confirmation::Ack(None))) => Ok(()),
        Ok(Ok(Confirmation::Ack(Some(returned)))) => Err(NotTaken::Unroutable {
            reply_text: returned.reply_text.to_string(),
        }),
        Ok(Ok(Confirmation::Nack(_))) => Err(NotTaken::Refused),
        Ok(Ok(Confirmation::NotRequested)) => Err(NotTaken::NotConfirmMode),
        Ok(Err(error)) => Err(NotTaken::Channel(error)),
        Err(_) => Err(NotTaken::NoConfirm(wait)),
    }
}

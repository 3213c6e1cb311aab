//! Publishing with publisher confirms: the one path every message idem publishes takes (a
//! producer's message, a dead-letter copy, a requeued copy).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation, Connection, PublisherConfirm};
use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio::time::{Instant, Timeout};

use crate::error::Error;

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
    /// The channel's earlier publishes took the whole wait: this one was not sent.
    Busy(Duration),
}

impl NotTaken {
    /// Whether the channel failed, rather than the broker answering about this one message:
    /// nothing more can be published on it.
    pub(crate) fn is_channel_failure(&self) -> bool {
        matches!(
            self,
            NotTaken::NotConfirmMode | NotTaken::Channel(_) | NotTaken::NoConfirm(_)
        )
    }

    /// A short label for metrics.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            NotTaken::Unroutable { .. } => "unroutable",
            NotTaken::Refused => "refused",
            NotTaken::NotConfirmMode | NotTaken::Channel(_) => "channel",
            NotTaken::NoConfirm(_) => "no-confirm",
            NotTaken::Busy(_) => "busy",
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
            NotTaken::Busy(wait) => write!(f, "earlier publishes took the whole {wait:?}"),
        }
    }
}

/// Opens a channel on `connection` and puts it in confirm mode.
pub(crate) async fn confirm_channel(connection: &Connection) -> Result<Channel, Error> {
    let channel = connection
        .create_channel()
        .await
        .map_err(Error::amqp("channel.open"))?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(Error::amqp("confirm.select"))?;
    Ok(channel)
}

/// A channel in confirm mode whose publishes take turns: one at a time is sent and awaits its
/// confirm.
///
/// lapin hands a message the broker returned to whichever confirm it completes next (see
/// [`Sent`]): with two publishes in flight, a copy the broker returned could pass for taken (its
/// original acked, the message lost) and a copy taken for returned. With one in flight, the
/// return that comes with a confirm is that publish's own. A publish whose confirm did not come
/// in time keeps the turn until the broker has confirmed it, or the channel is gone (see
/// [`Turn`]).
#[derive(Debug, Clone)]
pub(crate) struct ConfirmChannel {
    channel: Channel,
    turn: Arc<Mutex<()>>,
}

impl ConfirmChannel {
    /// Takes `channel`, in confirm mode; nothing else may publish on it.
    pub(crate) fn new(channel: Channel) -> Self {
        Self {
            channel,
            turn: Arc::default(),
        }
    }

    /// The channel, for what is not a publish (its status, closing it).
    pub(crate) fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Whether `other` is this very channel (not merely one with its number).
    pub(crate) fn is_same(&self, other: &ConfirmChannel) -> bool {
        Arc::ptr_eq(&self.turn, &other.turn)
    }

    /// Publishes `payload` with `properties` to `exchange`, `mandatory`, once the publishes
    /// before it are confirmed (`wait` at most), and waits for the broker's confirm (`wait` at
    /// most).
    pub(crate) async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        properties: BasicProperties,
        wait: Duration,
    ) -> Result<(), NotTaken> {
        let deadline = Instant::now() + wait;
        let turn = Arc::clone(&self.turn).lock_owned();
        let Ok(guard) = tokio::time::timeout_at(deadline, turn).await else {
            return Err(NotTaken::Busy(wait));
        };
        // Dropped with this future too (a caller's timeout): a publish sent and not confirmed
        // keeps the turn until it is.
        let mut turn = Turn {
            guard: Some(guard),
            channel: self.channel.clone(),
            wait,
            in_flight: true,
        };
        // Its own whole wait once it has the turn: a publish that waited long for its turn,
        // then its confirm, would take the channel for one that confirms nothing.
        let sent = send(
            &self.channel,
            exchange,
            routing_key,
            payload,
            properties,
            wait,
        );
        let taken = match sent.await {
            Ok(sent) => confirmed(sent).await,
            Err(problem) => Err(problem),
        };
        turn.in_flight = matches!(taken, Err(NotTaken::NoConfirm(_)));
        taken
    }
}

/// A publish's turn on its channel, given back when dropped; but while a publish sent under it
/// is not confirmed (no confirm in time, or the publishing future dropped mid-flight), only once
/// the broker has confirmed it: lapin would hand a return of that publish to the next one's
/// confirm. A channel whose broker confirms nothing within another wait is closed, so that its
/// turn is given back and its owner opens another (a consumer's session is replaced, a
/// [`Publisher`](crate::Publisher) opens a new channel).
struct Turn {
    guard: Option<OwnedMutexGuard<()>>,
    channel: Channel,
    wait: Duration,
    in_flight: bool,
}

impl Drop for Turn {
    fn drop(&mut self) {
        let Some(guard) = self.guard.take() else {
            return;
        };
        if !self.in_flight {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (channel, wait) = (self.channel.clone(), self.wait);
        runtime.spawn(async move {
            if tokio::time::timeout(wait, channel.wait_for_confirms())
                .await
                .is_err()
            {
                tracing::warn!(
                    ?wait,
                    "the broker confirms nothing on a channel; closing it"
                );
                // Closing from its first poll (later publishes on it fail); a blocked connection
                // may never answer the close, which is not waited for longer.
                let closing = channel.close(200, "no publisher confirm".into());
                let _ = tokio::time::timeout(wait, closing).await;
            }
            drop(guard);
        });
    }
}

/// What the broker's confirm of a publish alone in flight says of it.
async fn confirmed(sent: Sent) -> Result<(), NotTaken> {
    match sent.confirmation().await? {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(returned)) => Err(NotTaken::Unroutable {
            reply_text: returned.reply_text.to_string(),
        }),
        Confirmation::Nack(_) => Err(NotTaken::Refused),
        Confirmation::NotRequested => Err(NotTaken::NotConfirmMode),
    }
}

/// A publish sent, its confirm not awaited yet: several can be in flight on one channel.
///
/// lapin hands a message the broker returned (`basic.return`, unroutable) to whichever confirm
/// it completes next, and completes the confirms of one `multiple` ack in no set order: with
/// several publishes in flight, a return may come with another publish's confirm. Whoever
/// pipelines must match returns to publishes by message id, never by the confirm they came with.
#[derive(Debug)]
pub(crate) struct Sent {
    confirm: Timeout<PublisherConfirm>,
    wait: Duration,
}

/// Publishes `payload` with `properties` to `exchange`, `mandatory`, on a channel in confirm
/// mode, without waiting for the confirm: [`Sent::confirmation`] waits for it, at most `wait`
/// after this call.
pub(crate) async fn send(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    payload: &[u8],
    properties: BasicProperties,
    wait: Duration,
) -> Result<Sent, NotTaken> {
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let deadline = Instant::now() + wait;
    let publish = channel.basic_publish(
        exchange.into(),
        routing_key.into(),
        options,
        payload,
        properties,
    );
    match tokio::time::timeout_at(deadline, publish).await {
        Ok(Ok(confirm)) => Ok(Sent {
            confirm: tokio::time::timeout_at(deadline, confirm),
            wait,
        }),
        Ok(Err(error)) => Err(NotTaken::Channel(error)),
        Err(_) => Err(NotTaken::NoConfirm(wait)),
    }
}

impl Sent {
    /// The broker's confirm, as lapin gives it (see [`Sent`] about returned messages).
    pub(crate) async fn confirmation(self) -> Result<Confirmation, NotTaken> {
        match self.confirm.await {
            Ok(Ok(confirmation)) => Ok(confirmation),
            Ok(Err(error)) => Err(NotTaken::Channel(error)),
            Err(_) => Err(NotTaken::NoConfirm(self.wait)),
        }
    }
}

//! The relay's connection to the broker: one channel in confirm mode, replaced when it is lost.

use std::time::Duration;

use idem_runtime::outbox::PendingMessage;
use lapin::Channel;

use super::settings::RelaySettings;
use crate::confirm::{NotTaken, Sent, confirm_channel, send};
use crate::connect::{Link, Retirees};
use crate::error::Result;
use crate::opening::within;
use crate::publisher::{PublishOptions, properties};

/// How long lapin may try to recover a lost connection. The relay does not wait for it: a
/// connection found lost is replaced at once and refused any reconnection.
const RECOVERY_BOUND: Duration = Duration::from_secs(30);

/// An open connection and its confirm-mode channel.
pub(super) struct RelaySession {
    link: Link,
    channel: Channel,
}

impl RelaySession {
    /// Connects and opens a channel in confirm mode, each given up on after the open timeout
    /// (the connection of a channel that did not open is closed and retired).
    pub(super) async fn open(settings: &RelaySettings, retirees: &Retirees) -> Result<Self> {
        let (url, limit) = (&settings.url, settings.open_timeout);
        let link = Link::open(url, &settings.connection_name, RECOVERY_BOUND, limit).await?;
        let channel = within(
            limit,
            "opening the channel",
            confirm_channel(&link.connection),
        );
        match channel.await {
            Ok(channel) => Ok(Self { link, channel }),
            Err(error) => {
                link.close("start failed").await;
                retirees.retire(link);
                Err(error)
            }
        }
    }

    /// Whether the connection and the channel are up ([`Link::up`]).
    pub(super) async fn usable(&self) -> bool {
        self.link.up(&self.channel).await
    }

    /// Publishes `message` as it was staged, persistent and `mandatory`, without waiting for
    /// the broker's confirm ([`Sent::confirmation`] waits for it, at most `wait` from now).
    pub(super) async fn send(
        &self,
        message: &PendingMessage,
        wait: Duration,
    ) -> Result<Sent, NotTaken> {
        let options = PublishOptions {
            message_id: Some(message.message_id.clone()),
            content_type: message.content_type.clone(),
            headers: message
                .headers
                .iter()
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect(),
            ..PublishOptions::default()
        };
        // Staging refuses such a message; one staged before it did is refused here, as the
        // broker would.
        let properties = properties(&message.message_id, &options).map_err(|problem| {
            tracing::error!(message_id = %message.message_id, problem, "an outbox message cannot be sent");
            NotTaken::Refused
        })?;
        send(
            &self.channel,
            &message.exchange,
            &message.routing_key,
            &message.payload,
            properties,
            wait,
        )
        .await
    }

    /// Gives the connection up: closed if it is connected, refused any reconnection by lapin.
    pub(super) fn retire(self, retirees: &Retirees) {
        retirees.retire(self.link);
    }

    /// Closes the connection for good.
    pub(super) async fn close(self, retirees: &Retirees) {
        self.link.close("relay stopped").await;
        retirees.retire(self.link);
    }
}

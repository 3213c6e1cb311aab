//! What a transport knows about a delivery.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::fingerprint::{Fingerprint, FingerprintError};
use crate::key::{KeyError, MessageKey};

/// What the transport knows about a delivery: message id, correlation id, headers and CloudEvents
/// attributes. Filled by a transport adapter; empty ([`Metadata::default`]) when a test or a
/// script calls the inbox directly.
///
/// Handlers that key on the transport's message id take `meta: &Metadata` and say so:
/// `#[idempotent(key = meta.message_id())]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metadata {
    /// The producer-assigned message id (AMQP `message_id`).
    pub message_id: Option<String>,
    /// The correlation id: groups related messages; never a deduplication key.
    pub correlation_id: Option<String>,
    /// Whether the broker says it delivered this message before. Informational only: a first
    /// delivery of a producer's retry is not marked, so the inbox never relies on it.
    pub redelivered: bool,
    /// Transport headers whose values are text, by name.
    pub headers: BTreeMap<String, String>,
    /// The CloudEvents attributes, when the message is a CloudEvent.
    pub cloud_event: Option<CloudEvent>,
    /// The fingerprint of the payload as received, in its codec's canonical form
    /// ([`Fingerprint::of_json`] for JSON), set by the transport.
    pub payload_fingerprint: Option<Fingerprint>,
}

/// The CloudEvents context attributes idem uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CloudEvent {
    /// `source`: the context in which the event happened.
    pub source: String,
    /// `id`: unique within the source.
    pub id: String,
    /// `type`, when present.
    pub event_type: Option<String>,
}

impl Metadata {
    /// The fingerprint of the message's whole content: the payload as received when the
    /// transport gave it, otherwise `message`'s serialization ([`Fingerprint::of`]). What
    /// handlers return from [`Handler::fingerprint`](crate::Handler::fingerprint) unless they
    /// say otherwise.
    pub fn content_fingerprint<T: Serialize + ?Sized>(
        &self,
        message: &T,
    ) -> Result<Fingerprint, FingerprintError> {
        match self.payload_fingerprint {
            Some(fingerprint) => Ok(fingerprint),
            None => Fingerprint::of(message),
        }
    }

    /// The producer-assigned message id, when the delivery has one.
    pub fn message_id(&self) -> Option<&str> {
        self.message_id.as_deref()
    }

    /// A header's text value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    /// The collision-free key of the CloudEvent (`source` + `id`), see
    /// [`MessageKey::cloud_event`].
    pub fn cloud_event_key(&self) -> Result<MessageKey, KeyError> {
        let event = self
            .cloud_event
            .as_ref()
            .ok_or(KeyError::Missing("CloudEvents source and id"))?;
        MessageKey::cloud_event(&event.source, &event.id)
    }
}

//! A handler bound to a queue, and the type-erased form the consumer drives.

use std::any::TypeId;
use std::future::Future;
use std::pin::Pin;

use idem_runtime::{Handler, Inbox, Metadata, Outcome, Settle};
use lapin::message::Delivery;
use serde::de::DeserializeOwned;

use super::settle::{Retry, Verdict};
use crate::codec::{Codec, Json};
use crate::topology::QueueTopology;

/// A handler bound to a queue, with the codec that decodes its payloads (JSON by default).
#[derive(Debug, Clone)]
pub struct Binding<H, C = Json> {
    topology: QueueTopology,
    handler: H,
    codec: C,
}

impl<H: Handler> Binding<H, Json> {
    /// Binds `handler` to the queue of `topology`, decoding JSON.
    pub fn new(topology: QueueTopology, handler: H) -> Self {
        Self {
            topology,
            handler,
            codec: Json,
        }
    }
}

impl<H: Handler, C: Codec> Binding<H, C> {
    /// Decodes payloads with `codec` instead.
    pub fn with_codec<D: Codec>(self, codec: D) -> Binding<H, D> {
        Binding {
            topology: self.topology,
            handler: self.handler,
            codec,
        }
    }
}

/// What processing one delivery gave: the verdict, and the message key when it could be read.
#[derive(Debug)]
pub(crate) struct Handled {
    pub(crate) verdict: Verdict,
    pub(crate) key: Option<String>,
}

pub(crate) type HandleFuture<'a> = Pin<Box<dyn Future<Output = Handled> + Send + 'a>>;

/// A binding with its handler's types erased, so one consumer drives several.
pub(crate) trait Dispatch: Send + Sync + 'static {
    fn topology(&self) -> &QueueTopology;
    fn consumer(&self) -> &str;
    /// The handler's type, to tell two handlers that claim one consumer name apart.
    fn handler_type(&self) -> (TypeId, &'static str);
    fn check(&self, inbox: &Inbox) -> idem_runtime::Result<()>;
    fn handle<'a>(
        &'a self,
        inbox: &'a Inbox,
        delivery: &'a Delivery,
        metadata: Metadata,
    ) -> HandleFuture<'a>;
}

impl<H, C> Dispatch for Binding<H, C>
where
    H: Handler + 'static,
    H::Message: DeserializeOwned,
    C: Codec,
{
    fn topology(&self) -> &QueueTopology {
        &self.topology
    }

    fn consumer(&self) -> &str {
        self.handler.consumer()
    }

    fn handler_type(&self) -> (TypeId, &'static str) {
        (TypeId::of::<H>(), std::any::type_name::<H>())
    }

    fn check(&self, inbox: &Inbox) -> idem_runtime::Result<()> {
        inbox.check_handler(&self.handler)
    }

    fn handle<'a>(
        &'a self,
        inbox: &'a Inbox,
        delivery: &'a Delivery,
        metadata: Metadata,
    ) -> HandleFuture<'a> {
        Box::pin(async move {
            let content_type = delivery.properties.content_type().as_ref();
            let message: H::Message = match self
                .codec
                .decode(content_type.map(|ct| ct.as_str()), &delivery.data)
            {
                Ok(message) => message,
                Err(error) => {
                    return Handled {
                        verdict: Verdict::DeadLetter(idem_runtime::DeadLetterReason::new(
                            "undecodable",
                            error.to_string(),
                        )),
                        key: None,
                    };
                }
            };
            let mut metadata = metadata;
            metadata.payload_fingerprint = self
                .codec
                .fingerprint(content_type.map(|ct| ct.as_str()), &delivery.data);
            let metadata = &metadata;
            let message_key = self.handler.key(&message, metadata);
            let key = message_key.as_ref().ok().map(|key| key.to_string());
            let verdict = match inbox
                .process_with_key(&self.handler, message_key, message, metadata)
                .await
            {
                Ok(Outcome::Processed(_)) => Verdict::Ack { duplicate: false },
                Ok(Outcome::Duplicate(_)) => Verdict::Ack { duplicate: true },
                Err(error) => match error.settle() {
                    Settle::Ack => Verdict::Ack { duplicate: true },
                    Settle::Requeue => Verdict::Requeue {
                        code: error.code(),
                        detail: error.to_string(),
                        retry: Retry::of(&error),
                    },
                    Settle::DeadLetter(reason) => Verdict::DeadLetter(reason),
                },
            };
            Handled { verdict, key }
        })
    }
}

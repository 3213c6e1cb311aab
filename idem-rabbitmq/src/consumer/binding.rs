//! A handler bound to a queue, and the type-erased form the consumer drives.

use std::any::TypeId;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::time::Duration;

use futures_util::future::BoxFuture;

use idem_runtime::{
    Handler, Inbox, Metadata, Mode, Outcome, SliceHandler,
    transport::{BatchChecks, BatchItem, MAX_BATCH, Processing, Settle},
};
use lapin::message::Delivery;
use serde::de::DeserializeOwned;

use super::settle::{Retry, Verdict};
use crate::codec::{Codec, Json};
use crate::error::SettingError;
use crate::topology::QueueTopology;

/// A handler bound to a queue, with the codec that decodes its payloads (JSON by default).
#[derive(Debug, Clone)]
pub struct Binding<H: Handler, C = Json> {
    topology: QueueTopology,
    handler: H,
    codec: C,
    batch: Option<(Batching, BatchFn<H>)>,
    checks: BatchChecks,
    batches_in_flight: usize,
}

/// Results of a batch, one per message.
type BatchResults<H> = Vec<idem_runtime::Result<Outcome<<H as Handler>::Output>>>;

/// [`Inbox::process_batch`] for one handler type, taken where its bound (messages that can be
/// cloned) is known to hold, so that bindings not in batch mode do not need it.
type BatchFn<H> = for<'a> fn(
    &'a Inbox,
    &'a H,
    Vec<BatchItem<<H as Handler>::Message>>,
    BatchChecks,
) -> BoxFuture<'a, BatchResults<H>>;

fn process_batch<'a, H: Handler>(
    inbox: &'a Inbox,
    handler: &'a H,
    items: Vec<BatchItem<H::Message>>,
    checks: BatchChecks,
) -> BoxFuture<'a, BatchResults<H>>
where
    H::Message: Clone,
{
    Box::pin(inbox.process_batch_with(handler, items, checks))
}

/// [`Inbox::process_slices`], for a slice handler's bindings.
fn process_slices<'a, H: SliceHandler>(
    inbox: &'a Inbox,
    handler: &'a H,
    items: Vec<BatchItem<H::Message>>,
    _: BatchChecks,
) -> BoxFuture<'a, BatchResults<H>>
where
    H::Message: Clone,
{
    Box::pin(inbox.process_slices(handler, items))
}

/// How a binding in batch mode groups its deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Batching {
    /// The most deliveries in one batch.
    pub(crate) size: usize,
    /// How long a batch waits for more deliveries after its first one.
    pub(crate) max_wait: Duration,
}

/// Batches of one binding in flight at once unless set: a batch is a transaction of many writes,
/// and more of them at once contend for the same tables and indexes (on MariaDB, 16 batches in
/// flight processed about half as many messages as 2).
pub const DEFAULT_BATCHES_IN_FLIGHT: usize = 2;

impl<H: Handler> Binding<H, Json> {
    /// Binds `handler` to the queue of `topology`, decoding JSON.
    pub fn new(topology: QueueTopology, handler: H) -> Self {
        Self {
            topology,
            handler,
            codec: Json,
            batch: None,
            checks: BatchChecks::default(),
            batches_in_flight: DEFAULT_BATCHES_IN_FLIGHT,
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
            batch: self.batch,
            checks: self.checks,
            batches_in_flight: self.batches_in_flight,
        }
    }

    /// Processes this queue's deliveries in batches ([`Inbox::process_batch`]): the ready
    /// deliveries, up to `size` of them, or those that arrived within `max_wait` of the first,
    /// share one database transaction, and the committed ones are acknowledged together (one
    /// `basic.ack` with `multiple` where every earlier delivery of the channel is settled, one
    /// each otherwise). Each message still settles as it would alone: a failing one is rolled
    /// back and requeued or dead-lettered by itself.
    ///
    /// Use it when throughput matters more than latency: a batch commits after its slowest
    /// message, and each message waits up to `max_wait` for its batch to fill. Give the consumer
    /// a [`prefetch`](crate::ConsumerBuilder::prefetch) of at least `size`, or batches never
    /// fill. Each batch counts as one handler in flight, and at most
    /// [`DEFAULT_BATCHES_IN_FLIGHT`] batches of the binding are in flight at once
    /// ([`Binding::batches_in_flight`]). For transactional handlers only: a
    /// two-phase handler is refused at start. At most [`MAX_BATCH`] per batch. Messages are
    /// cloned: on PostgreSQL a batch runs a handler again when another of its messages failed
    /// (see [`Inbox::process_batch`]).
    pub fn batch(mut self, size: usize, max_wait: Duration) -> Self
    where
        H::Message: Clone,
    {
        self.batch = Some((Batching { size, max_wait }, process_batch::<H>));
        self
    }

    /// Processes this queue's deliveries in batches as [`Binding::batch`] does, the fresh
    /// messages of each handled in one call of the slice handler
    /// ([`Inbox::process_slices`]): its business write can be one statement for them all.
    /// Each message still settles as it would alone: when the call fails, the messages that
    /// fail are found by halving the slice, and the others commit.
    pub fn slices(mut self, size: usize, max_wait: Duration) -> Self
    where
        H: SliceHandler,
        H::Message: Clone,
    {
        self.batch = Some((Batching { size, max_wait }, process_slices::<H>));
        self
    }

    /// How many batches of this binding may be in flight at once (default
    /// [`DEFAULT_BATCHES_IN_FLIGHT`]); each also counts as one handler in flight
    /// ([`max_in_flight`](crate::ConsumerBuilder::max_in_flight)). No effect outside batch mode.
    pub fn batches_in_flight(mut self, batches: usize) -> Self {
        self.batches_in_flight = batches;
        self
    }

    /// How batches check what each handler did to their transaction
    /// ([`BatchChecks::BeforeCommit`] unless set): [`BatchChecks::EachMessage`] checks after
    /// each handler, a round trip per message, for handlers not trusted to return every failed
    /// statement's error and never commit or roll back the transaction themselves. No effect
    /// outside batch mode, nor for slices (one call, checked once before the commit).
    pub fn batch_checks(mut self, checks: BatchChecks) -> Self {
        self.checks = checks;
        self
    }
}

/// What processing one delivery gave: the verdict, and the message key when it could be read.
#[derive(Debug)]
pub(crate) struct Handled {
    pub(crate) verdict: Verdict,
    pub(crate) key: Option<String>,
}

impl Handled {
    /// A delivery whose processing panicked outside the handler (a key expression, a codec, an
    /// output's `Serialize`): requeued and counted, as a failing handler is.
    pub(crate) fn panicked(panic: &(dyn std::any::Any + Send)) -> Self {
        Self {
            verdict: Verdict::Requeue {
                code: "panicked",
                detail: idem_runtime::transport::panic_message(panic),
                retry: Retry::Failed,
            },
            key: None,
        }
    }
}

pub(crate) type HandleFuture<'a> = Pin<Box<dyn Future<Output = Handled> + Send + 'a>>;

pub(crate) type BatchFuture<'a> = Pin<Box<dyn Future<Output = Vec<Handled>> + Send + 'a>>;

/// A binding with its handler's types erased, so one consumer drives several.
pub(crate) trait Dispatch: Send + Sync + 'static {
    fn topology(&self) -> &QueueTopology;
    fn consumer(&self) -> &str;
    /// The handler's type, to tell two handlers that claim one consumer name apart.
    fn handler_type(&self) -> (TypeId, &'static str);
    fn check(&self, inbox: &Inbox) -> idem_runtime::Result<()>;
    /// How the binding batches its deliveries; `None` for one at a time.
    fn batching(&self) -> Option<Batching>;
    /// How many of its batches may be in flight at once.
    fn batches_in_flight(&self) -> usize;
    /// The batch settings that cannot work.
    fn check_batching(&self) -> Vec<SettingError>;
    fn handle_batch<'a>(
        &'a self,
        inbox: &'a Inbox,
        deliveries: &'a [Delivery],
        metadata: Vec<Metadata>,
    ) -> BatchFuture<'a>;
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

    fn batching(&self) -> Option<Batching> {
        self.batch.map(|(batching, _)| batching)
    }

    fn batches_in_flight(&self) -> usize {
        self.batches_in_flight
    }

    fn check_batching(&self) -> Vec<SettingError> {
        let Some((batch, _)) = self.batch else {
            return Vec::new();
        };
        let queue = self.topology.queue();
        let mut problems = Vec::new();
        if batch.size == 0 {
            problems.push(SettingError::Zero("the batch size"));
        }
        if self.batches_in_flight == 0 {
            problems.push(SettingError::Zero("the batches in flight"));
        }
        if batch.size > MAX_BATCH {
            problems.push(SettingError::BatchTooLarge {
                queue: queue.to_owned(),
                size: batch.size,
                max: MAX_BATCH,
            });
        }
        if self.handler.mode() != Mode::Transactional {
            problems.push(SettingError::TwoPhaseBatch {
                queue: queue.to_owned(),
                consumer: self.handler.consumer().to_owned(),
            });
        }
        problems
    }

    fn handle<'a>(
        &'a self,
        inbox: &'a Inbox,
        delivery: &'a Delivery,
        metadata: Metadata,
    ) -> HandleFuture<'a> {
        Box::pin(async move {
            let (message, metadata) = match self.decode(delivery, metadata) {
                Ok(decoded) => decoded,
                Err(handled) => return handled,
            };
            let message_key = self.handler.key(&message, &metadata);
            let key = message_key.as_ref().ok().map(|key| key.to_string());
            let result = inbox
                .process_with_key(&self.handler, message_key, message, &metadata)
                .await;
            Handled {
                verdict: verdict_of(result),
                key,
            }
        })
    }

    fn handle_batch<'a>(
        &'a self,
        inbox: &'a Inbox,
        deliveries: &'a [Delivery],
        metadata: Vec<Metadata>,
    ) -> BatchFuture<'a> {
        Box::pin(async move {
            let mut handled: Vec<Option<Handled>> = Vec::with_capacity(deliveries.len());
            let mut keys = Vec::with_capacity(deliveries.len());
            let mut items = Vec::with_capacity(deliveries.len());
            for (index, (delivery, metadata)) in deliveries.iter().zip(metadata).enumerate() {
                // A panicking codec or key expression fails its own delivery, not the batch.
                let decoded = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    self.decode(delivery, metadata).map(|(message, metadata)| {
                        let key = self.handler.key(&message, &metadata);
                        (message, metadata, key)
                    })
                }))
                .unwrap_or_else(|panic| Err(Handled::panicked(panic.as_ref())));
                match decoded {
                    Ok((message, metadata, key)) => {
                        keys.push((index, key.as_ref().ok().map(|key| key.to_string())));
                        items.push(BatchItem {
                            key,
                            message,
                            metadata,
                        });
                        handled.push(None);
                    }
                    Err(failed) => handled.push(Some(failed)),
                }
            }
            let results = match self.batch {
                Some((_, process)) => process(inbox, &self.handler, items, self.checks).await,
                None => unreachable!("a binding not in batch mode processes no batch"),
            };
            for ((index, key), result) in keys.into_iter().zip(results) {
                handled[index] = Some(Handled {
                    verdict: verdict_of(result),
                    key,
                });
            }
            handled
                .into_iter()
                .map(|handled| handled.expect("every delivery of a batch is handled"))
                .collect()
        })
    }
}

impl<H, C> Binding<H, C>
where
    H: Handler,
    H::Message: DeserializeOwned,
    C: Codec,
{
    /// Decodes a delivery's payload and fingerprints it as received; an undecodable one is
    /// dead-lettered.
    fn decode(
        &self,
        delivery: &Delivery,
        mut metadata: Metadata,
    ) -> Result<(H::Message, Metadata), Handled> {
        let content_type = delivery.properties.content_type().as_ref();
        let content_type = content_type.map(|ct| ct.as_str());
        let message = self
            .codec
            .decode(content_type, &delivery.data)
            .map_err(|error| Handled {
                verdict: Verdict::DeadLetter(idem_runtime::transport::DeadLetterReason::new(
                    "undecodable",
                    error.to_string(),
                )),
                key: None,
            })?;
        metadata.payload_fingerprint = self.codec.fingerprint(content_type, &delivery.data);
        Ok((message, metadata))
    }
}

/// How a delivery settles after the inbox processed it.
fn verdict_of<T>(result: idem_runtime::Result<Outcome<T>>) -> Verdict {
    match result {
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
    }
}

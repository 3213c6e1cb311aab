//! The outbox relay driven by hand, and the broker it publishes to: an in-memory queue bound
//! to one exchange, from which the kit delivers to the downstream handler.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use idem_runtime::Metadata;
use idem_runtime::outbox::Outbox;
use idem_runtime::outbox::{PendingMessage, Relaying};
use idem_runtime::sea_orm::DbErr;

use crate::schedule::RelayCrash;

/// How many messages a relay step takes: a few, so that a schedule's relay steps meet
/// messages staged at different times.
pub(crate) const RELAY_STEP_BATCH: u32 = 2;

/// How many messages a relay takes at once while the run drains.
const DRAIN_BATCH: u32 = 100;

/// A message the relay published, as the downstream handler receives it.
#[derive(Debug, Clone)]
pub(crate) struct Published {
    /// The message id it was published with.
    pub(crate) message_id: String,
    /// Its headers.
    pub(crate) headers: BTreeMap<String, String>,
    /// Its payload.
    pub(crate) payload: Vec<u8>,
    /// How many times this copy was delivered downstream.
    pub(crate) deliveries: u32,
}

impl Published {
    /// The metadata a transport gives a delivery of it, before the redelivery fields.
    pub(crate) fn metadata(&self) -> Metadata {
        Metadata {
            message_id: Some(self.message_id.clone()),
            headers: self.headers.clone(),
            payload_fingerprint: idem_runtime::fingerprint::Fingerprint::of_json(&self.payload)
                .ok(),
            ..Metadata::default()
        }
    }
}

/// The kit's broker: one queue, bound to one exchange (or to none). Messages to any other
/// exchange are dropped, as a broker drops what no queue is bound for.
#[derive(Debug, Default)]
pub(crate) struct Broker {
    exchange: Option<String>,
    queue: VecDeque<Published>,
    /// The first copy of every message routed to the queue, by id, in the order published.
    routed: Vec<Published>,
    ids: BTreeSet<String>,
}

impl Broker {
    /// A broker whose queue is bound to `exchange`.
    pub(crate) fn bound_to(exchange: Option<String>) -> Self {
        Self {
            exchange,
            ..Self::default()
        }
    }

    /// Publishes `message`; returns whether a queue took it.
    fn publish(&mut self, message: &PendingMessage) -> bool {
        if self.exchange.as_deref() != Some(message.exchange.as_str()) {
            return false;
        }
        let published = Published {
            message_id: message.message_id.clone(),
            headers: message.headers.clone(),
            payload: message.payload.clone(),
            deliveries: 0,
        };
        if self.ids.insert(published.message_id.clone()) {
            self.routed.push(published.clone());
        }
        self.queue.push_back(published);
        true
    }

    /// The message at the head of the queue, taken off it until it is put back.
    pub(crate) fn next(&mut self) -> Option<Published> {
        self.queue.pop_front()
    }

    /// Puts back a message that was not acknowledged, at the head of the queue, counting the
    /// delivery.
    pub(crate) fn requeue(&mut self, mut message: Published) {
        message.deliveries += 1;
        self.queue.push_front(message);
    }

    /// Whether the queue is empty.
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Every distinct message routed to the queue, in the order first published.
    pub(crate) fn routed(&self) -> &[Published] {
        &self.routed
    }
}

/// One relay step: takes up to `limit` pending messages, and publishes them and marks them
/// sent, or crashes at `crash`. Returns what it did, in words.
///
/// A crashed relay marks nothing sent, and its row locks go with its connection, whenever the
/// database notices. The kit releases them at once (a batch marked sent with no message
/// marked), so that the next steps find the messages as they would once the database has
/// noticed, however fast it does.
pub(crate) async fn relay(
    outbox: &Outbox,
    broker: &mut Broker,
    crash: Option<RelayCrash>,
    limit: u32,
) -> Result<String, DbErr> {
    let batch = outbox.take_pending(limit).await?;
    let taken = batch.messages().len();
    if crash == Some(RelayCrash::BeforePublish) {
        batch.mark_sent(&[]).await?;
        return Ok(format!("took {taken}, crashed before publishing"));
    }
    let mut routed = 0;
    for message in batch.messages() {
        routed += usize::from(broker.publish(message));
    }
    let published = format!("took {taken}, published {taken} ({routed} to the queue)");
    if crash == Some(RelayCrash::AfterPublish) {
        batch.mark_sent(&[]).await?;
        return Ok(format!("{published}, crashed before marking them sent"));
    }
    let seqs: Vec<i64> = batch.messages().iter().map(|message| message.seq).collect();
    batch.mark_sent(&seqs).await?;
    Ok(format!("{published}, marked sent"))
}

/// Relays until nothing is pending; returns how many messages it published.
pub(crate) async fn relay_everything(outbox: &Outbox, broker: &mut Broker) -> Result<usize, DbErr> {
    let mut published = 0;
    loop {
        let batch = outbox.take_pending(DRAIN_BATCH).await?;
        if batch.messages().is_empty() {
            return Ok(published);
        }
        for message in batch.messages() {
            broker.publish(message);
        }
        published += batch.messages().len();
        let seqs: Vec<i64> = batch.messages().iter().map(|message| message.seq).collect();
        batch.mark_sent(&seqs).await?;
    }
}

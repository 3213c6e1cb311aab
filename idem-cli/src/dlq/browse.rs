//! Reading a dead-letter queue without taking anything from it: `basic.get` without
//! acknowledging, every message left unacknowledged given back in its place at the end.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_rabbitmq::lapin::message::Delivery;
use idem_rabbitmq::lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicNackOptions, QueueDeclareOptions,
};
use idem_rabbitmq::lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use idem_rabbitmq::lapin::types::{AMQPValue, FieldTable};
use idem_rabbitmq::lapin::{Channel, Connection};
use idem_rabbitmq::{AmqpUrl, headers, lapin};
use serde_json::json;

use super::queue::{QueueArgs, answered};
use crate::outcome::Result;
use crate::output::note;

/// How long closing the channel, then the connection, is waited for.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// How many times a browse reads the queue's depth again after reading every letter it
/// counted; a queue still fed after that many is left, its letters said unread.
const RECOUNTS: u8 = 5;

/// How many characters of a body a sample shows.
const SAMPLE_CHARS: usize = 200;

/// One dead-lettered message, as read.
#[derive(Debug, Clone)]
pub(super) struct Letter {
    pub(super) message_id: Option<String>,
    pub(super) reason: String,
    pub(super) detail: Option<String>,
    pub(super) consumer: Option<String>,
    pub(super) key: Option<String>,
    /// The queue its consumer reads (`x-idem-queue`).
    pub(super) queue: Option<String>,
    pub(super) dead_lettered_at: Option<SystemTime>,
    /// The start of its body.
    pub(super) sample: String,
}

impl Letter {
    pub(super) fn of(delivery: &Delivery) -> Self {
        let properties = &delivery.properties;
        let table = properties.headers().as_ref();
        let text = |name: &str| match table?.inner().get(name)? {
            AMQPValue::LongString(value) => {
                Some(String::from_utf8_lossy(value.as_bytes()).into_owned())
            }
            AMQPValue::ShortString(value) => Some(value.as_str().to_owned()),
            _ => None,
        };
        let at = match table.and_then(|t| t.inner().get(headers::DEAD_LETTERED_AT)) {
            Some(AMQPValue::LongLongInt(ms)) => u64::try_from(*ms)
                .ok()
                .map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
            _ => None,
        };
        Self {
            message_id: properties.message_id().as_ref().map(|id| id.to_string()),
            reason: text(headers::REASON).unwrap_or_else(|| "(none)".into()),
            detail: text(headers::DETAIL),
            consumer: text(headers::CONSUMER),
            key: text(headers::KEY),
            queue: text(headers::QUEUE),
            dead_lettered_at: at,
            sample: String::from_utf8_lossy(&delivery.data)
                .chars()
                .take(SAMPLE_CHARS)
                .collect(),
        }
    }

    pub(super) fn summary(&self) -> serde_json::Value {
        json!({
            "message_id": self.message_id,
            "consumer": self.consumer,
            "key": self.key,
            "dead_lettered_ms": self.dead_lettered_at.map(crate::output::time_ms),
        })
    }
}

/// A dead-letter queue read with `basic.get`, nothing acknowledged unless moved: what is left
/// unacknowledged goes back in its place when the browse is closed (or its connection dies).
pub(super) struct Browse {
    pub(super) connection: Connection,
    pub(super) channel: Channel,
    pub(super) queue: String,
    reason: Option<String>,
    /// The messages in the queue when it was opened: those are read, not the later ones.
    pub(super) count: u32,
    /// How long one step with the broker is waited for.
    pub(super) limit: Duration,
    /// The highest delivery tag taken and still held (skipped, or returned and not
    /// acknowledged): a close gives it back with every one before it that is held too. Never
    /// an acknowledged one, which the broker would answer by closing the channel.
    held: Option<u64>,
    /// The delivery [`Browse::next`] returned last, until it is acknowledged or the next taken.
    returned: Option<u64>,
    /// Letters that were in the queue at its opening and could not be read: another client
    /// held them (a concurrent look or replay), or they went meanwhile.
    pub(super) unread: u32,
    /// How many more times the queue's depth is read once every counted letter was read.
    recounts_left: u8,
}

impl Browse {
    pub(super) async fn open(args: &QueueArgs) -> Result<Self> {
        let url = AmqpUrl::new(args.amqp_url.as_str());
        let limit = args.step_limit();
        // A lost connection stops the command: what it holds goes back to the queue.
        let connecting = idem_rabbitmq::amqp::connect_once(&url, "idem dlq");
        let connection = answered(limit, "connecting", connecting).await?;
        let opening = connection.create_channel();
        let channel = answered(limit, "opening a channel", opening).await?;
        let counting = async {
            let counted = message_count(&channel, &args.queue).await;
            counted.map_err(|error| no_queue(&args.queue, &error))
        };
        let count = answered(limit, "reading the queue's depth", counting).await?;
        Ok(Self {
            connection,
            channel,
            queue: args.queue.clone(),
            reason: args.reason.clone(),
            count,
            limit,
            held: None,
            returned: None,
            unread: 0,
            recounts_left: RECOUNTS,
        })
    }

    /// The next message that was in the queue when it was opened, of the asked reason; skipped
    /// ones stay unacknowledged.
    pub(super) async fn next(&mut self) -> Result<Option<(Delivery, Letter)>> {
        while self.count > 0 || self.recounted().await? {
            self.count -= 1;
            let options = BasicGetOptions { no_ack: false };
            let getting = self.channel.basic_get(self.queue.as_str().into(), options);
            let Some(got) = answered(self.limit, "reading a message", getting).await? else {
                // The queue ran dry before every letter it held at the opening was read.
                self.unread = self.count + 1;
                self.count = 0;
                return Ok(None);
            };
            let delivery = got.delivery;
            // The one returned before is held unless it was acknowledged.
            self.held = self.returned.take().or(self.held);
            let letter = Letter::of(&delivery);
            if self.reason.as_ref().is_none_or(|r| *r == letter.reason) {
                self.returned = Some(delivery.delivery_tag);
                return Ok(Some((delivery, letter)));
            }
            self.held = Some(delivery.delivery_tag);
        }
        Ok(None)
    }

    /// Whether letters are ready that this browse has not read, once it read as many as it
    /// counted: every letter it read it holds or moved, so what is ready now it never saw,
    /// such as letters another client held at the opening (a replay that just ended, whose
    /// returns the broker may count a moment later). Read too, for at most [`RECOUNTS`] more
    /// counts; what is still ready after the last is unread.
    async fn recounted(&mut self) -> Result<bool> {
        if self.unread > 0 {
            return Ok(false);
        }
        let counting = message_count(&self.channel, &self.queue);
        let ready = answered(self.limit, "reading the queue's depth", counting).await?;
        if ready == 0 {
            return Ok(false);
        }
        if self.recounts_left == 0 {
            self.unread = ready;
            return Ok(false);
        }
        self.recounts_left -= 1;
        self.count = ready;
        Ok(true)
    }

    /// Reads up to `limit` letters (all without one).
    pub(super) async fn read(&mut self, limit: Option<u64>) -> Result<Vec<Letter>> {
        let mut letters = Vec::new();
        while limit.is_none_or(|limit| (letters.len() as u64) < limit) {
            let Some((_, letter)) = self.next().await? else {
                break;
            };
            letters.push(letter);
        }
        Ok(letters)
    }

    /// Acknowledges the delivery [`Browse::next`] returned last (moved): `false` when the
    /// channel had failed first, and the broker gives it back.
    pub(super) async fn acknowledge(&mut self, delivery: &Delivery) -> Result<bool> {
        debug_assert_eq!(self.returned, Some(delivery.delivery_tag));
        let acknowledged = delivery.acker.ack(BasicAckOptions::default()).await?;
        if acknowledged {
            self.returned = None;
        }
        Ok(acknowledged)
    }

    /// Gives back every message taken and not moved, in its place, and closes, each step given
    /// up after [`CLOSE_TIMEOUT`]; says on standard error what did not go cleanly (the broker
    /// gives back what the connection held when it goes).
    pub(super) async fn close(self) {
        if !self.connection.status().connected() {
            return;
        }
        // A channel the broker closed (after a command's error) gave back what it held.
        if self.channel.status().connected() {
            let held = self.returned.or(self.held);
            let giving_back = async {
                if let Some(tag) = held {
                    let options = BasicNackOptions {
                        multiple: true,
                        requeue: true,
                    };
                    self.channel.basic_nack(tag, options).await?;
                }
                self.channel.close(200, "done".into()).await
            };
            match tokio::time::timeout(CLOSE_TIMEOUT, giving_back).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => note!("idem: giving back the messages not moved: {error}"),
                Err(_) => {
                    note!("idem: the broker did not close the channel within {CLOSE_TIMEOUT:?}")
                }
            }
        }
        let closing = idem_rabbitmq::amqp::close_within(&self.connection, "done", CLOSE_TIMEOUT);
        if let Err(error) = closing.await {
            note!("idem: {error}");
        }
    }
}

/// The failure of a look at `queue` the broker answered with `error`: that it has no such
/// queue (exit 3), or the broker's error.
pub(super) fn no_queue(queue: &str, error: &lapin::Error) -> Box<dyn std::error::Error> {
    let missing = matches!(
        error.kind(),
        lapin::ErrorKind::ProtocolError(amqp)
            if matches!(amqp.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
    );
    if missing {
        Box::new(crate::outcome::NotFound(format!(
            "no queue {queue} on the broker"
        )))
    } else {
        format!("reading the queue {queue}: {error}").into()
    }
}

/// How many messages `queue` holds, ready ones; an error when it does not exist.
pub(super) async fn message_count(channel: &Channel, queue: &str) -> lapin::Result<u32> {
    let options = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let declared = channel
        .queue_declare(queue.into(), options, FieldTable::default())
        .await?;
    Ok(declared.message_count())
}

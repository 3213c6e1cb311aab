//! `idem dlq replay`: letters moved to a queue one at a time with publisher confirms, or for a
//! dry run, checked against the inbox.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::SystemTime;

use idem_rabbitmq::lapin;
use idem_rabbitmq::lapin::Confirmation;
use idem_rabbitmq::lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use idem_rabbitmq::lapin::types::{AMQPValue, FieldTable, ShortString};
use idem_runtime::admin::ConsumerName;
use idem_runtime::admin::InboxAdmin;
use idem_runtime::admin::InboxKey;
use idem_runtime::admin::{InboxRecord, Status};
use idem_runtime::{Inbox, MessageKey};
use serde_json::json;

use super::browse::{Browse, Letter, message_count, no_queue};
use super::guard;
use super::queue::{QueueArgs, answered, said_unread};
use crate::outcome::Done;
use crate::outcome::Result;
use crate::output::print_table;
use crate::output::{note, out};

/// The header a replayed copy carries: the dead-letter queue it came from.
const REPLAYED_FROM: &str = "x-idem-replayed-from";

/// What the inbox would make of a replayed letter.
fn verdict(letter: &Letter, record: Option<&InboxRecord>) -> &'static str {
    match record {
        _ if letter.key.is_none() || letter.consumer.is_none() => "no-key",
        None => "new",
        Some(record) if record.expires_at <= SystemTime::now() => "expired",
        Some(record) if record.status == Status::Completed => "duplicate",
        Some(_) => "in-progress",
    }
}

/// Says for each letter what replaying it to `target` would do, moving nothing.
pub(super) async fn dry_run(
    target: &str,
    letters: &[Letter],
    inbox: Option<&Inbox>,
    json: bool,
) -> Result<()> {
    let mut rows = Vec::with_capacity(letters.len());
    for letter in letters {
        let verdict = match inbox {
            None => "not-checked",
            Some(inbox) => {
                let record = match inbox_key(letter) {
                    Some(key) => inbox.lookup(&key).await?,
                    None => None,
                };
                verdict(letter, record.as_ref())
            }
        };
        rows.push((letter, verdict));
    }
    if json {
        let all: Vec<_> = rows
            .iter()
            .map(|(letter, verdict)| {
                json!({
                    "message_id": letter.message_id,
                    "reason": letter.reason,
                    "consumer": letter.consumer,
                    "key": letter.key,
                    "queue": letter.queue,
                    "inbox": verdict,
                })
            })
            .collect();
        out!("{}", json!({"to": target, "messages": all}));
        return Ok(());
    }
    out!("would move {} messages to {target}:", rows.len());
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|(letter, verdict)| {
            vec![
                letter.message_id.clone().unwrap_or_else(|| "-".into()),
                letter.reason.clone(),
                letter.key.clone().unwrap_or_else(|| "-".into()),
                (*verdict).to_owned(),
            ]
        })
        .collect();
    print_table(&["message id", "reason", "key", "inbox"], &table);
    let others = letters
        .iter()
        .filter(|letter| letter.queue.as_deref().is_some_and(|queue| queue != target))
        .count();
    if others > 0 {
        note!(
            "idem: {others} of these messages were dead-lettered by a consumer of another queue \
             than {target} (x-idem-queue)"
        );
    }
    Ok(())
}

fn inbox_key(letter: &Letter) -> Option<InboxKey> {
    Some(InboxKey {
        consumer: ConsumerName::new(letter.consumer.as_deref()?).ok()?,
        message_key: MessageKey::new(letter.key.as_deref()?).ok()?,
    })
}

/// Moves the letters of the asked reason to `target`, one at a time: each copy published with
/// its properties and confirmed, then the original acknowledged. Prints what it moved, and
/// anything that stopped it; a replay that could not read every letter the queue held at its
/// start ends in part.
pub(super) async fn replay(
    args: &QueueArgs,
    target: &str,
    limit: Option<u64>,
    json: bool,
) -> Result<Done> {
    let mut browse = Browse::open(args).await?;
    let prepared = prepare(&browse, target).await;
    if let Err(error) = prepared {
        browse.close().await;
        return Err(error);
    }
    let step_limit = browse.limit;
    let progress = Progress::new("moved", browse.count);
    let mut moved = Moved::default();
    let outcome = loop {
        if limit.is_some_and(|limit| moved.count >= limit) {
            break Ok(());
        }
        let (delivery, letter) = match browse.next().await {
            Ok(Some(next)) => next,
            Ok(None) => break Ok(()),
            Err(error) => break Err(error),
        };
        let moving = move_one(&mut browse, target, &delivery);
        if let Err(error) = answered(step_limit, "moving a message", moving).await {
            let id = letter.message_id.as_deref().unwrap_or("-");
            break Err(format!("message {id} was not moved: {error}").into());
        }
        moved.add(&letter, target);
        progress.show(moved.count);
    };
    progress.finish();
    let unread = browse.unread;
    browse.close().await;
    moved.warn_of_other_queues(target);
    if json {
        let mut report = json!({
            "moved": moved.count,
            "to": target,
            "other_queue": moved.other_queue,
            "unread": unread,
        });
        if let Err(error) = &outcome {
            report["error"] = json!(error.to_string());
        }
        out!("{report}");
    } else {
        out!(
            "moved {} messages from {} to {target}",
            moved.count,
            args.queue
        );
    }
    match outcome {
        Ok(()) => Ok(said_unread(unread)),
        // Said on standard output with what was moved.
        Err(error) => Err(Box::new(crate::outcome::Reported(error.to_string()))),
    }
}

/// Before a replay moves anything: the replay lock taken, the target queue there, publisher
/// confirms on.
async fn prepare(browse: &Browse, target: &str) -> Result<()> {
    let step_limit = browse.limit;
    guard::take_replay_lock(&browse.connection, &browse.queue, step_limit).await?;
    let counting = async {
        let counted = message_count(&browse.channel, target).await;
        counted.map_err(|error| no_queue(target, &error))
    };
    answered(step_limit, "checking the target queue", counting).await?;
    let confirming = browse
        .channel
        .confirm_select(ConfirmSelectOptions::default());
    answered(step_limit, "turning publisher confirms on", confirming).await
}

/// What a replay moved: how many, and the queues other than the target that their consumers
/// read (`x-idem-queue`), with how many of each.
#[derive(Default)]
struct Moved {
    count: u64,
    other_queue: u64,
    others: BTreeMap<String, u64>,
}

impl Moved {
    fn add(&mut self, letter: &Letter, target: &str) {
        self.count += 1;
        if let Some(queue) = letter.queue.as_deref().filter(|queue| *queue != target) {
            self.other_queue += 1;
            *self.others.entry(queue.to_owned()).or_default() += 1;
        }
    }

    /// Says, on standard error, which moved letters came from a consumer of another queue.
    fn warn_of_other_queues(&self, target: &str) {
        for (queue, count) in &self.others {
            note!(
                "idem: {count} of the messages moved to {target} were dead-lettered by a \
                 consumer of {queue} (x-idem-queue): the consumers of {target} may not read them"
            );
        }
    }
}

/// Publishes a copy of `delivery` to `target` and waits for the broker's confirm; then
/// acknowledges the original.
async fn move_one(
    browse: &mut Browse,
    target: &str,
    delivery: &lapin::message::Delivery,
) -> Result<()> {
    let mut table = delivery
        .properties
        .headers()
        .as_ref()
        .map(|table| table.inner().clone())
        .unwrap_or_default();
    table.remove("x-delivery-count");
    table.insert(
        ShortString::from(REPLAYED_FROM),
        AMQPValue::LongString(browse.queue.as_str().into()),
    );
    let properties =
        idem_rabbitmq::amqp::copy_properties(&delivery.properties, FieldTable::from(table));
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let confirm = browse
        .channel
        .basic_publish(
            "".into(),
            target.into(),
            options,
            &delivery.data,
            properties,
        )
        .await?;
    match confirm.await? {
        Confirmation::Ack(None) => {}
        Confirmation::Ack(Some(_)) => return Err(format!("no queue {target} took it").into()),
        Confirmation::Nack(_) => return Err("the broker refused it".into()),
        Confirmation::NotRequested => return Err("the channel is not in confirm mode".into()),
    }
    if !browse.acknowledge(delivery).await? {
        return Err(
            "its copy was confirmed but the letter could not be acknowledged (both \
                    queues hold it now)"
                .into(),
        );
    }
    Ok(())
}

/// `moved 120 of at most 4000` on standard error, rewritten in place, when it is a terminal.
pub(super) struct Progress {
    verb: &'static str,
    total: u32,
    shown: bool,
}

impl Progress {
    pub(super) fn new(verb: &'static str, total: u32) -> Self {
        Self {
            verb,
            total,
            shown: std::io::stderr().is_terminal(),
        }
    }

    pub(super) fn show(&self, done: u64) {
        if self.shown && (done.is_multiple_of(50) || done == u64::from(self.total)) {
            crate::output::write_err(
                format_args!("\r{} {done} of at most {}", self.verb, self.total),
                false,
            );
        }
    }

    pub(super) fn finish(&self) {
        if self.shown {
            note!("");
        }
    }
}

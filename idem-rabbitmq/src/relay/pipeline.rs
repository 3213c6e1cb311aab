//! A batch's publishes: sent one after another without waiting for each confirm, then settled
//! together; a message whose run has a message in flight waits until that one is settled, so
//! that nothing of a run overtakes a message of it the broker did not take.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use idem_runtime::outbox::PendingMessage;
use lapin::Confirmation;
use lapin::message::BasicReturnMessage;

use super::session::RelaySession;
use crate::confirm::{NotTaken, Sent};

/// What a batch's publishes came to.
#[derive(Debug, Default)]
pub(super) struct PublishReport<'a> {
    /// The seqs of the messages the broker took, to mark sent.
    pub(super) sent: Vec<i64>,
    /// The messages it did not take, in the order they were sent, and why.
    pub(super) not_taken: Vec<(&'a PendingMessage, NotTaken)>,
    /// Messages the broker acked along with a confirm given up on, whose acks are not trusted:
    /// left unsent, to be published again.
    pub(super) distrusted: usize,
}

/// Publishes `messages` (a batch, in the order staged) on `session`, each confirm awaited at
/// most `wait`: all of them in flight at once, except that a message whose run already has one
/// in flight first waits for every confirm in flight. A message the broker does not take
/// (unroutable, refused) stops its own run for the rest of the batch, and the other runs go on;
/// a channel that fails stops the batch, and those in flight then are settled all the same.
pub(super) async fn publish<'a>(
    session: &RelaySession,
    messages: &[&'a PendingMessage],
    wait: Duration,
) -> PublishReport<'a> {
    let mut pipeline = Pipeline::default();
    let mut report = PublishReport::default();
    for &message in messages {
        if pipeline.holds_run_of(message) {
            pipeline.collect_confirms(&mut report).await;
            if pipeline.channel_failed {
                return report;
            }
        }
        if message
            .run
            .as_deref()
            .is_some_and(|run| pipeline.stopped.contains(run))
        {
            continue;
        }
        if let Err(why) = pipeline.send(session, message, wait).await {
            pipeline.collect_confirms(&mut report).await;
            report.not_taken.push((message, why));
            return report;
        }
    }
    pipeline.collect_confirms(&mut report).await;
    report
}

/// Publishes in flight on the relay's channel, in the order they were sent.
#[derive(Debug, Default)]
struct Pipeline<'a> {
    in_flight: Vec<(&'a PendingMessage, Sent)>,
    /// The runs with a message in flight (a message of no run is ordered with no other).
    runs: HashSet<&'a str>,
    /// The runs with a message the broker did not take: their later messages wait.
    stopped: HashSet<&'a str>,
    /// Whether a confirm said the channel failed: nothing more is sent on it.
    channel_failed: bool,
}

impl<'a> Pipeline<'a> {
    /// Whether a message of `message`'s run is in flight.
    fn holds_run_of(&self, message: &PendingMessage) -> bool {
        message
            .run
            .as_deref()
            .is_some_and(|run| self.runs.contains(run))
    }

    async fn send(
        &mut self,
        session: &RelaySession,
        message: &'a PendingMessage,
        wait: Duration,
    ) -> Result<(), NotTaken> {
        let sent = session.send(message, wait).await?;
        self.runs.extend(message.run.as_deref());
        self.in_flight.push((message, sent));
        Ok(())
    }

    /// Waits for every confirm in flight and adds what they say to `report`.
    ///
    /// A message the broker returned (unroutable) is found by its message id among the returns
    /// that came with any of these confirms (see [`Sent`]): every return precedes its own
    /// publish's ack, so it comes with a confirm of the same ack, which is in flight here. A
    /// return that matches none of them leaves no ack of the lot to be trusted: none of them is
    /// marked sent, and they are published again with the same ids.
    async fn collect_confirms(&mut self, report: &mut PublishReport<'a>) {
        self.runs.clear();
        let mut answers = Vec::with_capacity(self.in_flight.len());
        let mut returns = Vec::new();
        for (message, sent) in self.in_flight.drain(..) {
            let answer = match sent.confirmation().await {
                Ok(Confirmation::Ack(returned)) => {
                    returns.extend(returned);
                    Ok(true)
                }
                Ok(Confirmation::Nack(returned)) => {
                    returns.extend(returned);
                    Ok(false)
                }
                Ok(Confirmation::NotRequested) => Err(NotTaken::NotConfirmMode),
                Err(why) => Err(why),
            };
            answers.push((message, answer));
        }
        let ids: HashSet<&str> = answers.iter().map(|(m, _)| m.message_id.as_str()).collect();
        let (returned, stray) = match_returns(returns, &ids);
        // A confirm given up on may have been handed a return of another publish of the lot
        // (lapin hands returns to whichever confirm completes first): no ack of the lot is
        // trusted, and its messages are published again, with the same ids.
        let distrusted =
            (answers.iter()).any(|(_, answer)| matches!(answer, Err(NotTaken::NoConfirm(_))));
        for (message, answer) in answers {
            if distrusted && answer.is_ok() {
                self.stopped.extend(message.run.as_deref());
                report.distrusted += 1;
                continue;
            }
            let unroutable = stray
                .clone()
                .or_else(|| returned.get(message.message_id.as_str()).cloned());
            let outcome = match (answer, unroutable) {
                (Err(why), _) => Err(why),
                (Ok(_), Some(reply_text)) => Err(NotTaken::Unroutable { reply_text }),
                (Ok(true), None) => Ok(()),
                (Ok(false), None) => Err(NotTaken::Refused),
            };
            match outcome {
                Ok(()) => report.sent.push(message.seq),
                Err(why) => {
                    self.channel_failed |= why.is_channel_failure();
                    self.stopped.extend(message.run.as_deref());
                    report.not_taken.push((message, why));
                }
            }
        }
    }
}

/// The broker's explanation of each returned message, by message id, among `ids`; and, if a
/// return matches none of them, what to say of every message.
fn match_returns(
    returns: Vec<BasicReturnMessage>,
    ids: &HashSet<&str>,
) -> (HashMap<String, String>, Option<String>) {
    let mut returned = HashMap::new();
    let mut stray = None;
    for message in returns {
        let reply_text = message.reply_text.to_string();
        match message.delivery.properties.message_id() {
            Some(id) if ids.contains(id.as_str()) => {
                returned.insert(id.to_string(), reply_text);
            }
            _ => {
                stray = Some(format!(
                    "{reply_text}; a returned message matched no publish in flight, so no confirm \
                     of them is trusted"
                ));
            }
        }
    }
    (returned, stray)
}

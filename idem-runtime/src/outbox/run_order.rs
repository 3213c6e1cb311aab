//! The order within runs: which of a batch's messages of a run may go out now, and how far
//! each run is known to be sent, so that the check reads only the rows it has to.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use super::pending_message::PendingMessage;

/// An unsent row of a run that the ordering check read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Unsent {
    pub(super) seq: i64,
    /// How long its hold still runs, if it is held back.
    pub(super) held_for: Option<Duration>,
}

/// Where a run's messages in a batch stop going out: an unsent message of the run that the
/// batch does not have comes before them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Wait {
    /// The first of the batch's messages of the run that waits; the later ones wait with it.
    pub(super) from: i64,
    /// How long the message they wait for is held back, if it is.
    pub(super) held_for: Option<Duration>,
}

/// The wait, if any, of a run whose batch has the messages `taken` (in order), given the
/// run's unsent rows up to the last of them (in order), those of the batch included.
pub(super) fn wait_of(taken: &[i64], unsent: &[Unsent]) -> Option<Wait> {
    let gap = unsent
        .iter()
        .find(|row| taken.binary_search(&row.seq).is_err())?;
    let from = *taken.iter().find(|seq| **seq > gap.seq)?;
    Some(Wait {
        from,
        held_for: gap.held_for,
    })
}

/// How far each run is known to be sent: every message of the run up to the seq kept here
/// went out. Learnt from the batches this process's relays marked sent, so the ordering check
/// reads a run's rows after it only, not the entries of sent rows that the database has not
/// cleaned up yet (InnoDB keeps them until purged, and a scan steps over each).
///
/// Sound as long as a run stages one message after the other (the promise of
/// [`OutboxMessage::in_run`](crate::OutboxMessage::in_run)): no message of the run can then
/// commit below a seq that went out.
#[derive(Debug, Default)]
pub(super) struct SentThrough(Mutex<HashMap<String, i64>>);

impl SentThrough {
    /// How many runs are remembered; past it, what was known is forgotten (the check then
    /// reads those runs from their first row again).
    const CAPACITY: usize = 65_536;

    /// The seq up to which `run` is known to be sent (0: nothing known).
    pub(super) fn of(&self, run: &str) -> i64 {
        self.lock().get(run).copied().unwrap_or(0)
    }

    /// Learns from a committed batch: `messages` (in order, each run's without a gap) of which
    /// `sent` went out. A run is sent up to the last of its messages before the first that did
    /// not go out.
    pub(super) fn learn(&self, messages: &[PendingMessage], sent: &[i64]) {
        let sent: HashSet<i64> = sent.iter().copied().collect();
        // Per run: the last message sent before the first that was not, and whether one
        // was not.
        let mut through: HashMap<&str, (i64, bool)> = HashMap::new();
        for message in messages {
            let Some(run) = &message.run else { continue };
            let (last, stopped) = through.entry(run.as_str()).or_insert((0, false));
            if *stopped || !sent.contains(&message.seq) {
                *stopped = true;
            } else {
                *last = message.seq;
            }
        }
        let mut known = self.lock();
        if known.len() + through.len() > Self::CAPACITY {
            known.clear();
        }
        for (run, (last, _)) in through {
            if last > 0 {
                let seq = known.entry(run.to_owned()).or_insert(last);
                *seq = (*seq).max(last);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, i64>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn unsent(seqs: &[i64]) -> Vec<Unsent> {
        seqs.iter()
            .map(|seq| Unsent {
                seq: *seq,
                held_for: None,
            })
            .collect()
    }

    #[test]
    fn a_run_whose_unsent_rows_are_all_in_the_batch_goes_out_whole() {
        assert_eq!(wait_of(&[3, 5, 9], &unsent(&[3, 5, 9])), None);
        assert_eq!(wait_of(&[3], &[]), None);
    }

    #[test]
    fn a_run_waits_from_its_first_message_after_one_the_batch_lacks() {
        let before = wait_of(&[5, 9], &unsent(&[2, 5, 9]));
        assert_eq!(before.map(|wait| wait.from), Some(5));
        let between = wait_of(&[3, 5, 9], &unsent(&[3, 4, 5, 9]));
        assert_eq!(between.map(|wait| wait.from), Some(5));
        let held = Unsent {
            seq: 7,
            held_for: Some(Duration::from_secs(3)),
        };
        let wait = wait_of(&[3, 9], &[unsent(&[3])[0].clone(), held]);
        assert_eq!(
            wait,
            Some(Wait {
                from: 9,
                held_for: Some(Duration::from_secs(3))
            })
        );
    }

    fn message(seq: i64, run: Option<&str>) -> PendingMessage {
        PendingMessage {
            seq,
            message_id: seq.to_string(),
            exchange: String::new(),
            routing_key: String::new(),
            content_type: None,
            headers: BTreeMap::new(),
            payload: Vec::new(),
            age: Duration::ZERO,
            run: run.map(str::to_owned),
        }
    }

    #[test]
    fn a_run_is_known_sent_up_to_its_first_message_that_did_not_go_out() {
        let known = SentThrough::default();
        let batch = [
            message(1, Some("a")),
            message(2, Some("b")),
            message(3, Some("a")),
            message(4, None),
            message(5, Some("a")),
            message(6, Some("c")),
        ];
        known.learn(&batch, &[1, 2, 4, 5, 6]);
        assert_eq!(known.of("a"), 1, "3 did not go out, so 5 says nothing");
        assert_eq!(known.of("b"), 2);
        assert_eq!(known.of("c"), 6);
        assert_eq!(known.of("d"), 0);
        known.learn(&[message(7, Some("b"))], &[]);
        assert_eq!(known.of("b"), 2, "what went out stays known");
        known.learn(&[message(3, Some("a")), message(5, Some("a"))], &[3, 5]);
        assert_eq!(known.of("a"), 5);
    }
}

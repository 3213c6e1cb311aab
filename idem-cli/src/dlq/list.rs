//! `idem dlq list`: letters counted by reason as they are read.

use std::collections::BTreeMap;

use serde_json::json;

use super::browse::Letter;
use crate::output::out;
use crate::output::{print_table, time};

/// Letters counted by reason as they are read, with the first and last of each and the first
/// few as samples: a large queue is not held in memory.
pub(super) struct Reasons {
    samples: usize,
    pub(super) total: u64,
    groups: BTreeMap<String, Group>,
}

/// One reason's letters.
struct Group {
    count: u64,
    first: Letter,
    last: Option<Letter>,
    samples: Vec<Letter>,
}

impl Reasons {
    pub(super) fn new(samples: usize) -> Self {
        Self {
            samples,
            total: 0,
            groups: BTreeMap::new(),
        }
    }

    pub(super) fn add(&mut self, letter: Letter) {
        self.total += 1;
        let samples = self.samples;
        match self.groups.get_mut(&letter.reason) {
            Some(group) => {
                group.count += 1;
                if group.samples.len() < samples {
                    group.samples.push(letter.clone());
                }
                group.last = Some(letter);
            }
            None => {
                let group = Group {
                    count: 1,
                    samples: if samples > 0 {
                        vec![letter.clone()]
                    } else {
                        Vec::new()
                    },
                    first: letter,
                    last: None,
                };
                self.groups.insert(group.first.reason.clone(), group);
            }
        }
    }

    /// Prints the counts of `queue`; `unread` letters it held could not be read.
    pub(super) fn print(&self, queue: &str, unread: u32, json: bool) {
        if json {
            let reasons: Vec<_> = self
                .groups
                .iter()
                .map(|(reason, group)| {
                    json!({
                        "reason": reason,
                        "count": group.count,
                        "first": group.first.summary(),
                        "last": group.last().summary(),
                        "samples": group.samples.iter().map(|l| json!({
                            "message_id": l.message_id,
                            "detail": l.detail,
                            "body": l.sample,
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            let all = json!({
                "queue": queue,
                "messages": self.total,
                "unread": unread,
                "reasons": reasons,
            });
            out!("{all}");
            return;
        }
        out!("{queue}: {} messages", self.total);
        if self.groups.is_empty() {
            return;
        }
        let when = |letter: &Letter| letter.dead_lettered_at.map_or_else(|| "-".into(), time);
        let rows: Vec<Vec<String>> = self
            .groups
            .iter()
            .map(|(reason, group)| {
                vec![
                    reason.clone(),
                    group.count.to_string(),
                    when(&group.first),
                    when(group.last()),
                ]
            })
            .collect();
        print_table(&["reason", "messages", "first", "last"], &rows);
        for (reason, group) in &self.groups {
            out!("\n{reason}:");
            for letter in &group.samples {
                let id = letter.message_id.as_deref().unwrap_or("-");
                out!("  {id}: {}", letter.sample);
                if let Some(detail) = &letter.detail {
                    out!("    {detail}");
                }
            }
        }
    }
}

impl Group {
    fn last(&self) -> &Letter {
        self.last.as_ref().unwrap_or(&self.first)
    }
}

//! `idem outbox show` and `idem outbox retry`: the runs the relays hold back, one run's pending
//! messages, a hold lifted.

use clap::Args as ClapArgs;
use idem_runtime::admin::OutboxAdmin;
use idem_runtime::admin::{HeldRun, HeldSubject};
use idem_runtime::outbox::Outbox;
use serde_json::json;

use super::Result;
use crate::outcome::Done;
use crate::output::{age, print_table};
use crate::output::{note, out};

/// A run, or a message of no run.
#[derive(Debug, ClapArgs)]
pub(crate) struct SubjectArgs {
    /// The run, as `idem outbox show` lists it (`14:billing.charge/o-42`, `run:<name>`).
    #[arg(conflicts_with = "message")]
    run: Option<String>,
    /// A message of no run, by its id.
    #[arg(long, value_name = "ID")]
    message: Option<String>,
}

impl SubjectArgs {
    /// The run or message named, if one is.
    pub(super) fn subject(&self) -> Option<HeldSubject> {
        match (&self.run, &self.message) {
            (Some(run), _) => Some(HeldSubject::Run(run.clone())),
            (None, Some(id)) => Some(HeldSubject::Message(id.clone())),
            (None, None) => None,
        }
    }
}

/// The held runs, or the pending messages of the one named.
pub(super) async fn show(
    outbox: &Outbox,
    subject: &SubjectArgs,
    limit: u32,
    json: bool,
) -> Result<Done> {
    let Some(subject) = subject.subject() else {
        let held = outbox.held_runs(limit).await?;
        print_held(&held, json);
        return Ok(Done::Ok);
    };
    let rows = outbox.pending_of(&subject, limit).await?;
    if rows.is_empty() {
        if json {
            out!("[]");
        }
        note!("idem: nothing of {} is pending", shown(&subject));
        return Ok(Done::NotFound);
    }
    if json {
        let all: Vec<_> = rows
            .iter()
            .map(|row| {
                json!({
                    "seq": row.seq,
                    "message_id": row.message_id,
                    "exchange": row.exchange,
                    "routing_key": row.routing_key,
                    "staged_age_s": row.staged_age.as_secs_f64(),
                    "hold_left_s": row.hold_left.map(|left| left.as_secs_f64()),
                })
            })
            .collect();
        out!("{}", serde_json::Value::Array(all));
        return Ok(Done::Ok);
    }
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            vec![
                row.seq.to_string(),
                row.message_id.clone(),
                exchange(&row.exchange),
                row.routing_key.clone(),
                age(row.staged_age),
                row.hold_left.map_or_else(|| "-".into(), age),
            ]
        })
        .collect();
    let header = [
        "seq",
        "message id",
        "exchange",
        "routing key",
        "staged",
        "held for",
    ];
    print_table(&header, &table);
    Ok(Done::Ok)
}

fn print_held(held: &[HeldRun], json: bool) {
    if json {
        let all: Vec<_> = held
            .iter()
            .map(|run| {
                let (kind, name) = match &run.held {
                    HeldSubject::Run(name) => ("run", name),
                    HeldSubject::Message(id) => ("message", id),
                };
                json!({
                    kind: name,
                    "exchange": run.exchange,
                    "messages": run.messages,
                    "oldest_staged_age_s": run.oldest_staged_age.as_secs_f64(),
                    "hold_left_s": run.hold_left.as_secs_f64(),
                })
            })
            .collect();
        out!("{}", serde_json::Value::Array(all));
        return;
    }
    if held.is_empty() {
        out!("no run is held back");
        return;
    }
    let rows: Vec<Vec<String>> = held
        .iter()
        .map(|run| {
            vec![
                shown(&run.held),
                exchange(&run.exchange),
                run.messages.to_string(),
                age(run.oldest_staged_age),
                age(run.hold_left),
            ]
        })
        .collect();
    print_table(
        &["held", "exchange", "messages", "oldest", "held for"],
        &rows,
    );
}

/// Lifts the hold of `subject`.
pub(super) async fn retry(outbox: &Outbox, subject: &HeldSubject, json: bool) -> Result<Done> {
    let lifted = outbox.lift_holds(subject).await?;
    if json {
        out!("{}", json!({ "lifted": lifted }));
    } else if lifted > 0 {
        out!("lifted the hold of {lifted} messages of {}", shown(subject));
    }
    if lifted == 0 {
        note!("idem: nothing of {} is held", shown(subject));
        return Ok(Done::NotFound);
    }
    Ok(Done::Ok)
}

fn shown(subject: &HeldSubject) -> String {
    match subject {
        HeldSubject::Run(run) => run.clone(),
        HeldSubject::Message(id) => format!("message {id}"),
    }
}

/// An exchange's name, the default one named so.
pub(super) fn exchange(name: &str) -> String {
    if name.is_empty() {
        "(default)".to_owned()
    } else {
        name.to_owned()
    }
}

//! `idem inbox`: records per consumer, one record, a stuck claim ended, a record forgotten.

use std::io::{BufRead, IsTerminal, Write};
use std::time::Duration;

use clap::{Args as ClapArgs, Subcommand};
use idem_runtime::admin::ConsumerName;
use idem_runtime::admin::Forgotten;
use idem_runtime::admin::InboxAdmin;
use idem_runtime::admin::InboxKey;
use idem_runtime::admin::InboxRecord;
use idem_runtime::admin::LiveClaim;
use idem_runtime::admin::Released;
use idem_runtime::{Inbox, KeyError, MessageKey};
use serde_json::json;

use crate::outcome::Done;
use crate::output::{age, print_table, time, time_ms};
use crate::output::{note, out};

use crate::outcome::Result;

/// The inbox's subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum InboxCommand {
    /// Records per consumer: completed, in progress (and the oldest claim's age), expired and
    /// awaiting the cleaner, the most attempts of one key, the oldest and newest.
    Stats {
        #[command(flatten)]
        table: Table,
        /// Only this consumer.
        #[arg(long)]
        consumer: Option<String>,
    },
    /// One record: its status, attempts, times, fingerprint and stored output.
    Show(KeyArgs),
    /// Ends a stuck claim now (a two-phase handler whose worker died or hangs): the next
    /// delivery takes the key over, and the old worker can no longer complete it. A claim whose
    /// lease still runs is refused (exit 4) unless --force.
    Release {
        #[command(flatten)]
        key: KeyArgs,
        #[command(flatten)]
        force: Force,
    },
    /// Deletes a record, so that the next delivery of its message is processed again. A claim
    /// whose lease still runs is refused (exit 4) unless --force.
    Forget {
        #[command(flatten)]
        key: KeyArgs,
        /// Does not ask for confirmation.
        #[arg(long)]
        yes: bool,
        #[command(flatten)]
        force: Force,
    },
}

/// Whether a claim whose lease still runs is acted on.
#[derive(Debug, ClapArgs)]
pub(crate) struct Force {
    /// Acts on a claim whose lease still runs, for a worker known dead: a worker still running
    /// the handler may then repeat its external effect (a charge, an e-mail) beside the one
    /// that takes the key next.
    #[arg(long)]
    force: bool,
}

impl Force {
    fn live(&self) -> LiveClaim {
        if self.force {
            LiveClaim::Override
        } else {
            LiveClaim::Refuse
        }
    }
}

/// The inbox table.
#[derive(Debug, ClapArgs)]
pub(crate) struct Table {
    /// The inbox table, when it is not the default.
    #[arg(long, env = "IDEM_INBOX_TABLE", default_value = "idem_inbox")]
    table: String,
}

/// One record: its table, consumer and key.
#[derive(Debug, ClapArgs)]
pub(crate) struct KeyArgs {
    #[command(flatten)]
    table: Table,
    /// The consumer (the handler's `consumer`).
    consumer: String,
    /// The message's key.
    key: String,
}

impl KeyArgs {
    /// The key, or why it is not one (a usage error).
    fn inbox_key(&self) -> std::result::Result<InboxKey, String> {
        let invalid = |error: KeyError| format!("{error}");
        Ok(InboxKey {
            consumer: ConsumerName::new(self.consumer.as_str()).map_err(invalid)?,
            message_key: MessageKey::new(self.key.as_str()).map_err(invalid)?,
        })
    }
}

/// Runs `command` on the inbox of the database at `url`.
pub(crate) async fn run(url: &str, command: InboxCommand, json: bool) -> Result<Done> {
    let (table, key) = match &command {
        InboxCommand::Stats { table, .. } => (table, None),
        InboxCommand::Show(key)
        | InboxCommand::Release { key, .. }
        | InboxCommand::Forget { key, .. } => (&key.table, Some(key)),
    };
    let key = match key.map(KeyArgs::inbox_key).transpose() {
        Ok(key) => key,
        Err(invalid) => {
            note!("idem: {invalid}");
            return Ok(Done::Usage);
        }
    };
    let writes = matches!(
        command,
        InboxCommand::Release { .. } | InboxCommand::Forget { .. }
    );
    let inbox = open(url, table, writes).await?;
    let key = || key.as_ref().expect("the command names a key");
    match command {
        InboxCommand::Stats { consumer, .. } => stats(&inbox, consumer.as_deref(), json).await,
        InboxCommand::Show(_) => show(&inbox, key(), json).await,
        InboxCommand::Release { force, .. } => release(&inbox, key(), force.live(), json).await,
        InboxCommand::Forget { yes, force, .. } => {
            forget(&inbox, key(), yes, force.live(), json).await
        }
    }
}

/// The inbox in `table`, which must exist with this version's columns: the command creates
/// nothing, and a command that only reads (`writes` false) writes nothing, so that it works
/// with read-only credentials and on a standby.
pub(crate) async fn open(url: &str, table: &Table, writes: bool) -> Result<Inbox> {
    open_table(url, &table.table, writes).await
}

/// [`open`] for the inbox table named `table`.
pub(crate) async fn open_table(url: &str, table: &str, writes: bool) -> Result<Inbox> {
    let db = crate::database::connect(url).await?;
    let inbox = Inbox::builder(db)
        .table(table)
        .create_table(false)
        .read_only(!writes)
        .build()
        .await?;
    Ok(inbox)
}

async fn stats(inbox: &Inbox, consumer: Option<&str>, json: bool) -> Result<Done> {
    let all = inbox.stats(consumer).await?;
    if json {
        let rows: Vec<_> = all
            .iter()
            .map(|stats| {
                json!({
                    "consumer": stats.consumer,
                    "completed": stats.completed,
                    "in_progress": stats.in_progress,
                    "oldest_claim_age_s": stats.oldest_claim_age.map(|age| age.as_secs_f64()),
                    "expired": stats.expired,
                    "max_attempts": stats.max_attempts,
                    "oldest_ms": stats.oldest.map(time_ms),
                    "newest_ms": stats.newest.map(time_ms),
                    "unknown_status": stats.unknown_status,
                })
            })
            .collect();
        out!("{}", serde_json::Value::Array(rows));
        return Ok(Done::Ok);
    }
    let header = [
        "consumer",
        "completed",
        "in progress",
        "oldest claim",
        "expired",
        "max attempts",
        "oldest",
        "newest",
    ];
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|stats| {
            vec![
                stats.consumer.clone(),
                stats.completed.to_string(),
                stats.in_progress.to_string(),
                stats.oldest_claim_age.map_or_else(|| "-".into(), age),
                stats.expired.to_string(),
                stats.max_attempts.to_string(),
                stats.oldest.map_or_else(|| "-".into(), time),
                stats.newest.map_or_else(|| "-".into(), time),
            ]
        })
        .collect();
    if rows.is_empty() {
        out!("no records");
    } else {
        print_table(&header, &rows);
    }
    Ok(Done::Ok)
}

async fn show(inbox: &Inbox, key: &InboxKey, json: bool) -> Result<Done> {
    let Some(record) = inbox.lookup(key).await? else {
        return not_found(key, json);
    };
    if json {
        out!("{}", record_json(key, &record));
        return Ok(Done::Ok);
    }
    let fields = [
        ("consumer", key.consumer.to_string()),
        ("key", key.message_key.to_string()),
        ("status", record.status.as_str().to_owned()),
        ("attempts", record.attempts.to_string()),
        ("created", time(record.created_at)),
        ("claimed", time(record.claimed_at)),
        ("lease until", record.lease_until.map_or("-".into(), time)),
        ("completed", record.completed_at.map_or("-".into(), time)),
        ("expires", time(record.expires_at)),
        (
            "fingerprint",
            record
                .fingerprint
                .map_or("-".into(), |print| print.to_hex()),
        ),
        ("output", record.output.unwrap_or_else(|| "-".into())),
    ];
    for (name, value) in fields {
        out!("{name:<12} {value}");
    }
    Ok(Done::Ok)
}

fn record_json(key: &InboxKey, record: &InboxRecord) -> serde_json::Value {
    json!({
        "consumer": key.consumer.as_str(),
        "key": key.message_key.as_str(),
        "status": record.status.as_str(),
        "attempts": record.attempts,
        "created_ms": time_ms(record.created_at),
        "claimed_ms": time_ms(record.claimed_at),
        "lease_until_ms": record.lease_until.map(time_ms),
        "completed_ms": record.completed_at.map(time_ms),
        "expires_ms": time_ms(record.expires_at),
        "fingerprint": record.fingerprint.as_ref().map(|print| print.to_hex()),
        "output": record.output,
    })
}

async fn release(inbox: &Inbox, key: &InboxKey, live: LiveClaim, json: bool) -> Result<Done> {
    let (result, said) = match inbox.release(key, live).await? {
        Released::Released { attempts } => (
            "released",
            format!(
                "released after {attempts} claim(s): the next delivery takes the key over, unless \
                 that reaches the services' max_attempts (then it is dead-lettered as \
                 needs-intervention, and `idem inbox forget` lets it be processed again)"
            ),
        ),
        Released::Completed => (
            "completed",
            "already completed: no claim to end (`idem inbox forget` deletes the record)".into(),
        ),
        Released::Changed => (
            "changed",
            "the claim changed meanwhile (completed or taken over): nothing done, look again"
                .into(),
        ),
        Released::Live { lease_left } => ("live", live_claim(lease_left)),
        Released::Absent => return not_found(key, json),
        _ => return Err("an outcome this version of idem does not know".into()),
    };
    say(json, key, result, &said);
    Ok(match result {
        "changed" | "live" => Done::Refused,
        _ => Done::Ok,
    })
}

/// What refusing a live claim says: how long its lease runs, and what acting on it risks.
fn live_claim(lease_left: Duration) -> String {
    format!(
        "its claim's lease runs for another {}: its worker may still be running the handler, \
         and acting now would let another worker run the same external effect again. Nothing \
         done: wait for the lease to run out, or --force for a worker known dead",
        age(lease_left)
    )
}

async fn forget(
    inbox: &Inbox,
    key: &InboxKey,
    yes: bool,
    live: LiveClaim,
    json: bool,
) -> Result<Done> {
    if !yes && !confirmed(key)? {
        say(
            json,
            key,
            "declined",
            "not forgotten (--yes forgets without asking)",
        );
        return Ok(Done::Declined);
    }
    match inbox.forget(key, live).await? {
        Forgotten::Deleted => {
            let said = "forgotten: its next delivery is processed again";
            say(json, key, "forgotten", said);
            Ok(Done::Ok)
        }
        Forgotten::Absent => not_found(key, json),
        Forgotten::Live { lease_left } => {
            say(json, key, "live", &live_claim(lease_left));
            Ok(Done::Refused)
        }
        Forgotten::Changed => {
            let said = "the claim's lease ran out meanwhile: nothing done, look again";
            say(json, key, "changed", said);
            Ok(Done::Refused)
        }
        _ => Err("an outcome this version of idem does not know".into()),
    }
}

/// Asks on the terminal; declines where there is no terminal to ask on.
fn confirmed(key: &InboxKey) -> Result<bool> {
    if !std::io::stdin().is_terminal() {
        return Ok(false);
    }
    let question = format!("forget {key}? its next delivery will be processed again [y/N] ");
    std::io::stderr().write_all(question.as_bytes())?;
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

fn not_found(key: &InboxKey, json: bool) -> Result<Done> {
    say(json, key, "not-found", "no record");
    Ok(Done::NotFound)
}

/// Says what became of `key`: `{"consumer", "key", "result", "said"}` in JSON on stdout, else a
/// line (on stderr when nothing was done).
fn say(json: bool, key: &InboxKey, result: &str, said: &str) {
    if json {
        let about = json!({
            "consumer": key.consumer.as_str(),
            "key": key.message_key.as_str(),
            "result": result,
            "said": said,
        });
        out!("{about}");
    } else if matches!(result, "released" | "forgotten" | "completed") {
        out!("{key}: {said}");
    } else {
        note!("{key}: {said}");
    }
}

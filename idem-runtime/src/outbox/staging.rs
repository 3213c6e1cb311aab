//! Staging: a message written to the outbox in the caller's transaction, once per id, and for a
//! handler's run only while the run's claim holds.

use sea_orm::{ConnectionTrait, Value};

use super::error::StagingError;
use super::message::{OutboxMessage, handler_run, named_run};
use super::shared::Shared;
use super::statements::{self, Guard, RunStatements};
use crate::key::InboxKey;

/// The inbox claim a handler run holds in its transaction, and the statements that stage
/// under it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunClaim<'a> {
    /// The staging statements of the inbox's runs; `None` without an outbox.
    pub(crate) statements: Option<&'a RunStatements>,
    pub(crate) token: i64,
}

impl RunClaim<'_> {
    /// The values its checks bind for `key`: consumer, message key, claim token.
    pub(crate) fn values(&self, key: &InboxKey) -> Vec<sea_orm::Value> {
        vec![
            key.consumer.as_str().into(),
            key.message_key.as_str().into(),
            self.token.into(),
        ]
    }
}

/// What one staging writes besides the message: its id, its run, and whether it announces
/// itself (PostgreSQL).
#[derive(Debug, Clone, Copy)]
struct Staging<'a> {
    id: &'a str,
    run: Option<&'a str>,
    announce: bool,
}

/// Stages `message` in `conn`, outside handlers (see `Outbox::stage`); returns its id.
pub(super) async fn stage(
    shared: &Shared,
    conn: &impl ConnectionTrait,
    message: OutboxMessage,
) -> Result<String, StagingError> {
    let message = message.with_current_trace();
    let id = message
        .message_id
        .clone()
        .unwrap_or_else(|| uuid::Uuid::new_v4().hyphenated().to_string());
    let run = message.run.as_deref().map(named_run);
    let staging = Staging {
        id: &id,
        run: run.as_deref(),
        announce: true,
    };
    insert(
        shared,
        conn,
        shared.statements.stage(),
        staging,
        &message,
        Vec::new(),
    )
    .await?;
    Ok(id)
}

/// Stages `message` as `id` for the handler run of `key`, unless a message with that id is
/// staged already, and, under the run's `claim` (the inbox's runs have one), only while the
/// run's transaction still holds it; on PostgreSQL, with `announce`, also announces the
/// commit to listening relays (once per transaction is enough).
pub(crate) async fn stage_for_run(
    shared: &Shared,
    conn: &impl ConnectionTrait,
    id: &str,
    message: &OutboxMessage,
    announce: bool,
    key: &InboxKey,
    claim: Option<RunClaim<'_>>,
) -> Result<(), StagingError> {
    let run = handler_run(key);
    let staging = Staging {
        id,
        run: Some(&run),
        announce,
    };
    let Some((claim, statements)) = claim.and_then(|c| Some((c, c.statements?))) else {
        // A context made by hand (a unit test's), or a run without an inbox record (entity
        // and natural modes) off MariaDB: no claim to check.
        let statement = shared.statements.stage();
        insert(shared, conn, statement, staging, message, Vec::new()).await?;
        return Ok(());
    };
    let guard_values = match statements.guard {
        Guard::Claim => claim.values(key),
        _ => Vec::new(),
    };
    let staged = insert(
        shared,
        conn,
        &statements.stage,
        staging,
        message,
        guard_values,
    )
    .await?;
    // Nothing written: a message of this id staged already (a repeat of the run; MariaDB
    // counts it as written), or the claim gone with the transaction.
    if staged == 0 {
        let held = match statements.guard {
            Guard::InTransaction => false,
            _ => {
                let check = shared.statement(&statements.claim_held, claim.values(key));
                conn.query_one_raw(check).await?.is_some()
            }
        };
        if !held {
            return Err(StagingError::ClaimLost);
        }
    }
    Ok(())
}

/// Runs one staging statement for `message`, binding `guard` after its values; returns
/// how many rows it wrote.
async fn insert(
    shared: &Shared,
    conn: &impl ConnectionTrait,
    statement: &statements::Staging,
    staging: Staging<'_>,
    message: &OutboxMessage,
    guard: Vec<Value>,
) -> Result<u64, StagingError> {
    if let Some(problem) = message.problem() {
        return Err(StagingError::Invalid(problem));
    }
    let headers = (!message.headers.is_empty())
        .then(|| serde_json::to_string(&message.headers).expect("string maps serialize"));
    let mut values = vec![
        Value::from(staging.id.to_owned()),
        Value::from(message.exchange.clone()),
        Value::from(message.routing_key.clone()),
        Value::from(message.content_type.clone()),
        Value::from(headers),
        Value::from(message.payload.clone()),
        Value::from(staging.run.map(str::to_owned)),
    ];
    values.extend(guard);
    let announce = staging.announce && statement.announces();
    if announce {
        values.push(Value::from(shared.channel()));
    }
    let sql = statement.sql(announce);
    if statement.returns_rows {
        let rows = conn.query_all_raw(shared.statement(sql, values)).await?;
        return Ok(rows.len() as u64);
    }
    let result = conn.execute_raw(shared.statement(sql, values)).await?;
    Ok(result.rows_affected())
}

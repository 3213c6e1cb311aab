//! A slice handler for tests: it writes the effects of every message of a slice in one
//! multi-row insert, and the message bodies say what else a call does.

use std::sync::{Arc, Mutex};

use idem_runtime::fingerprint::{Fingerprint, FingerprintError};
use idem_runtime::sea_orm::error::ConnAcquireErr;
use idem_runtime::sea_orm::sea_query::{Alias, Query};
use idem_runtime::sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr};
use idem_runtime::{
    Context, Handler, KeyError, MessageKey, Metadata, OutboxMessage, SliceContext, SliceHandler,
};

use crate::recorder::Msg;

/// The consumer name a [`Slicer`] records its effects under.
pub const SLICER_CONSUMER: &str = "slicer";

/// A slice handler: every message of a slice gets its effect row from one multi-row insert;
/// then a slice holding a message whose body is `fail` fails, `outage` fails as its own
/// database unreachable would, `panic` panics, `swallow` runs a failing statement and ignores
/// its error (which aborts the transaction on PostgreSQL), `short` returns
/// one output too few, and each `stage` message stages an event (`slices.events`, its id the
/// message's) through its own context. One message alone ([`Handler::handle`]) is a slice of
/// one.
#[derive(Debug, Clone)]
pub struct Slicer {
    effects: String,
    calls: Arc<Mutex<Vec<Vec<String>>>>,
}

/// Why a slice failed.
#[derive(Debug, thiserror::Error)]
pub enum SlicerError {
    /// A `fail` message was in the slice.
    #[error("a slice holding a failing message")]
    OnPurpose,
    /// A statement failed.
    #[error(transparent)]
    Db(#[from] DbErr),
    /// A staging failed.
    #[error(transparent)]
    Staging(#[from] idem_runtime::outbox::StagingError),
}

impl Slicer {
    /// A slicer writing into `effects`.
    pub fn new(effects: &str) -> Self {
        Self {
            effects: effects.to_owned(),
            calls: Arc::default(),
        }
    }

    /// The keys of each call's slice, in the order of the calls.
    pub fn calls(&self) -> Vec<Vec<String>> {
        self.calls.lock().unwrap().clone()
    }

    /// Forgets the calls so far.
    pub fn forget_calls(&self) {
        self.calls.lock().unwrap().clear();
    }

    /// Writes every message's effect row in one statement.
    async fn insert_all(&self, tx: &DatabaseTransaction, messages: &[Msg]) -> Result<(), DbErr> {
        let mut insert = Query::insert();
        insert
            .into_table(Alias::new(&self.effects))
            .columns(["consumer", "message_key", "body"]);
        for message in messages {
            insert.values_panic([
                SLICER_CONSUMER.into(),
                message.id.as_str().into(),
                message.body.as_str().into(),
            ]);
        }
        tx.execute(&insert).await?;
        Ok(())
    }

    async fn run(
        &self,
        tx: &DatabaseTransaction,
        contexts: &[Context<'_>],
        messages: Vec<Msg>,
    ) -> Result<Vec<String>, SlicerError> {
        self.calls
            .lock()
            .unwrap()
            .push(messages.iter().map(|m| m.id.clone()).collect());
        self.insert_all(tx, &messages).await?;
        let has = |body: &str| messages.iter().any(|m| m.body == body);
        if has("fail") {
            return Err(SlicerError::OnPurpose);
        }
        if has("swallow") {
            // A failed statement ignored: PostgreSQL aborts the transaction.
            let _ignored = tx
                .execute_unprepared("INSERT INTO idem_no_such_table VALUES (1)")
                .await;
        }
        if has("outage") {
            // What a pool of its own gives when its database is down.
            return Err(SlicerError::Db(DbErr::ConnectionAcquire(
                ConnAcquireErr::Timeout,
            )));
        }
        assert!(!has("panic"), "a slice panicking on purpose");
        for (cx, message) in contexts.iter().zip(&messages) {
            if message.body == "stage" {
                let event = OutboxMessage::json("slices.events", &message.id, &message.id)
                    .expect("an event");
                cx.stage(event).await?;
            }
        }
        let mut outputs: Vec<String> = messages.iter().map(|m| format!("did {}", m.body)).collect();
        if has("short") {
            outputs.pop();
        }
        Ok(outputs)
    }
}

impl Handler for Slicer {
    type Message = Msg;
    type Output = String;
    type Error = SlicerError;

    fn consumer(&self) -> &str {
        SLICER_CONSUMER
    }
    fn key(&self, msg: &Msg, _: &Metadata) -> Result<MessageKey, KeyError> {
        MessageKey::new(msg.id.as_str())
    }
    fn fingerprint(
        &self,
        msg: &Msg,
        meta: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        meta.content_fingerprint(msg).map(Some)
    }
    async fn handle(&self, cx: &Context<'_>, msg: Msg) -> Result<String, SlicerError> {
        let tx = cx.transaction().expect("transactional");
        let outputs = self.run(tx, std::slice::from_ref(cx), vec![msg]).await?;
        outputs
            .into_iter()
            .next()
            .ok_or(SlicerError::Db(DbErr::Custom("no output".into())))
    }
}

impl SliceHandler for Slicer {
    async fn handle_slice(
        &self,
        cx: &SliceContext<'_>,
        messages: Vec<Msg>,
    ) -> Result<Vec<String>, SlicerError> {
        self.run(cx.transaction(), cx.messages(), messages).await
    }
}

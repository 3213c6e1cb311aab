//! The modes that keep no inbox record: entity mode, where the handler's own entity marks the
//! message, and naturally idempotent handlers, which need no mark at all.

use sea_orm::ConnectionTrait;

use super::{Inbox, outage_or, run};
use crate::context::Context;
use crate::entity::slot::{MarkerSlot, Verdict};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::handler::{Handler, Outcome};
use crate::key::InboxKey;
use crate::metadata::Metadata;
use crate::store::dialect::{Failure, classify};

impl Inbox {
    /// Entity mode: the handler runs in a transaction and creates its marker entity; the
    /// transaction commits only if the entity was new.
    pub(super) async fn entity<H: Handler>(
        &self,
        handler: &H,
        key: &InboxKey,
        fingerprint: Option<Fingerprint>,
        message: H::Message,
        metadata: &Metadata,
    ) -> Result<Outcome<H::Output>> {
        let tx = self.inner.store.dialect().begin(&self.inner.db).await?;
        let slot = MarkerSlot::default();
        let cx = Context::new(&key.message_key, metadata, Some(&tx))
            .with_origin(key, self.inner.outbox.as_ref())
            .with_marker(fingerprint, &slot);
        let result = run(handler, &cx, message).await;
        let marked = slot.take();
        // A reused key is the message's fault whatever the handler made of it.
        if let Some(Verdict::Mismatch { stored, received }) = marked.as_ref().map(|m| m.verdict) {
            return Err(Error::FingerprintMismatch {
                key: key.clone(),
                stored,
                received,
            });
        }
        let output = match result {
            Ok(output) => output,
            Err(error) => return Err(outage_or(error, &tx).await),
        };
        let Some(marked) = marked else {
            return Err(Error::MarkerMissing { key: key.clone() });
        };
        if marked.verdict == Verdict::Existing {
            // Dropped, the transaction rolls back whatever the handler wrote after the marker.
            drop(tx);
            (self.inner.telemetry).duplicate(key.consumer.as_str(), None);
            return Ok(Outcome::Duplicate(output));
        }
        // The marker read back is the transaction's last statement: a transaction the database
        // aborted (PostgreSQL) or rolled back (a MySQL deadlock the handler swallowed) no longer
        // has it, and its commit would not mean the entity is stored.
        match tx.query_one_raw(marked.find).await {
            Ok(Some(_)) => {}
            Ok(None) => return Err(Error::TransactionAborted { key: key.clone() }),
            Err(error) if classify(&error) == Failure::Aborted => {
                return Err(Error::TransactionAborted { key: key.clone() });
            }
            Err(error) => return Err(error.into()),
        }
        self.commit(cx.outbound().staged(), tx).await?;
        Ok(Outcome::Processed(output))
    }

    /// A naturally idempotent handler: runs in a transaction every time, with no bookkeeping.
    pub(super) async fn natural<H: Handler>(
        &self,
        handler: &H,
        key: &InboxKey,
        message: H::Message,
        metadata: &Metadata,
    ) -> Result<Outcome<H::Output>> {
        let tx = self.inner.store.dialect().begin(&self.inner.db).await?;
        let cx = Context::new(&key.message_key, metadata, Some(&tx))
            .with_origin(key, self.inner.outbox.as_ref());
        let output = match run(handler, &cx, message).await {
            Ok(output) => output,
            Err(error) => return Err(outage_or(error, &tx).await),
        };
        // On PostgreSQL a statement that failed aborted the transaction, and its commit would
        // roll back while reporting success: one more statement tells.
        if let Err(error) = tx.execute_unprepared("SELECT 1").await {
            return Err(match classify(&error) {
                Failure::Aborted => Error::TransactionAborted { key: key.clone() },
                _ => error.into(),
            });
        }
        self.commit(cx.outbound().staged(), tx).await?;
        Ok(Outcome::Processed(output))
    }
}

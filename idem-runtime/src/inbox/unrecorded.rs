//! The modes that keep no inbox record: entity mode, where the handler's own entity marks the
//! message, and naturally idempotent handlers, which need no mark at all.

use sea_orm::{ConnectionTrait, DatabaseTransaction, Statement};

use super::handling::{abandon, outage_or_handler_error, run_handler};
use super::inner::Inner;
use crate::context::Context;
use crate::entity::slot::{MarkerSlot, MarkerWait, Verdict};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::handler::{Handler, Outcome};
use crate::key::InboxKey;
use crate::metadata::Metadata;
use crate::outbox::RunClaim;
use crate::store::dialect::{Failure, classify};

impl Inner {
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
        let store = &self.store;
        let tx = store.dialect().begin(&self.db).await?;
        let (wait, restore) = store.claim_wait();
        let slot = MarkerSlot::new(MarkerWait {
            dialect: store.dialect(),
            wait,
            restore: restore.to_owned(),
        });
        let cx = self
            .unrecorded_context(key, metadata, &tx)
            .with_marker(fingerprint, &slot);
        match self
            .run_marked(handler, key, &cx, &tx, &slot, message)
            .await
        {
            Ok(Outcome::Duplicate(output)) => {
                // Whatever the handler wrote after finding the marker goes.
                tx.rollback().await?;
                Ok(Outcome::Duplicate(output))
            }
            Ok(processed) => {
                self.commit(cx.outbound().staged(), tx).await?;
                Ok(processed)
            }
            Err(error) => Err(abandon(tx, error).await),
        }
    }

    /// What an entity-mode run's transaction runs before it ends: the handler, then the check
    /// that its marker is new (processed, to commit) or was there (a duplicate, to roll back).
    async fn run_marked<H: Handler>(
        &self,
        handler: &H,
        key: &InboxKey,
        cx: &Context<'_>,
        tx: &DatabaseTransaction,
        slot: &MarkerSlot,
        message: H::Message,
    ) -> Result<Outcome<H::Output>> {
        let result = run_handler(handler, cx, message).await;
        let marked = slot.take();
        // A refused marker and a reused key end the run whatever the handler made of them.
        if let Some(reason) = slot.refused() {
            return Err(Error::MarkerRefused {
                key: key.clone(),
                reason,
            });
        }
        if let Some(Verdict::Mismatch { stored, received }) = marked.as_ref().map(|m| m.verdict) {
            return Err(Error::FingerprintMismatch {
                key: key.clone(),
                stored,
                received,
            });
        }
        let output = match result {
            Ok(output) => output,
            Err(error) => return Err(outage_or_handler_error(error, tx).await),
        };
        let Some(marked) = marked else {
            // A marker tried and failed, its error ignored: the transaction cannot be trusted.
            if slot.attempted() {
                return Err(Error::TransactionAborted { key: key.clone() });
            }
            return Err(Error::MarkerMissing { key: key.clone() });
        };
        if marked.verdict == Verdict::Existing {
            return Ok(Outcome::Duplicate(output));
        }
        // The marker read back, in a transaction still open, is the run's last statement: a
        // transaction the database aborted (PostgreSQL) or rolled back (a MariaDB deadlock the
        // handler swallowed, after which statements commit on their own) no longer has it, and
        // its commit would not mean the entity is stored.
        match tx.query_one_raw(marked.find).await {
            Ok(Some(_)) => {}
            Ok(None) => return Err(Error::TransactionAborted { key: key.clone() }),
            Err(error) => return Err(aborted_or(error, key)),
        }
        self.still_open(tx, key).await?;
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
        let tx = self.store.dialect().begin(&self.db).await?;
        let cx = self.unrecorded_context(key, metadata, &tx);
        let output = match run_handler(handler, &cx, message).await {
            Ok(output) => output,
            Err(error) => {
                let error = outage_or_handler_error(error, &tx).await;
                return Err(abandon(tx, error).await);
            }
        };
        if let Err(error) = self.still_open(&tx, key).await {
            return Err(abandon(tx, error).await);
        }
        self.commit(cx.outbound().staged(), tx).await?;
        Ok(Outcome::Processed(output))
    }

    /// The context of a run without an inbox record. On MariaDB its stagings check that its
    /// transaction is still open, as the inbox's runs do; elsewhere a transaction that is lost
    /// fails its stagings (PostgreSQL) or is found before the commit.
    fn unrecorded_context<'a>(
        &'a self,
        key: &'a InboxKey,
        metadata: &'a Metadata,
        tx: &'a DatabaseTransaction,
    ) -> Context<'a> {
        let cx = Context::new(&key.message_key, metadata, Some(tx))
            .with_origin(key, self.outbox.as_ref());
        if self.store.dialect().tells_open_transaction() {
            return cx.with_run_claim(RunClaim {
                statements: self.run_statements.as_ref(),
                token: 0,
            });
        }
        cx
    }

    /// Fails unless `tx` is still the open transaction the run began: PostgreSQL refuses any
    /// statement in a transaction it aborted (whose commit would roll back while reporting
    /// success); MariaDB tells whether a deadlock rolled it back.
    async fn still_open(&self, tx: &DatabaseTransaction, key: &InboxKey) -> Result<()> {
        let sql = self.store.dialect().still_open();
        let backend = tx.get_database_backend();
        match tx.query_one_raw(Statement::from_string(backend, sql)).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(Error::TransactionAborted { key: key.clone() }),
            Err(error) => Err(aborted_or(error, key)),
        }
    }
}

/// A failed statement's error: a transaction the database aborted is `TransactionAborted`.
fn aborted_or(error: sea_orm::DbErr, key: &InboxKey) -> Error {
    match classify(&error) {
        Failure::Aborted => Error::TransactionAborted { key: key.clone() },
        _ => error.into(),
    }
}

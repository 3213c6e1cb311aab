//! Entity mode ([`Mode::Entity`](crate::Mode::Entity)): the business entity's own unique key
//! marks its message as processed, with no inbox record.
//!
//! The handler creates its entity with [`Context::create`], whose primary key it derives from
//! the message (an order's id, a payment's reference). Created: the message is new, and the
//! entity commits with the handler's other writes and stagings. Already there: the message is
//! a duplicate; the stored entity is compared with the message through [`Marker::fingerprint`],
//! and the run rolls back, acknowledged as [`Outcome::Duplicate`](crate::Outcome::Duplicate) or
//! dead-lettered as [`Error::FingerprintMismatch`](crate::Error::FingerprintMismatch) exactly as
//! the inbox does. Settle decisions, dead-letter reasons, the outcome counters, spans and logs
//! are the inbox's; a duplicate has no age (nothing records when its entity was created), so
//! the duplicate-age histogram and the summaries `idem retention advise` reads leave entity
//! duplicates out.
//!
//! # Choosing between the inbox and the entity
//!
//! | | inbox table (`Mode::Transactional`) | the entity (`Mode::Entity`) |
//! |---|---|---|
//! | what marks a message | a row per `(consumer, key)` in the inbox table | the entity's primary key |
//! | message types | any number share one table | one entity per handler; the message must create it |
//! | coupling | none: the business schema is untouched | the key and the content check live in the business type |
//! | retention | records expire and are cleaned: a redelivery after the retention runs again | as long as the entity lives: no retention to configure, no late duplicates; deleting the entity forgets the message |
//! | what a duplicate returns | the output stored the first time | what the handler builds from the stored entity |
//! | cost | one claim and one completion per message | the entity's insert, a read of it, and before the commit a read of it again and a check that the transaction is open; on PostgreSQL two statements more to bound the insert's wait |
//!
//! Choose the entity when each message creates exactly one entity whose identity the message
//! carries (an order placed, a payment captured): no second table and nothing to expire.
//! Choose the inbox when messages update rather than create, when several message types lead
//! to one entity, or when a duplicate must get the first run's output back unchanged.
//!
//! Two consumers creating the same entity from one message would see each other's entity as
//! their duplicate: an entity marks one consumer's messages. On MySQL/MariaDB, give the key
//! column a binary collation: under a collation that ignores case or trailing spaces, two
//! messages' keys would meet in one row (idem refuses such a meeting rather than take it for a
//! duplicate). On MySQL (not MariaDB) a deadlock the handler swallows cannot be told from the
//! transaction's outside: return the database's errors from the handler.

pub(crate) mod slot;

use sea_orm::sea_query::OnConflict;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseTransaction, DbBackend, DbErr,
    EntityTrait, IdenStatic, Insert, IntoActiveModel, Iterable, ModelTrait, PrimaryKeyToColumn,
    QueryFilter, QueryTrait, Select, SqlErr, Statement, Value,
};

use crate::context::Context;
use crate::fingerprint::Fingerprint;
use crate::store::dialect::Dialect;
use slot::{Marked, MarkerWait, Verdict};

/// An entity that marks the message it was created from as processed (entity mode): how its
/// stored form is compared with a redelivered message.
///
/// Return the fingerprint of the message the entity was made from: stored in a column the
/// handler filled from [`Context::fingerprint`] (`Fingerprint::to_hex` and `from_hex`), or
/// computed from the entity's fields the way the handler's `fingerprint = <expr>` computes it
/// from the message. `None` turns the check off: every copy is a duplicate.
pub trait Marker {
    /// The fingerprint of the message this entity was created from.
    fn fingerprint(&self) -> Option<Fingerprint>;
}

/// What [`Context::create`] found.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created<M> {
    /// The entity was created: the message is new.
    Fresh(M),
    /// The entity was there already: the message is a duplicate, and this is the stored entity.
    /// Return the output a duplicate gets; whatever the handler writes after this is rolled
    /// back.
    Existing(M),
}

impl<M> Created<M> {
    /// The entity, created or stored.
    pub fn into_inner(self) -> M {
        match self {
            Created::Fresh(model) | Created::Existing(model) => model,
        }
    }

    /// Whether the entity was created by this call.
    pub fn is_fresh(&self) -> bool {
        matches!(self, Created::Fresh(_))
    }
}

/// The model an active model `A` stores.
type ModelOf<A> = <<A as ActiveModelTrait>::Entity as EntityTrait>::Model;

impl Context<'_> {
    /// In entity mode, creates the marker: `entity`, whose primary key is set from the message,
    /// in the handler's transaction, unless an entity with that key exists. Call it once per
    /// run, before the run's other writes; create the handler's other entities with sea-orm's
    /// own inserts.
    ///
    /// The insert is the database's arbiter of concurrent copies: `ON CONFLICT DO NOTHING` on
    /// the primary key (PostgreSQL, SQLite), the duplicate-key error (MySQL/MariaDB, where it
    /// leaves the transaction usable). A copy racing the first waits for its transaction at
    /// most the inbox's claim wait (PostgreSQL, MariaDB), then finds its entity, or gives up
    /// as contention and is requeued uncounted.
    ///
    /// A stored entity whose key differs from this one's although the database took them for
    /// the same (a MySQL/MariaDB collation that ignores case or trailing spaces) is refused, not
    /// taken for a duplicate: give the key column a binary collation.
    ///
    /// # Errors
    ///
    /// The database's error, to return from the handler as its own. A context without a
    /// transaction (two-phase mode) is refused; so are a second call in a run, an entity without
    /// its primary key set and a key the collation merged with another, and the run then ends
    /// in [`Error::MarkerRefused`](crate::Error::MarkerRefused), dead-lettered, whatever the
    /// handler returns.
    pub async fn create<A>(&self, entity: A) -> Result<Created<ModelOf<A>>, DbErr>
    where
        A: ActiveModelTrait + Send,
        ModelOf<A>: Marker + IntoActiveModel<A>,
    {
        let Some(tx) = self.transaction() else {
            return Err(DbErr::Custom(
                "Context::create writes through the handler's transaction; this run has none \
                 (two-phase mode)"
                    .to_owned(),
            ));
        };
        let slot = self.marker_slot();
        let refuse = |reason: String| {
            if let Some(slot) = slot {
                slot.refuse(&reason);
            }
            DbErr::Custom(reason)
        };
        if slot.is_some_and(|slot| !slot.attempt()) {
            return Err(refuse(
                "Context::create creates the run's marker, once: create other entities with \
                 sea-orm's own inserts"
                    .to_owned(),
            ));
        }
        let backend = tx.get_database_backend();
        let key = primary_key(&entity).map_err(refuse)?;
        let find = by_key::<A::Entity>(&key);
        let created = insert(tx, slot.map(|slot| &slot.wait), entity).await?;
        let (model, verdict) = match created {
            Ok(()) => (read(tx, backend, &find).await?, Verdict::Fresh),
            Err(conflict) => {
                let Some(model) = read_existing(tx, backend, &find).await? else {
                    // Another unique key of the entity conflicted, not its primary key.
                    return Err(conflict.unwrap_or_else(|| missing(backend, &find)));
                };
                if Dialect::new(backend).collations_merge_keys() {
                    same_key(&model, &key).map_err(refuse)?;
                }
                let verdict = compare(model.fingerprint(), self.fingerprint());
                (model, verdict)
            }
        };
        if let Some(slot) = slot {
            slot.mark(Marked {
                verdict,
                find: find.build(backend),
            });
        }
        Ok(match verdict {
            Verdict::Fresh => Created::Fresh(model),
            _ => Created::Existing(model),
        })
    }
}

/// The columns of an entity type's primary key.
type KeyOf<E> = Vec<(<E as EntityTrait>::Column, Value)>;

/// `entity`'s primary key, all of whose columns must be set.
fn primary_key<A: ActiveModelTrait>(entity: &A) -> Result<KeyOf<A::Entity>, String> {
    <A::Entity as EntityTrait>::PrimaryKey::iter()
        .map(|key| {
            let column = key.into_column();
            match entity.get(column).into_value() {
                Some(value) => Ok((column, value)),
                None => Err(format!(
                    "the marker entity's primary key column {} is not set: set it from the \
                     message",
                    column.as_str()
                )),
            }
        })
        .collect()
}

/// The select of the row whose primary key is `key`.
fn by_key<E: EntityTrait>(key: &KeyOf<E>) -> Select<E> {
    key.iter().fold(E::find(), |find, (column, value)| {
        find.filter(column.eq(value.clone()))
    })
}

/// Refuses a stored entity whose key the database merged with `key` (a MySQL/MariaDB
/// collation that ignores case or trailing spaces): another message's entity, not this one's.
fn same_key<M: ModelTrait>(stored: &M, key: &KeyOf<M::Entity>) -> Result<(), String> {
    for (column, value) in key {
        let theirs = stored.get(*column);
        if &theirs != value {
            return Err(format!(
                "the marker key {value:?} found the stored entity of {theirs:?}: the column {}'s \
                 collation takes them for one; give it a binary collation",
                column.as_str()
            ));
        }
    }
    Ok(())
}

/// Inserts `entity`, waiting at most the marker's wait for a transaction that holds its key:
/// `Ok(())` when created, `Err` when its primary key was taken, with the duplicate-key error on
/// MySQL/MariaDB (returned if the conflict was not the primary key's).
async fn insert<A: ActiveModelTrait>(
    tx: &DatabaseTransaction,
    wait: Option<&MarkerWait>,
    entity: A,
) -> Result<Result<(), Option<DbErr>>, DbErr>
where
    ModelOf<A>: IntoActiveModel<A>,
{
    let backend = tx.get_database_backend();
    // Where a taken key is met with the duplicate-key error, which leaves the transaction
    // usable, the insert is plain.
    let as_errors = Dialect::new(backend).conflicts_as_errors();
    let mut statement = Insert::one(entity).into_query();
    if !as_errors {
        let keys =
            <A::Entity as EntityTrait>::PrimaryKey::iter().map(PrimaryKeyToColumn::into_column);
        statement.on_conflict(OnConflict::columns(keys).do_nothing().to_owned());
    }
    let mut statement = backend.build(&statement);
    // Where lock waits are bounded for the transaction rather than per statement, the bound
    // is set before the insert and restored after it.
    let bound = wait.and_then(|wait| Some((wait, wait.dialect.set_lock_timeout()?)));
    if let Some(wait) = wait {
        statement.sql = wait.dialect.with_lock_wait(&statement.sql, wait.wait);
    }
    if let Some((wait, set)) = bound {
        let millis = wait.wait.as_millis().max(1).to_string();
        bound_lock_wait(tx, wait.dialect, set, &millis).await?;
    }
    let result = tx.execute_raw(statement).await;
    if let Some((wait, set)) = bound
        && result.is_ok()
    {
        bound_lock_wait(tx, wait.dialect, set, &wait.restore).await?;
    }
    match result {
        Ok(done) if as_errors || done.rows_affected() == 1 => Ok(Ok(())),
        Ok(_) => Ok(Err(None)),
        // `ON DUPLICATE KEY UPDATE` cannot tell a conflict from an insert under
        // CLIENT_FOUND_ROWS; the duplicate-key error can, and leaves the transaction usable.
        Err(error)
            if as_errors
                && matches!(error.sql_err(), Some(SqlErr::UniqueConstraintViolation(_))) =>
        {
            Ok(Err(Some(error)))
        }
        Err(error) => Err(error),
    }
}

/// Bounds lock waits for the rest of the transaction with `set` (PostgreSQL's `lock_timeout`).
async fn bound_lock_wait(
    tx: &DatabaseTransaction,
    dialect: Dialect,
    set: &str,
    timeout: &str,
) -> Result<(), DbErr> {
    let set = Statement::from_sql_and_values(
        dialect.backend(),
        dialect.placeholders(set),
        [Value::from(timeout.to_owned())],
    );
    tx.query_one_raw(set).await.map(drop)
}

/// Reads the entity this run just created.
async fn read<E: EntityTrait>(
    tx: &impl ConnectionTrait,
    backend: DbBackend,
    find: &Select<E>,
) -> Result<E::Model, DbErr> {
    let found = find.clone().one(tx).await?;
    found.ok_or_else(|| missing(backend, find))
}

/// Reads the entity another run created: on MySQL/MariaDB with a shared lock, which reads the
/// newest committed row whatever the transaction's snapshot (and, being shared, does not
/// deadlock with the other copies reading it too).
async fn read_existing<E: EntityTrait>(
    tx: &impl ConnectionTrait,
    backend: DbBackend,
    find: &Select<E>,
) -> Result<Option<E::Model>, DbErr> {
    let locking = Dialect::new(backend).locking_read();
    if locking.is_empty() {
        return find.clone().one(tx).await;
    }
    let mut statement = find.build(backend);
    statement.sql.push_str(locking);
    find.clone().from_raw_sql(statement).one(tx).await
}

fn missing<E: EntityTrait>(backend: DbBackend, find: &Select<E>) -> DbErr {
    DbErr::RecordNotFound(format!(
        "the marker entity was not found by its primary key: {}",
        find.build(backend)
    ))
}

/// A duplicate's verdict: a mismatch only when both sides have a fingerprint and they differ.
fn compare(stored: Option<Fingerprint>, received: Option<Fingerprint>) -> Verdict {
    match (stored, received) {
        (Some(stored), Some(received)) if stored != received => {
            Verdict::Mismatch { stored, received }
        }
        _ => Verdict::Existing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_two_fingerprints_that_differ_are_a_mismatch() {
        let a = Fingerprint::of_bytes(b"a");
        let b = Fingerprint::of_bytes(b"b");
        assert_eq!(compare(Some(a), Some(a)), Verdict::Existing);
        assert_eq!(compare(None, Some(a)), Verdict::Existing);
        assert_eq!(compare(Some(a), None), Verdict::Existing);
        assert_eq!(
            compare(Some(a), Some(b)),
            Verdict::Mismatch {
                stored: a,
                received: b
            }
        );
    }
}

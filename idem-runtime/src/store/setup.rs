//! What an inbox reads of its table when it starts: its creation, a probe that the table
//! keeps what it is given (keys compared byte for byte, every column as wide as idem writes),
//! and the settings its statements depend on (MySQL's unique key, packet limit, PostgreSQL's
//! lock timeout).

use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, TransactionOptions, Value};

use super::access::Store;
use super::dialect::{Failure, begin_detached, classify, lock_name};
use super::values::{ClaimValues, Probed, Status, text};
use crate::key::{ConsumerName, InboxKey, MessageKey};

/// What an inbox reads of its table when it starts, on an inbox's [`Store`].
pub(crate) struct Setup<'s>(&'s mut Store);

impl<'s> Setup<'s> {
    /// The room of `store`.
    pub(crate) fn of(store: &'s mut Store) -> Self {
        Self(store)
    }

    /// Reads which unique index of a MySQL/MariaDB table is on `(consumer, message_key)`: the
    /// primary key of the table idem creates, or the index a table provisioned otherwise has.
    /// Batch statements that look many keys up name it, so that the server looks each key up
    /// and locks only its record, where a plan that scans would lock every record it reads.
    pub(crate) async fn read_key_index(&mut self, db: &DatabaseConnection) -> Result<(), DbErr> {
        let Some(sql) = self.0.dialect.key_index_query() else {
            return Ok(());
        };
        let rows = db
            .query_all_raw(self.0.statement(sql, vec![text(self.0.table.as_str())]))
            .await?;
        for row in rows {
            let name: String = row.try_get_by_index(0)?;
            let columns: String = row.try_get_by_index(1)?;
            let prefixed: i64 = row.try_get_by_index(2)?;
            if columns == "consumer,message_key" && prefixed == 0 {
                self.0.key_index = Some(self.0.dialect.key_index_hint(&name));
                break;
            }
        }
        Ok(())
    }

    /// Reads the largest packet a MySQL/MariaDB server takes, which an output must leave room
    /// under (see [`Store::check_output`]).
    pub(crate) async fn read_packet_limit(&mut self, db: &DatabaseConnection) -> Result<(), DbErr> {
        if let Some(sql) = self.0.dialect.packet_limit_query() {
            let limit: i64 = self.0.first_column(db, sql, Vec::new()).await?;
            self.0.packet_limit = usize::try_from(limit).ok();
        }
        Ok(())
    }

    /// Reads the `lock_timeout` PostgreSQL sessions have, which claims restore after bounding
    /// their own wait.
    pub(crate) async fn read_lock_timeout(&mut self, db: &DatabaseConnection) -> Result<(), DbErr> {
        if let Some(sql) = self.0.dialect.read_lock_timeout()
            && let Some(row) = db.query_one_raw(self.0.statement(sql, Vec::new())).await?
        {
            self.0.lock_timeout = row.try_get_by_index(0)?;
        }
        Ok(())
    }

    /// Creates the table and its index if they do not exist. On PostgreSQL, whose
    /// `CREATE ... IF NOT EXISTS` races between sessions, creators take turns under a lock.
    pub(crate) async fn create_table(&self, db: &DatabaseConnection) -> Result<(), DbErr> {
        let tx = begin_detached(db, TransactionOptions::default()).await?;
        if let Some((sql, values)) =
            (self.0.dialect).schema_lock(&lock_name("schema", self.0.table.as_str()))
        {
            tx.query_one_raw(self.0.statement(&sql, values)).await?;
        }
        for sql in self.0.dialect.inbox_tables(self.0.table.as_str()) {
            tx.execute_unprepared(&sql).await?;
        }
        tx.commit().await
    }

    /// Checks that the table has the schema this version writes and reads: claims a record with
    /// the widest values a claim can have, completes it and reads it back, in a transaction that
    /// is rolled back. A table created by another version fails here, at start-up, instead of
    /// failing every message. The probe's key is this call's own, so replicas starting together
    /// do not wait for each other's probes.
    pub(crate) async fn check_schema(&self, db: &DatabaseConnection) -> Result<(), DbErr> {
        let tx = begin_detached(db, TransactionOptions::default()).await?;
        let unique = uuid::Uuid::new_v4().simple().to_string();
        let key = InboxKey {
            consumer: ConsumerName::new("c".repeat(ConsumerName::MAX_LEN)).expect("valid"),
            message_key: MessageKey::new(format!(
                "{}{unique}",
                "k".repeat(MessageKey::MAX_LEN - unique.len())
            ))
            .expect("valid"),
        };
        let fingerprint = [0xab; 32];
        let [consumer, message_key] = Store::key_values(&key);
        let values = vec![
            consumer,
            message_key,
            text(Status::InProgress.as_str()),
            Value::from(fingerprint.to_vec()),
            Value::from(i64::from(u32::MAX)),
            Value::from(i64::MIN),
            Value::from(i64::MAX),
            Value::from(i64::MAX),
            Value::from(i64::MAX),
            Value::from(i64::MAX),
            Value::from(i64::MAX),
            Value::from(None::<String>),
        ];
        tx.execute_raw(self.0.statement(&self.0.sql.insert_probe, values))
            .await?;
        let completed = self
            .0
            .complete(&tx, &key, i64::MIN, Some("{}"), Duration::ZERO)
            .await?;
        let row = self.0.find(&tx, &key).await?;
        let merged = self.keys_merged(&tx, &key, &unique).await;
        tx.rollback().await?;
        if let Some(merged) = merged? {
            return Err(DbErr::Custom(format!(
                "the table takes keys that differ only {merged} for one another: it needs a \
                 unique key on the whole (consumer, message_key) columns comparing their bytes \
                 (a binary collation)"
            )));
        }
        match row {
            Some(row)
                if completed
                    && row.fingerprint.as_deref() == Some(&fingerprint[..])
                    && row.claim_token == i64::MIN
                    && row.status == Status::Completed.as_str()
                    && row.output.as_deref() == Some("{}") =>
            {
                Ok(())
            }
            other => Err(DbErr::Custom(format!(
                "a probe record did not read back as written: {other:?}"
            ))),
        }
    }

    /// Checks that the table has every column this version reads, with a query that reads no
    /// row and writes nothing: what a read-only user or a standby can check.
    pub(crate) async fn check_columns(&self, db: &DatabaseConnection) -> Result<(), DbErr> {
        db.query_all_raw(self.0.statement(&self.0.sql.check_columns, Vec::new()))
            .await?;
        Ok(())
    }

    /// Claims keys that a table made by someone else could take for one another, beside the
    /// probe record `probe`: the probe's key again (no unique key), then pairs that differ only
    /// in case, a trailing space, an accent, a 4-byte character, or past a prefix. Returns how
    /// the first pair the table merged differs.
    async fn keys_merged(
        &self,
        conn: &impl ConnectionTrait,
        probe: &InboxKey,
        unique: &str,
    ) -> Result<Option<&'static str>, DbErr> {
        let claim = ClaimValues {
            fingerprint: None,
            attempts: 1,
            claim_token: 0,
            created_at: None,
            lease: None,
            retention: Duration::ZERO,
        };
        if self.0.insert_claim(conn, probe, &claim).await? {
            return Ok(Some("in nothing (one key is claimed twice)"));
        }
        let key = |consumer: &str, message_key: String| InboxKey {
            consumer: ConsumerName::new(format!("{consumer}{unique}")).expect("a valid name"),
            message_key: MessageKey::new(message_key).expect("a valid key"),
        };
        let pair = |at: usize, first: &str, second: &str| {
            let ours = |suffix| key("c", format!("{unique}-{at}{suffix}"));
            (Some(ours(first)), ours(second))
        };
        // The probe's key but its last character, not a hexadecimal digit.
        let long = InboxKey {
            consumer: probe.consumer.clone(),
            message_key: MessageKey::new(format!(
                "{}x",
                &probe.message_key.as_str()[..MessageKey::MAX_LEN - 1]
            ))
            .expect("a valid key"),
        };
        let consumers = (
            Some(key("c", format!("{unique}-0"))),
            key("C", format!("{unique}-0")),
        );
        let pairs = [
            (consumers, "in the consumer name's case"),
            (pair(1, "a", "A"), "in case"),
            (pair(2, "a", "a "), "in a trailing space"),
            (pair(3, "a", "\u{e1}"), "in an accent"),
            (pair(4, "\u{1f600}", "\u{1f601}"), "in a 4-byte character"),
            // The probe's own record is the first.
            ((None, long), "in their last byte"),
        ];
        for ((first, second), difference) in &pairs {
            if self
                .pair_merged(conn, first.as_ref(), second, &claim)
                .await?
            {
                return Ok(Some(difference));
            }
        }
        Ok(None)
    }

    /// Claims `first` (unless it is already recorded), then `second`, under a savepoint: whether
    /// the table took `second` for `first`. A key the table refuses outright (a constraint of its
    /// operators, a character its encoding lacks) tells nothing of its key, and is rolled back.
    async fn pair_merged(
        &self,
        conn: &impl ConnectionTrait,
        first: Option<&InboxKey>,
        second: &InboxKey,
        claim: &ClaimValues<'_>,
    ) -> Result<bool, DbErr> {
        conn.execute_unprepared("SAVEPOINT idem_keys").await?;
        let tried = async {
            if let Some(first) = first
                && self.probe_claim(conn, first, claim).await? != Probed::Stored
            {
                return Ok(false);
            }
            Ok(self.probe_claim(conn, second, claim).await? == Probed::Duplicate)
        };
        match tried.await {
            Ok(merged) => {
                conn.execute_unprepared("RELEASE SAVEPOINT idem_keys")
                    .await?;
                Ok(merged)
            }
            Err(error) if classify(&error) == Failure::Unreachable => Err(error),
            Err(_) => {
                conn.execute_unprepared("ROLLBACK TO SAVEPOINT idem_keys")
                    .await?;
                Ok(false)
            }
        }
    }

    /// Claims `key` as a claim does, telling a duplicate key from a row the table drops:
    /// MySQL/MariaDB's `INSERT IGNORE` drops both without an error (and stores a character its
    /// column cannot hold as `?`); with `ON DUPLICATE KEY UPDATE` a duplicate counts two rows.
    async fn probe_claim(
        &self,
        conn: &impl ConnectionTrait,
        key: &InboxKey,
        claim: &ClaimValues<'_>,
    ) -> Result<Probed, DbErr> {
        let Some(sql) = self.0.dialect.counting_probe(&self.0.sql.insert_claim) else {
            // Elsewhere a refused row is an error.
            return Ok(match self.0.insert_claim(conn, key, claim).await? {
                true => Probed::Stored,
                false => Probed::Duplicate,
            });
        };
        let result = conn
            .execute_raw(self.0.statement(&sql, self.0.claim_values(key, claim)))
            .await?;
        Ok(match result.rows_affected() {
            0 => Probed::Dropped,
            1 => Probed::Stored,
            _ => Probed::Duplicate,
        })
    }
}

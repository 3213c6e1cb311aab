//! A hand-written handler for tests: it records one effect row per run, in its transaction or
//! (two-phase) straight on the connection, and can be told to fail, panic or dawdle.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_runtime::{
    Context, Fingerprint, FingerprintError, Handler, KeyError, MessageKey, Metadata, Mode,
};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr};
use serde::{Deserialize, Serialize};

use crate::db::TestDb;

/// A test message: its id is the key, its body the content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Msg {
    /// The key.
    pub id: String,
    /// The content.
    pub body: String,
}

impl Msg {
    /// A message.
    pub fn new(id: impl Into<String>, body: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            body: body.into(),
        }
    }
}

/// Why the recorder failed.
#[derive(Debug, thiserror::Error)]
pub enum RecorderError {
    /// A failure it was told to produce.
    #[error("failing on purpose ({permanent})")]
    OnPurpose {
        /// Whether the handler calls it permanent.
        permanent: bool,
    },
    /// Its effect could not be written.
    #[error(transparent)]
    Db(#[from] DbErr),
}

/// The recording handler.
#[derive(Debug, Clone)]
pub struct Recorder {
    /// Consumer name.
    pub consumer: String,
    /// Tag put in the output, to tell runs apart.
    pub tag: String,
    /// Processing mode.
    pub mode: Mode,
    /// Whether content is fingerprinted.
    pub fingerprint: bool,
    /// The handler's own retention.
    pub retention: Option<Duration>,
    /// How long the handler waits before writing its effect.
    pub delay: Duration,
    /// Whether its failures are permanent.
    pub permanent: bool,
    failures: Arc<AtomicU32>,
    panics: Arc<AtomicU32>,
    attempts: Arc<Mutex<Vec<u32>>>,
    effects: String,
    db: DatabaseConnection,
}

impl Recorder {
    /// A transactional recorder writing into `effects` of `db`.
    pub fn new(db: &TestDb, effects: &str, consumer: &str) -> Self {
        Self {
            consumer: consumer.to_owned(),
            tag: "run".to_owned(),
            mode: Mode::Transactional,
            fingerprint: true,
            retention: None,
            delay: Duration::ZERO,
            permanent: false,
            failures: Arc::default(),
            panics: Arc::default(),
            attempts: Arc::default(),
            effects: effects.to_owned(),
            db: db.db.clone(),
        }
    }

    /// Two-phase mode with `lease`.
    pub fn two_phase(mut self, lease: Duration) -> Self {
        self.mode = Mode::TwoPhase { lease };
        self
    }

    /// The output tag.
    pub fn tagged(mut self, tag: &str) -> Self {
        self.tag = tag.to_owned();
        self
    }

    /// Waits `delay` before writing the effect.
    pub fn slow(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Fails the next `n` runs, after writing the effect.
    pub fn fail_next(&self, n: u32) {
        self.failures.store(n, Ordering::SeqCst);
    }

    /// Panics in the next `n` runs, after writing the effect.
    pub fn panic_next(&self, n: u32) {
        self.panics.store(n, Ordering::SeqCst);
    }

    /// The attempt numbers of every run so far.
    pub fn attempts(&self) -> Vec<u32> {
        self.attempts.lock().unwrap().clone()
    }

    fn take(counter: &AtomicU32) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

impl Handler for Recorder {
    type Message = Msg;
    type Output = String;
    type Error = RecorderError;

    fn consumer(&self) -> &str {
        &self.consumer
    }

    fn key(&self, message: &Msg, _: &Metadata) -> Result<MessageKey, KeyError> {
        MessageKey::new(message.id.as_str())
    }

    fn fingerprint(&self, message: &Msg) -> Result<Option<Fingerprint>, FingerprintError> {
        if self.fingerprint {
            Fingerprint::of(message).map(Some)
        } else {
            Ok(None)
        }
    }

    fn mode(&self) -> Mode {
        self.mode
    }

    fn retention(&self) -> Option<Duration> {
        self.retention
    }

    fn is_permanent(&self, _: &RecorderError) -> bool {
        self.permanent
    }

    async fn handle(&self, cx: &Context<'_>, message: Msg) -> Result<String, RecorderError> {
        self.attempts.lock().unwrap().push(cx.attempt());
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let sql = format!(
            "INSERT INTO {} (consumer, message_key, body) VALUES (?, ?, ?)",
            self.effects
        );
        let values = vec![
            self.consumer.clone().into(),
            cx.message_key().as_str().to_owned().into(),
            message.body.clone().into(),
        ];
        match cx.transaction() {
            Some(tx) => {
                let stmt = crate::db::statement(tx.get_database_backend(), &sql, values);
                tx.execute_raw(stmt).await?;
            }
            None => {
                let stmt = crate::db::statement(self.db.get_database_backend(), &sql, values);
                self.db.execute_raw(stmt).await?;
            }
        }
        if Self::take(&self.failures) {
            return Err(RecorderError::OnPurpose {
                permanent: self.permanent,
            });
        }
        if Self::take(&self.panics) {
            panic!("recorder panics on purpose");
        }
        Ok(format!("{}:{}", self.tag, message.body))
    }
}

//! A hand-written handler for tests: it records one effect row per run, in its transaction or
//! (two-phase) straight on the connection, and can be told to fail, panic or dawdle.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_runtime::fingerprint::{Fingerprint, FingerprintError};
use idem_runtime::{Context, Handler, KeyError, MessageKey, Metadata, Mode};
use sea_orm::{DatabaseConnection, DbErr};
use serde::{Deserialize, Serialize};

use crate::db::{TestDb, insert_effect};

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

/// Something to do once, right after the first run wrote its effect.
pub type Hook = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A message body on which [`Recorder`]'s key panics.
pub const PANICS_IN_KEY: &str = "panic in key";

/// A message body on which [`Recorder`]'s fingerprint panics.
pub const PANICS_IN_FINGERPRINT: &str = "panic in fingerprint";

/// The recording handler.
#[derive(Clone)]
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
    /// Whether the key is the transport's message id rather than the message's `id`.
    pub key_from_message_id: bool,
    failures: Arc<AtomicU32>,
    panics: Arc<AtomicU32>,
    attempts: Arc<Mutex<Vec<u32>>>,
    /// Runs under way, and the most there were at once.
    running: Arc<(AtomicU32, AtomicU32)>,
    hook: Option<Hook>,
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
            key_from_message_id: false,
            failures: Arc::default(),
            panics: Arc::default(),
            attempts: Arc::default(),
            running: Arc::default(),
            hook: None,
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

    /// Keys messages on the transport's message id.
    pub fn keyed_by_message_id(mut self) -> Self {
        self.key_from_message_id = true;
        self
    }

    /// Runs `hook` once, after the first run wrote its effect and before the handler returns.
    pub fn after_first_effect<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.hook = Some(Arc::new(move || Box::pin(hook())));
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

    /// The most runs that were under way at once.
    pub fn most_at_once(&self) -> u32 {
        self.running.1.load(Ordering::SeqCst)
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

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("consumer", &self.consumer)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl Handler for Recorder {
    type Message = Msg;
    type Output = String;
    type Error = RecorderError;

    fn consumer(&self) -> &str {
        &self.consumer
    }

    fn key(&self, message: &Msg, metadata: &Metadata) -> Result<MessageKey, KeyError> {
        assert_ne!(message.body, PANICS_IN_KEY, "a key expression panicking");
        if self.key_from_message_id {
            let id = metadata
                .message_id()
                .ok_or(KeyError::Missing("message id"))?;
            MessageKey::new(id)
        } else {
            MessageKey::new(message.id.as_str())
        }
    }

    fn fingerprint(
        &self,
        message: &Msg,
        meta: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        assert_ne!(
            message.body, PANICS_IN_FINGERPRINT,
            "a fingerprint panicking"
        );
        if self.fingerprint {
            meta.content_fingerprint(message).map(Some)
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
        let _running = Running::start(&self.running);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let (key, body) = (cx.message_key().as_str(), message.body.as_str());
        match cx.transaction() {
            Some(tx) => insert_effect(tx, &self.effects, &self.consumer, key, body).await?,
            None => insert_effect(&self.db, &self.effects, &self.consumer, key, body).await?,
        }
        if let Some(hook) = &self.hook
            && self.attempts.lock().unwrap().len() == 1
        {
            hook().await;
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

/// Counts a run while it is under way, noting the most at once.
struct Running<'a>(&'a (AtomicU32, AtomicU32));

impl<'a> Running<'a> {
    fn start(counts: &'a (AtomicU32, AtomicU32)) -> Self {
        let now = counts.0.fetch_add(1, Ordering::SeqCst) + 1;
        counts.1.fetch_max(now, Ordering::SeqCst);
        Self(counts)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::SeqCst);
    }
}

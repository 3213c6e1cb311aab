//! Items used by the code `#[idempotent]` generates. Not a public API: it changes without notice.
//!
//! The macro names everything through this module (`::idem_runtime::__private::...`), so the
//! user's crate needs no other dependency and no import for the generated code to compile.

use std::fmt;
use std::pin::Pin;

use serde::Serialize;
use serde::de::DeserializeOwned;

pub use std::boxed::Box;
pub use std::future::Future;
pub use std::marker::{Send, Sync};
pub use std::option::Option::{self, None, Some};
pub use std::result::Result::{self, Ok};
pub use std::sync::Arc;
pub use std::time::Duration;
pub use std::{assert, concat, module_path};

pub use sea_orm::DatabaseTransaction;

pub use crate::fingerprint::{Fingerprint, FingerprintError};
pub use crate::handler::{Context, Handler, Mode};
pub use crate::key::{ConsumerName, KeyError, KeySource, MessageKey};
pub use crate::metadata::Metadata;

/// A boxed, `Send` future: what a method handler's hidden `handle` function returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The hidden function that calls a handler method on a clone of its service's `Arc`.
pub type HandleFn<S, M, O, E> =
    for<'a> fn(Arc<S>, &'a Context<'a>, M) -> BoxFuture<'a, Result<O, E>>;

/// The return type of an idempotent handler: a `Result<T, E>`, however it is spelled
/// (`Result<T, E>`, `anyhow::Result<T>`, a crate's own `type Result<T> = ...`).
#[diagnostic::on_unimplemented(
    message = "an idempotent handler must return `Result<T, E>`, not `{Self}`",
    label = "not a `Result`",
    note = "the `Ok` value is stored and returned again for duplicates; the `Err` value makes the inbox record nothing"
)]
pub trait HandlerResult {
    /// The `Ok` type.
    type Output;
    /// The `Err` type.
    type Error;
}

impl<T, E> HandlerResult for Result<T, E> {
    type Output = T;
    type Error = E;
}

/// The `Ok` type of a handler's return type.
pub type OutputOf<R> = <R as HandlerResult>::Output;

/// The `Err` type of a handler's return type.
pub type ErrorOf<R> = <R as HandlerResult>::Error;

/// The key made from a `key = <expr>` expression.
#[inline]
pub fn key_of<K: KeySource + ?Sized>(source: &K) -> Result<MessageKey, KeyError> {
    source.to_message_key()
}

/// The fingerprint of a `fingerprint = <expr>` expression.
#[inline]
pub fn fingerprint_of<T: Serialize + ?Sized>(
    value: &T,
) -> Result<Option<Fingerprint>, FingerprintError> {
    Fingerprint::of(value).map(Some)
}

/// The fingerprint of the whole message, by default: the payload as received when the transport
/// gave it.
#[inline]
pub fn content_fingerprint<T: Serialize + ?Sized>(
    message: &T,
    metadata: &Metadata,
) -> Result<Option<Fingerprint>, FingerprintError> {
    metadata.content_fingerprint(message).map(Some)
}

/// The transaction of a transactional handler's context.
///
/// # Panics
///
/// When the handler is driven without a transaction, which the [`Inbox`](crate::Inbox) never
/// does: the macro makes a handler transactional exactly when the function takes one.
#[track_caller]
pub fn transaction<'a>(cx: &Context<'a>) -> &'a DatabaseTransaction {
    match cx.transaction() {
        Some(tx) => tx,
        None => panic!(
            "a transactional #[idempotent] handler was run without a transaction: run it through `Inbox::process`"
        ),
    }
}

/// What a method handler is made of: its settings and the hidden associated functions the macro
/// generates next to the method.
pub struct MethodSpec<S, M, O, E> {
    /// The consumer name.
    pub consumer: &'static str,
    /// The processing mode.
    pub mode: Mode,
    /// The handler's own retention.
    pub retention: Option<Duration>,
    /// Derives the message key.
    pub key: fn(&M, &Metadata) -> Result<MessageKey, KeyError>,
    /// Fingerprints the message.
    pub fingerprint: fn(&M, &Metadata) -> Result<Option<Fingerprint>, FingerprintError>,
    /// Whether an error is permanent.
    pub permanent: fn(&E) -> bool,
    /// Runs the method on a clone of the service's `Arc` (the future then borrows only the
    /// context).
    pub handle: HandleFn<S, M, O, E>,
}

impl<S, M, O, E> fmt::Debug for MethodSpec<S, M, O, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MethodSpec")
            .field("consumer", &self.consumer)
            .field("mode", &self.mode)
            .field("retention", &self.retention)
            .finish_non_exhaustive()
    }
}

/// Never permanent: the default of `permanent = ...`.
pub fn never_permanent<E>(_: &E) -> bool {
    false
}

/// The handler of an `#[idempotent]` method: the service behind an `Arc` and the generated
/// functions that call the method on it.
pub struct MethodHandler<S, M, O, E> {
    service: Arc<S>,
    spec: MethodSpec<S, M, O, E>,
}

impl<S, M, O, E> MethodHandler<S, M, O, E> {
    /// A handler calling the method on `service`.
    pub fn new(service: &Arc<S>, spec: MethodSpec<S, M, O, E>) -> Self {
        Self {
            service: Arc::clone(service),
            spec,
        }
    }
}

/// The handler of a method, checked: each unmet bound is reported on the type argument that
/// lacks it, which the macro spans at the user's own type.
pub fn method_handler<S, M, O, E>(
    service: &Arc<S>,
    spec: MethodSpec<S, M, O, E>,
) -> impl Handler<Message = M, Output = O, Error = E> + 'static
where
    S: Send + Sync + 'static,
    M: Send + 'static,
    O: Serialize + DeserializeOwned + Send + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    MethodHandler::new(service, spec)
}

impl<S, M, O, E> fmt::Debug for MethodHandler<S, M, O, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MethodHandler")
            .field("service", &std::any::type_name::<S>())
            .field("spec", &self.spec)
            .finish()
    }
}

impl<S, M, O, E> Handler for MethodHandler<S, M, O, E>
where
    S: Send + Sync + 'static,
    M: Send + 'static,
    O: Serialize + DeserializeOwned + Send + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    type Message = M;
    type Output = O;
    type Error = E;

    fn consumer(&self) -> &str {
        self.spec.consumer
    }

    fn key(&self, message: &M, metadata: &Metadata) -> Result<MessageKey, KeyError> {
        (self.spec.key)(message, metadata)
    }

    fn fingerprint(
        &self,
        message: &M,
        metadata: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        (self.spec.fingerprint)(message, metadata)
    }

    fn mode(&self) -> Mode {
        self.spec.mode
    }

    fn retention(&self) -> Option<Duration> {
        self.spec.retention
    }

    fn is_permanent(&self, error: &E) -> bool {
        (self.spec.permanent)(error)
    }

    fn handle(&self, cx: &Context<'_>, message: M) -> impl Future<Output = Result<O, E>> + Send {
        (self.spec.handle)(Arc::clone(&self.service), cx, message)
    }
}

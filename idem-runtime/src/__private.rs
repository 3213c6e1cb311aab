//! Items used by the code `#[idempotent]` generates. Not a public API: it changes without notice.
//!
//! The macro names everything through this module (`::idem_runtime::__private::...`), so the
//! user's crate needs no other dependency and no import for the generated code to compile.

use std::convert::Infallible;
use std::fmt;
use std::pin::Pin;

use futures_util::TryFutureExt;

pub use serde::Serialize;
pub use serde::de::DeserializeOwned;
pub use std::error::Error as StdError;

pub use std::boxed::Box;
pub use std::future::Future;
pub use std::marker::{PhantomData, Send, Sync};
pub use std::option::Option::{self, None, Some};
pub use std::result::Result::{self, Err, Ok};
pub use std::sync::Arc;
pub use std::time::Duration;
pub use std::vec::Vec;
pub use std::{assert, concat, module_path};

pub use sea_orm::DatabaseTransaction;

pub use crate::context::Context;
pub use crate::fingerprint::{Fingerprint, FingerprintError};
pub use crate::handler::{Handler, Mode};
pub use crate::key::{ConsumerName, KeyError, KeySource, MessageKey};
pub use crate::metadata::Metadata;
pub use crate::report::{Report, ReportSource};
pub use crate::slice::{SliceContext, SliceHandler};

/// A boxed, `Send` future: what a method handler's hidden `handle` function returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The hidden function that calls a handler method on a clone of its service's `Arc`.
pub type HandleFn<S, M, O, E> =
    for<'a> fn(Arc<S>, &'a Context<'a>, M) -> BoxFuture<'a, Result<O, E>>;

/// The hidden function that calls a slice handler method on a clone of its service's `Arc`.
pub type HandleSliceFn<S, M, O, E> =
    for<'a> fn(Arc<S>, &'a SliceContext<'a>, Vec<M>) -> BoxFuture<'a, Result<Vec<O>, E>>;

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

/// What is wrong with an explicit `consumer = "..."` name, by the runtime's own rules
/// ([`ConsumerName::check`]); `None` when nothing is. The macro checks the name at compile time
/// with it: `const _: () = if let Some(problem) = consumer_name_problem("...") { panic!(..) };`
/// fails to compile, at the literal, with the reason.
pub const fn consumer_name_problem(name: &str) -> Option<&'static str> {
    match ConsumerName::check(name) {
        Ok(()) => None,
        Err(KeyError::Empty { .. }) => Some("the consumer name is empty"),
        // The figure is `ConsumerName::MAX_LEN` (a unit test keeps them equal).
        Err(KeyError::TooLong { .. }) => {
            Some("the consumer name is longer than 128 bytes (`ConsumerName::MAX_LEN`)")
        }
        Err(KeyError::ContainsNul { .. }) => Some("the consumer name contains a NUL character"),
        Err(_) => Some("the consumer name is not valid"),
    }
}

/// What is wrong with a default consumer name, `<module path>::<function name>`: only its
/// length can be.
pub const fn default_consumer_name_problem(name: &str) -> Option<&'static str> {
    match ConsumerName::check(name) {
        Ok(()) => None,
        Err(_) => Some(
            "the default consumer name, `<module path>::<function name>`, is longer than 128 bytes: set `consumer = \"...\"`",
        ),
    }
}

// Handler errors. A function's error type that implements `std::error::Error` is the handler's
// error as it is; a report type (`anyhow::Error`, `eyre::Report`, `Box<dyn Error + Send + Sync>`)
// is wrapped in a `Report`. The macro asks `Probe` which one a type is, in a constant:
// `<Probe<E>>::IS_STD_ERROR` finds the inherent constant when its bound holds and the trait's
// `false` otherwise.

/// Answers, in constants, what kind of error type `T` is.
pub struct Probe<T: ?Sized>(PhantomData<T>);

impl<T: ?Sized> fmt::Debug for Probe<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Probe")
    }
}

/// The answers `Probe` gives when an inherent one's bound does not hold. It must be in scope
/// where the constants are read.
pub trait ProbeFallback {
    /// `T` does not implement `std::error::Error`.
    const IS_STD_ERROR: bool = false;
    /// `T` is not a report type.
    const IS_REPORT: bool = false;
}

impl<T: ?Sized> ProbeFallback for Probe<T> {}

impl<T: std::error::Error + ?Sized> Probe<T> {
    /// `T` implements `std::error::Error`.
    pub const IS_STD_ERROR: bool = true;
}

impl<T: ReportSource> Probe<T> {
    /// `T` is a report type.
    pub const IS_REPORT: bool = true;
}

/// Whether a function's error type is wrapped in a [`Report`] (`true`) or kept (`false`).
#[derive(Debug)]
pub struct ErrorKind<const REPORT: bool>;

/// Turns a function's error into the handler's error, and back for `permanent = ...`.
pub trait AdaptError<E> {
    /// The handler's error type.
    type Error;
    /// The function's future `F`, its error adapted: `F` itself when the error is kept, so
    /// that what the compiler says about it is said about the function's own future.
    type Future<F, O>: Future<Output = Result<O, Self::Error>>
    where
        F: Future<Output = Result<O, E>>;
    /// The handler's error for the function's.
    fn adapt(error: E) -> Self::Error;
    /// The function's error inside the handler's.
    fn inner(error: &Self::Error) -> &E;
    /// The function's future, its error adapted.
    fn adapt_future<F, O>(future: F) -> Self::Future<F, O>
    where
        F: Future<Output = Result<O, E>>;
}

impl<E> AdaptError<E> for ErrorKind<false> {
    type Error = E;
    type Future<F, O>
        = F
    where
        F: Future<Output = Result<O, E>>;

    fn adapt(error: E) -> E {
        error
    }

    fn inner(error: &E) -> &E {
        error
    }

    fn adapt_future<F, O>(future: F) -> F
    where
        F: Future<Output = Result<O, E>>,
    {
        future
    }
}

impl<E: ReportSource> AdaptError<E> for ErrorKind<true> {
    type Error = Report<E>;
    type Future<F, O>
        = futures_util::future::MapErr<F, fn(E) -> Report<E>>
    where
        F: Future<Output = Result<O, E>>;

    fn adapt(error: E) -> Report<E> {
        Report::new(error)
    }

    fn inner(error: &Report<E>) -> &E {
        error.get_ref()
    }

    fn adapt_future<F, O>(future: F) -> Self::Future<F, O>
    where
        F: Future<Output = Result<O, E>>,
    {
        future.map_err(Report::new as fn(E) -> Report<E>)
    }
}

/// The handler's error type for a function's error type `E`.
pub type AdaptedError<E, const REPORT: bool> = <ErrorKind<REPORT> as AdaptError<E>>::Error;

/// What a message type must be for its whole content to be fingerprinted, the default without
/// `fingerprint = ...`: `Serialize`, with an error that says why and how to do without.
///
/// The generated code calls `<M as Fingerprintable>::content_fingerprint` with `M` spanned at the
/// user's message type, so that the error is reported there. The blanket impl is not recommended,
/// so the error is this trait's rather than `Serialize`'s with a note naming this module; and the
/// crate root re-exports the trait, hidden, so that the compiler prints its plain name (it does
/// not shorten a path that only goes through a hidden module).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be fingerprinted: the message type must implement `Serialize`",
    label = "not `Serialize`",
    note = "by default the inbox fingerprints the message's content, serialized, to tell a redelivery (the same key with the same content) from a key reused with other content, which it refuses",
    note = "derive `Serialize` for `{Self}`; or fingerprint only part of the message, `fingerprint = <expr>` (any `Serialize` value read from it); or turn the check off, `fingerprint = none`"
)]
pub trait Fingerprintable {
    /// The fingerprint of the whole message: the payload as received when the transport gave it.
    fn content_fingerprint(
        &self,
        metadata: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError>;
}

#[diagnostic::do_not_recommend]
impl<T: Serialize + ?Sized> Fingerprintable for T {
    #[inline]
    fn content_fingerprint(
        &self,
        metadata: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        metadata.content_fingerprint(self).map(Some)
    }
}

/// The element type of a slice handler's outputs, `O` of `Vec<O>`.
pub type ElementOf<V> = <V as IntoIterator>::Item;

/// What a slice handler's message type must be: `Clone`, with an error that says why.
#[diagnostic::on_unimplemented(
    message = "the slice handler's message type `{Self}` is not `Clone`",
    label = "a slice that fails runs again in halves, on copies of its messages",
    note = "derive `Clone` for `{Self}`"
)]
pub trait SliceMessage: Clone {}

impl<T: Clone> SliceMessage for T {}

/// Nothing, where `T` can be a slice handler's message: checked at the user's type.
pub const fn slice_message<T: SliceMessage>() {}

/// A slice handler's [`Handler::handle`]: one message, as a slice of one.
pub async fn handle_one<S: SliceHandler>(
    handler: &S,
    cx: &Context<'_>,
    message: S::Message,
) -> Result<S::Output, S::Error> {
    let slice = SliceContext::new(transaction(cx), slice_of_one(cx));
    let outputs = handler.handle_slice(&slice, vec_of_one(message)).await?;
    Ok(single_output(outputs))
}

/// A slice of the one context `cx`.
pub fn slice_of_one<T>(item: &T) -> &[T] {
    std::slice::from_ref(item)
}

/// A `Vec` of the one message `message`.
pub fn vec_of_one<T>(message: T) -> Vec<T> {
    vec![message]
}

/// The output of a slice of one message.
///
/// # Panics
///
/// When the slice handler returned other than one output (caught by the inbox: the message
/// fails as a panicking handler would).
pub fn single_output<O>(mut outputs: Vec<O>) -> O {
    let count = outputs.len();
    match (outputs.pop(), count) {
        (Some(output), 1) => output,
        _ => panic!("the slice handler returned {count} outputs for one message"),
    }
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
/// functions that call the method on it. The macro builds it through a function of its own whose
/// bounds name the user's types, so that a missing bound is reported on them.
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

/// The handler of an `#[idempotent(..., slice)]` method: a [`MethodHandler`] (its `handle` a
/// slice of one) and the hidden function that calls the method on a slice.
pub struct MethodSliceHandler<S, M, O, E> {
    handler: MethodHandler<S, M, O, E>,
    handle_slice: HandleSliceFn<S, M, O, E>,
}

impl<S, M, O, E> MethodSliceHandler<S, M, O, E> {
    /// A slice handler calling the method on `service`.
    pub fn new(
        service: &Arc<S>,
        spec: MethodSpec<S, M, O, E>,
        handle_slice: HandleSliceFn<S, M, O, E>,
    ) -> Self {
        Self {
            handler: MethodHandler::new(service, spec),
            handle_slice,
        }
    }
}

impl<S, M, O, E> fmt::Debug for MethodSliceHandler<S, M, O, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MethodSliceHandler")
            .field("handler", &self.handler)
            .finish_non_exhaustive()
    }
}

impl<S, M, O, E> Handler for MethodSliceHandler<S, M, O, E>
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
        self.handler.consumer()
    }

    fn key(&self, message: &M, metadata: &Metadata) -> Result<MessageKey, KeyError> {
        self.handler.key(message, metadata)
    }

    fn fingerprint(
        &self,
        message: &M,
        metadata: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        self.handler.fingerprint(message, metadata)
    }

    fn mode(&self) -> Mode {
        self.handler.mode()
    }

    fn retention(&self) -> Option<Duration> {
        self.handler.retention()
    }

    fn is_permanent(&self, error: &E) -> bool {
        self.handler.is_permanent(error)
    }

    fn handle(&self, cx: &Context<'_>, message: M) -> impl Future<Output = Result<O, E>> + Send {
        self.handler.handle(cx, message)
    }
}

impl<S, M, O, E> SliceHandler for MethodSliceHandler<S, M, O, E>
where
    S: Send + Sync + 'static,
    M: Send + 'static,
    O: Serialize + DeserializeOwned + Send + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    fn handle_slice(
        &self,
        cx: &SliceContext<'_>,
        messages: Vec<M>,
    ) -> impl Future<Output = Result<Vec<O>, E>> + Send {
        (self.handle_slice)(Arc::clone(&self.handler.service), cx, messages)
    }
}

/// What `<name>_handler()` returns when the macro could not generate the handler: the function
/// did not parse or broke a rule, and the compile error says why. It stands in so that the
/// function's callers compile without a second error; it is never run.
pub struct Unavailable<M, O>(PhantomData<fn() -> (M, O)>);

#[allow(clippy::new_without_default)] // called by generated code only
impl<M, O> Unavailable<M, O> {
    /// The stand-in.
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<M, O> fmt::Debug for Unavailable<M, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Unavailable")
    }
}

impl<M, O> Handler for Unavailable<M, O>
where
    M: Send + 'static,
    O: Serialize + DeserializeOwned + Send + 'static,
{
    type Message = M;
    type Output = O;
    type Error = Infallible;

    fn consumer(&self) -> &str {
        unreachable!("a handler that failed to compile")
    }

    fn key(&self, _: &M, _: &Metadata) -> Result<MessageKey, KeyError> {
        unreachable!("a handler that failed to compile")
    }

    fn fingerprint(&self, _: &M, _: &Metadata) -> Result<Option<Fingerprint>, FingerprintError> {
        unreachable!("a handler that failed to compile")
    }

    fn handle(&self, _: &Context<'_>, _: M) -> impl Future<Output = Result<O, Infallible>> + Send {
        std::future::pending()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compile_time_messages_give_the_runtime_limit() {
        // `consumer_name_problem` and `default_consumer_name_problem` write the limit out.
        assert_eq!(ConsumerName::MAX_LEN, 128);
    }

    #[test]
    fn std_errors_are_kept_and_reports_wrapped() {
        const STD: (bool, bool) = (
            <Probe<std::fmt::Error>>::IS_STD_ERROR,
            <Probe<std::fmt::Error>>::IS_REPORT,
        );
        const BOXED: (bool, bool) = (
            <Probe<crate::transport::BoxError>>::IS_STD_ERROR,
            <Probe<crate::transport::BoxError>>::IS_REPORT,
        );
        const NEITHER: (bool, bool) = (<Probe<u8>>::IS_STD_ERROR, <Probe<u8>>::IS_REPORT);
        assert_eq!(STD, (true, false));
        assert_eq!(BOXED, (false, true));
        assert_eq!(NEITHER, (false, false));
        let adapted: AdaptedError<crate::transport::BoxError, true> =
            <ErrorKind<true> as AdaptError<crate::transport::BoxError>>::adapt("down".into());
        assert_eq!(adapted.to_string(), "down");
    }
}

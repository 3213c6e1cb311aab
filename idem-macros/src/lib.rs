//! `#[idempotent(...)]`: the inbox bookkeeping generated around a message handler.
//!
//! Use it through `idem_runtime::idempotent` (the runtime's default `macros` feature); the
//! generated code names only `::idem_runtime` items, so the runtime is the one dependency a
//! handler crate needs.
//!
//! # What the expansion generates
//!
//! The annotated function is emitted **unchanged**: it stays an ordinary `async fn` that tests
//! can call with their own transaction or context. Next to it the macro writes one function,
//! named after it with `_handler` appended and with its visibility, that returns a value
//! implementing `idem_runtime::Handler`:
//!
//! - for a free function `charge`, `fn charge_handler() -> impl Handler<Message = M, Output = O,
//!   Error = E> + 'static`. Its body defines an empty struct, also named `charge_handler` (so
//!   that diagnostics listing handlers name it), and implements `Handler` for it directly:
//!   nothing is boxed and nothing is allocated per message;
//! - for a method `async fn charge(&self, ...)` in an `impl` block, an associated
//!   `fn charge_handler(self: &Arc<Self>) -> impl Handler<...> + 'static`. The handler holds a
//!   clone of the `Arc`, so the service's dependencies (an HTTP client, a connection pool, its
//!   configuration) are shared by every message. Because an attribute on a method can only add
//!   items to the same `impl` block, the key, fingerprint and call are hidden associated
//!   functions (`__idem_charge_key`, `__idem_charge_fingerprint`, `__idem_charge_handle`) that
//!   a small generic type of the runtime assembles; the call's future is boxed. Generic `impl`
//!   blocks work the same way.
//!
//! The generated `Handler` implementation:
//!
//! - `consumer()` is the `consumer = "..."` option, or for a free function `"<module path>::<function name>"`, checked
//!   at compile time by a constant that applies the runtime's own rules (`ConsumerName::check`);
//! - `key()` evaluates the `key = <expr>` expression with the message parameter bound to a
//!   *reference* to the message and the `&Metadata` parameter (if any) bound to the transport's
//!   metadata, and turns the value into a validated `MessageKey` through `KeySource`; each
//!   component of a tuple key is borrowed, so `(order.tenant, order.id)` moves nothing;
//! - `fingerprint()` hashes the message as received (`Metadata::content_fingerprint`), or the
//!   `fingerprint = <expr>` value with `Fingerprint::of`, or returns `None` for
//!   `fingerprint = none`;
//! - `mode()` is `Mode::Entity` or `Mode::Natural` when `mode = entity` or `mode = natural`
//!   says so, else `Mode::Transactional` when the function takes `&DatabaseTransaction` and
//!   `Mode::TwoPhase` (with the `lease`) otherwise; `retention()` and `is_permanent()` follow
//!   the `retention` and `permanent` options;
//! - `handle()` calls the function, passing the inbox's transaction, the metadata and the
//!   context to the parameters that ask for them, and the message by value;
//! - `Error` is the function's error type when it implements `std::error::Error`, and
//!   `idem_runtime::Report<E>` when it is a report type that only holds one (`anyhow::Error`,
//!   `eyre::Report`, `Box<dyn Error + Send + Sync>`).
//!
//! # One mistake, one error, at the token that causes it
//!
//! The macro reads the function (its body as tokens, so a body syn cannot parse still
//! expands), checks it against a list of small rules, and only then generates. Every broken
//! rule is reported at the user's token: an unknown or repeated option, a missing key, a key
//! that reads no parameter or names `meta` without taking it, a bad duration, a second
//! transaction, a borrowed message, an associated function without `self`...
//! The function is still emitted unchanged, next to a stand-in `<name>_handler()`, so that code
//! calling it gets no second error and IDEs keep working. A signature that does not parse is the
//! compiler's own syntax error, the only one: the macro adds none, and leaves out the body, whose
//! uses of the parameters the compiler could not read would be more. A missing `Serialize`,
//! `DeserializeOwned` or `std::error::Error` bound, a future that is not `Send` or a value
//! that cannot be a key is reported on the user's own type, function name or expression, and
//! passing `charge` where `charge_handler()` is meant says so. No message names the hidden
//! items the expansion is made of.
//!
//! An attribute sees only the function it is on, so an associated function without `self` is
//! recognised by `Self` in it or, failing that, by reading its source file (when the compiler
//! gives the path; an IDE may not, and then the compiler's "cannot find function" at the
//! function's name is the error).
//!
//! See [`idempotent`] for the parameters and every option.

mod ast;
mod attr;
mod check;
mod ctxt;
mod expand;
mod fallback;
mod place;

use proc_macro::TokenStream;

/// Makes an `async fn` an idempotent message handler: the inbox runs it at most once per
/// message key and replays its recorded output to duplicates.
///
/// The function is kept as written; the macro adds `<name>_handler()`, which returns an
/// `idem_runtime::Handler` for `Inbox::process` or a transport adapter (see the
/// [crate documentation](crate) for exactly what it generates).
///
/// ```
/// use idem_runtime::sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr};
/// use idem_runtime::{Inbox, Metadata, Outcome, idempotent};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct OrderPlaced { id: String, amount: i64 }
///
/// #[derive(Debug, PartialEq, Serialize, Deserialize)]
/// struct Receipt { charged: i64 }
///
/// #[idempotent(key = order.id, consumer = "billing")]
/// async fn charge(tx: &DatabaseTransaction, order: OrderPlaced) -> Result<Receipt, DbErr> {
///     // Business writes go through `tx`: they commit atomically with the inbox record.
///     tx.execute_unprepared("INSERT INTO charges VALUES (1)").await?;
///     Ok(Receipt { charged: order.amount })
/// }
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let db = idem_runtime::sea_orm::Database::connect("sqlite::memory:").await?;
/// db.execute_unprepared("CREATE TABLE charges (n INTEGER)").await?;
/// let inbox = Inbox::builder(db).build().await?;
///
/// let handler = charge_handler();
/// let order = || OrderPlaced { id: "o-1".into(), amount: 42 };
/// let meta = Metadata::default();
/// let first = inbox.process(&handler, order(), &meta).await?;
/// let again = inbox.process(&handler, order(), &meta).await?;
/// assert_eq!(first, Outcome::Processed(Receipt { charged: 42 }));
/// assert_eq!(again, Outcome::Duplicate(Receipt { charged: 42 }));
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
///
/// # Parameters
///
/// Parameters are recognised by their type, in any order:
///
/// | parameter | what the handler gets |
/// |---|---|
/// | `tx: &DatabaseTransaction` | the inbox's transaction: the handler is transactional |
/// | `meta: &Metadata` | what the transport knows: message id, headers, CloudEvents attributes |
/// | `cx: &Context<'_>` | the message key (to pass downstream), the attempt number on a takeover |
/// | `message: M`, by value | the decoded message; exactly one |
/// | `cx: &SliceContext<'_>` | a slice handler's messages' contexts (see `slice`) |
///
/// Any path ending in `DatabaseTransaction`, `Metadata` or `Context` counts. A method takes
/// `&self` as well; dependencies belong there, not in the parameters.
///
/// # Options
///
/// ## `key = <expr>` (required)
///
/// The message key: a stable identity of the logical message, never a delivery tag or a
/// timestamp (a key that reads the metadata's `redelivered`, `correlation_id` or
/// `payload_fingerprint`, or calls `now()`, `new_v4()`, `random()` and the like, is refused at
/// the token). Any expression over the message parameter and the `&Metadata` parameter; the
/// message is bound *by reference*, so `order.id` does not move it. The value may be a string,
/// an integer, a `bool`, a `char`, a `Uuid`, an `Option` of those (`None` is a missing key,
/// dead-lettered), a `MessageKey`, a `Result<MessageKey, KeyError>`, or a tuple of them: a
/// composite key such as `key = (order.tenant, order.id)`, whose components are escaped and
/// joined with `/` (`acme/42`) so that two different tuples never give the same key (the
/// encoding is documented on `KeySource` and never changes). Floating-point numbers are
/// refused, with a note saying what to key on instead. An expression that uses no parameter is
/// a compile error.
///
/// ```
/// # use idem_runtime::{MessageKey, Metadata, idempotent};
/// # #[derive(serde::Serialize)] struct Line { order: String, line: u32 }
/// # #[derive(serde::Serialize)] struct Event { source: String, id: String }
/// # #[derive(Debug, thiserror::Error)] #[error("e")] struct E;
/// #[idempotent(key = (line.order, line.line))] // "o-1/2"
/// async fn reserve(line: Line) -> Result<(), E> { Ok(()) }
///
/// // CloudEvents: `source` + `id`, from the event or from the transport's attributes.
/// #[idempotent(key = MessageKey::cloud_event(&ev.source, &ev.id))]
/// async fn on_event(ev: Event) -> Result<(), E> { Ok(()) }
///
/// #[idempotent(key = meta.cloud_event_key())]
/// async fn on_binary_event(meta: &Metadata, line: Line) -> Result<(), E> { Ok(()) }
/// ```
///
/// To key on the transport's message id, take the metadata and say so — it is never implied:
///
/// ```
/// # use idem_runtime::{Metadata, idempotent};
/// # #[derive(serde::Serialize)] struct AuditEvent { action: String }
/// # #[derive(Debug, thiserror::Error)] #[error("e")] struct E;
/// #[idempotent(key = meta.message_id(), consumer = "audit")]
/// async fn audit(meta: &Metadata, event: AuditEvent) -> Result<(), E> { Ok(()) }
/// ```
///
/// ## `consumer = "<name>"`
///
/// The consumer name, the first half of the inbox key: each consumer of a pub/sub channel
/// tracks its own completions. Checked at compile time with the runtime's own rules
/// (`ConsumerName::check`: non-empty, at most 128 bytes, no NUL), the default too. The default is `"<module path>::<function name>"` (`concat!(module_path!(),
/// "::", "ship")`): `ship` in `mod orders` of the crate `shop` is `"shop::orders::ship"`, so
/// handlers named alike in different modules keep apart. It is stable across builds and
/// machines, but renaming the crate or the function, or moving it to another module, changes
/// it, and a renamed consumer forgets what it processed. **Set it explicitly for production
/// handlers.**
///
/// A method has no default: it would name the module and the method, not the type (which the
/// macro does not see), and two types in one module with a handler method of the same name
/// would share their inbox records. A method without `consumer = "..."` is refused. A generic
/// service bound for two type arguments shares its name too: give each binding its own with
/// `Configured::with_consumer`.
///
/// ```
/// # use idem_runtime::{Handler, idempotent};
/// # #[derive(serde::Serialize)] struct OrderPlaced { id: String }
/// # #[derive(Debug, thiserror::Error)] #[error("e")] struct E;
/// #[idempotent(key = order.id, consumer = "billing")]
/// async fn charge(order: OrderPlaced) -> Result<(), E> { Ok(()) }
///
/// #[idempotent(key = order.id)]
/// async fn ship(order: OrderPlaced) -> Result<(), E> { Ok(()) }
///
/// assert_eq!(charge_handler().consumer(), "billing");
/// assert_eq!(ship_handler().consumer(), concat!(module_path!(), "::ship"));
/// ```
///
/// ## `mode = transactional | two_phase`
///
/// A handler that takes `&DatabaseTransaction` is transactional: its writes, the claim and the
/// recorded output are one transaction. Without that parameter it is two-phase: claimed with a
/// lease, run outside any transaction, completed only while the claim is still its own, released
/// if it fails. `mode = two_phase` says so explicitly (and refuses a transaction parameter);
/// `mode = transactional` keeps a handler without the parameter in the transaction (it can reach
/// it through `Context::transaction`).
///
/// Fencing stops a double *completion*, not a double external call: pass the message key
/// downstream as that service's idempotency key, and on a takeover (`cx.is_takeover()`) look it
/// up there before calling again.
///
/// ```
/// # use idem_runtime::{Context, Handler, Mode, idempotent};
/// # #[derive(serde::Serialize)] struct Webhook { id: u64, url: String }
/// # #[derive(Debug, thiserror::Error)] #[error("e")] struct E;
/// #[idempotent(key = hook.id, consumer = "webhooks", mode = two_phase)]
/// async fn deliver(cx: &Context<'_>, hook: Webhook) -> Result<u16, E> {
///     let idempotency_key = cx.message_key().as_str();
///     # let _ = idempotency_key;
///     // POST to hook.url with the Idempotency-Key header...
///     Ok(200)
/// }
/// assert_eq!(deliver_handler().mode(), Mode::two_phase());
/// ```
///
/// ## `mode = entity`
///
/// No inbox record: the business entity's primary key, set from the message, marks it as
/// processed (`idem_runtime::entity`). The handler takes `&Context<'_>` and creates its entity
/// with `cx.create(entity)`: `Created::Fresh` for a new message, whose writes commit;
/// `Created::Existing` with the stored entity for a duplicate, whose run rolls back. The stored
/// entity is compared with the message through its `Marker::fingerprint`: a reused key is
/// dead-lettered as the inbox does. No `retention`: the mark lives as long as the entity.
///
/// ```
/// # use idem_runtime::{Context, Handler, Mode, idempotent};
/// # use idem_runtime::sea_orm::DbErr;
/// # #[derive(serde::Serialize)] struct OrderPlaced { order_id: String }
/// #[idempotent(key = order.order_id, consumer = "billing", mode = entity)]
/// async fn invoice(cx: &Context<'_>, order: OrderPlaced) -> Result<String, DbErr> {
///     // let invoice = invoices::ActiveModel { order_id: Set(order.order_id), .. };
///     // match cx.create(invoice).await? { Created::Fresh(inv) | Created::Existing(inv) => .. }
///     # let _ = cx;
///     Ok(order.order_id)
/// }
/// assert_eq!(invoice_handler().mode(), Mode::Entity);
/// ```
///
/// ## `mode = natural`
///
/// A naturally idempotent handler (an upsert keyed on a business id, a state set with a version
/// check that ignores older states) runs in a transaction every time a copy comes, with no
/// bookkeeping; its errors settle as every handler's do. No `retention`, and no `fingerprint =
/// <expr>` (with no record, a reused key with other content cannot be caught).
///
/// ```
/// # use idem_runtime::{Handler, Mode, idempotent};
/// # use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
/// # #[derive(serde::Serialize)] struct StatusChanged { order_id: String, version: u64 }
/// #[idempotent(key = (event.order_id, event.version), consumer = "status", mode = natural)]
/// async fn apply(tx: &DatabaseTransaction, event: StatusChanged) -> Result<(), DbErr> {
///     // UPDATE orders SET status = ?, version = ? WHERE id = ? AND version < ?
///     # let _ = tx;
///     Ok(())
/// }
/// assert_eq!(apply_handler().mode(), Mode::Natural);
/// ```
///
/// ## `lease = "30s"`
///
/// How long a two-phase claim is held before another worker may take it over (default 30 s).
/// The runtime renews it every third of the lease while the handler runs, so it need not cover
/// the handler's run: it is how long a worker that lost the database keeps the message from
/// others. A handler that takes `&Context<'_>` learns of a lost claim through
/// `Context::claim_lost` and `Context::lost`. Refused on a transactional handler.
///
/// ## `retention = "14d"`
///
/// How long this handler's completed records are kept (the inbox's `RetentionPolicy` decides
/// otherwise; a per-consumer setting there wins). It must cover the broker's redelivery window.
///
/// Durations are one whole number and a unit, `ms`, `s`, `m`, `h` or `d`, checked at compile
/// time: `"30 seconds"`, `"1.5h"` or `"0s"` is an error on the literal.
///
/// `consumer`, `lease` and `retention` are defaults: the application's configuration (a file,
/// the environment, a binding's settings) overrides them at run time with
/// `charge_handler().configured().with_lease(..)` (`HandlerExt::configured`), and the inbox's own
/// per-consumer settings (`InboxBuilder::lease`, `RetentionPolicy::with_consumer`) come first of
/// all. `idem_runtime::Configured` lists the precedence.
///
/// ```
/// # use std::time::Duration;
/// # use idem_runtime::{Handler, Mode, idempotent};
/// # #[derive(serde::Serialize)] struct Mail { to: String }
/// # #[derive(Debug, thiserror::Error)] #[error("e")] struct E;
/// #[idempotent(key = mail.to, consumer = "mailer", lease = "2m", retention = "14d")]
/// async fn send(mail: Mail) -> Result<(), E> { Ok(()) }
///
/// let handler = send_handler();
/// assert_eq!(handler.mode(), Mode::TwoPhase { lease: Duration::from_secs(120) });
/// assert_eq!(handler.retention(), Some(Duration::from_secs(14 * 86_400)));
/// ```
///
/// ## `fingerprint = <expr>` / `fingerprint = none`
///
/// A redelivery with a known key but different content is refused (`FingerprintMismatch`,
/// dead-lettered), never processed. By default the whole message is fingerprinted, which needs
/// `M: Serialize` (a message type without it is refused at its type, with the two ways out).
/// `fingerprint = <expr>` chooses what counts as "the same content" (any `Serialize` expression
/// over the message, bound by reference); `fingerprint = none` turns the check off.
///
/// ```
/// # use idem_runtime::{Fingerprint, Handler, Metadata, idempotent};
/// # #[derive(Debug, thiserror::Error)] #[error("e")] struct E;
/// #[derive(serde::Serialize)]
/// struct OrderPlaced { id: String, amount: i64, sent_at: String }
///
/// // A producer's retry stamps a new `sent_at`: only the id and the amount are content.
/// #[idempotent(key = order.id, fingerprint = (&order.id, order.amount))]
/// async fn charge(order: OrderPlaced) -> Result<(), E> { Ok(()) }
///
/// struct Ping { id: String } // not `Serialize`: no fingerprint
/// #[idempotent(key = ping.id, fingerprint = none)]
/// async fn pong(ping: Ping) -> Result<(), E> { Ok(()) }
///
/// let order = OrderPlaced { id: "o-1".into(), amount: 5, sent_at: "10:00".into() };
/// let meta = Metadata::default();
/// assert_eq!(charge_handler().fingerprint(&order, &meta)?, Some(Fingerprint::of(&("o-1", 5))?));
/// assert_eq!(pong_handler().fingerprint(&Ping { id: "p".into() }, &meta)?, None);
/// # Ok::<(), idem_runtime::FingerprintError>(())
/// ```
///
/// ## `permanent = <path>`
///
/// A function `fn(&E) -> bool` saying which errors retrying cannot fix: those go to the
/// dead-letter queue at once. Without it every handler error is transient and the message is
/// requeued, up to the transport's delivery limit.
///
/// ```
/// # use idem_runtime::{Handler, idempotent};
/// # #[derive(serde::Serialize)] struct Mail { to: String }
/// #[derive(Debug, thiserror::Error)]
/// enum MailError {
///     #[error("server unavailable")]
///     Unavailable,
///     #[error("no such mailbox")]
///     NoSuchMailbox,
/// }
///
/// impl MailError {
///     fn is_permanent(&self) -> bool {
///         matches!(self, MailError::NoSuchMailbox)
///     }
/// }
///
/// #[idempotent(key = mail.to, permanent = MailError::is_permanent)]
/// async fn send(mail: Mail) -> Result<(), MailError> { Ok(()) }
///
/// assert!(send_handler().is_permanent(&MailError::NoSuchMailbox));
/// assert!(!send_handler().is_permanent(&MailError::Unavailable));
/// ```
///
/// ## `slice`
///
/// The function handles many messages at once: the fresh messages of a batch, in order, in one
/// call, so that its business write can be one multi-row statement. It takes them as
/// `Vec<M>` and returns one output per message, `Result<Vec<O>, E>`, in their order; besides,
/// `&DatabaseTransaction` (the batch's) and `&SliceContext<'_>` (each message's context, to
/// stage its outgoing messages with ids derived from it), never `&Metadata`, `&Context<'_>` or
/// `&Outbound<'_>`. `key` and `fingerprint` read *one* message, under a name of their own:
/// `order` in `key = order.id` for `orders: Vec<Order>`. `M` must be `Clone` (a slice that
/// fails runs again in halves, on copies). The generated `<name>_handler()` is an
/// `idem_runtime::SliceHandler`: bind it with `Binding::slices` or run `Inbox::process_slices`;
/// one message alone (`Inbox::process`, a record that expired) is a slice of one. Slice
/// handlers are transactional; functions and methods alike.
///
/// Each message settles as it would alone: duplicates never reach the slice, and when the call
/// fails, the messages that fail are found by halving it, each half under a savepoint of its
/// own, and the others commit.
///
/// ```
/// # use idem_runtime::sea_orm::sea_query::{Alias, Query};
/// # use idem_runtime::sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr};
/// # use idem_runtime::{SliceHandler, idempotent};
/// # #[derive(Clone, serde::Serialize, serde::Deserialize)] struct OrderPlaced { id: String, amount: i64 }
/// #[idempotent(key = order.id, consumer = "billing.charge", slice)]
/// async fn charge_all(tx: &DatabaseTransaction, orders: Vec<OrderPlaced>) -> Result<Vec<i64>, DbErr> {
///     let mut insert = Query::insert();
///     insert.into_table(Alias::new("charges")).columns(["order_id", "amount"]);
///     for order in &orders {
///         insert.values_panic([order.id.as_str().into(), order.amount.into()]);
///     }
///     tx.execute(&insert).await?; // one statement for the whole slice
///     Ok(orders.iter().map(|order| order.amount).collect())
/// }
/// # fn is_slice_handler(_: impl SliceHandler) {}
/// # is_slice_handler(charge_all_handler());
/// ```
///
/// # Methods: handlers with dependencies
///
/// On a method taking `&self`, the generated `<name>_handler` takes `self: &Arc<Self>` and
/// holds a clone of the `Arc`. The service must be `Send + Sync + 'static`. Methods of generic
/// `impl` blocks work; generic *functions* are refused (a handler has one message type).
/// Associated functions without `self` are not supported: take `&self`, or write a free
/// function. A method names its consumer (see `consumer`).
///
/// ```
/// use std::sync::Arc;
/// use idem_runtime::{Context, Handler, idempotent};
/// # #[derive(serde::Serialize)] struct SendMail { to: String, subject: String }
/// # #[derive(Debug, thiserror::Error)] #[error("e")] struct MailError;
/// # struct HttpClient;
/// # impl HttpClient { async fn post(&self, _: &str, _: &str) -> Result<u32, MailError> { Ok(1) } }
///
/// struct Mailer {
///     http: HttpClient,
///     endpoint: String,
/// }
///
/// impl Mailer {
///     #[idempotent(key = mail.to.clone() + "/" + &mail.subject, consumer = "mailer")]
///     async fn send(&self, cx: &Context<'_>, mail: SendMail) -> Result<u32, MailError> {
///         self.http.post(&self.endpoint, cx.message_key().as_str()).await
///     }
/// }
///
/// let mailer = Arc::new(Mailer { http: HttpClient, endpoint: "https://mail.example".into() });
/// let handler = mailer.send_handler(); // impl Handler + 'static, holds an Arc<Mailer>
/// assert_eq!(handler.consumer(), "mailer");
/// ```
///
/// # Output and errors
///
/// The function returns `Result<O, E>`, spelled any way (`anyhow::Result<T>`, `eyre::Result<T>`
/// and a crate's own `type Result<T> = ...` work). `O` is recorded and returned again for
/// duplicates, so it must be `Serialize + DeserializeOwned + Send` and own its data (`'static`
/// borrows such as `Cow<'static, str>` are fine); the message must be `Send + 'static`, and the
/// function's future `Send`. A missing bound is reported on the type that lacks it.
///
/// `E` is either an error type, `std::error::Error + Send + Sync + 'static`, which is the
/// handler's `Error` as it is, or a *report* type that holds one — `anyhow::Error`,
/// `eyre::Report`, `Box<dyn Error + Send + Sync>` — which the handler wraps in
/// `idem_runtime::Report<E>` (displayed as the error it holds). Like any handler error, a
/// report is transient unless `permanent = ...` says otherwise; the function given there takes
/// `&E`, the report's own type.
///
/// ```
/// # use idem_runtime::{Handler, Report, idempotent, transport::BoxError};
/// # #[derive(serde::Serialize)] struct Order { id: String }
/// #[derive(Debug, thiserror::Error)]
/// #[error("card declined")]
/// struct Declined;
///
/// // With `anyhow::Result<u32>`, this would take `&anyhow::Error`.
/// fn is_declined(error: &BoxError) -> bool {
///     error.is::<Declined>()
/// }
///
/// #[idempotent(key = order.id, permanent = is_declined)]
/// async fn charge(order: Order) -> Result<u32, BoxError> {
///     Err(Declined.into())
/// }
///
/// let declined = Report::new(BoxError::from(Declined));
/// assert!(charge_handler().is_permanent(&declined));
/// assert_eq!(declined.to_string(), "card declined");
/// ```
///
/// A free function's error type is told apart by the compiler, whatever its spelling. A
/// method's error type may name its `impl` block's generic parameters, so there the macro goes
/// by the spelling: `Result<T, E>` with `E` written `anyhow::Error`, `eyre::Report`,
/// `Box<dyn ...>` or `BoxError` is a report type, any other `E` an error type; an alias such as
/// `anyhow::Result<T>` is told apart by the compiler.
#[proc_macro_attribute]
pub fn idempotent(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item = proc_macro2::TokenStream::from(item);
    let func = match syn::parse2::<ast::Func>(item.clone()) {
        Ok(func) => func,
        Err(error) => return fallback::unparsed(error, item).into(),
    };
    let cx = ctxt::Ctxt::new();
    let handler = ast::Handler::from_syn(&cx, attr.into(), &func);
    if let Some(handler) = &handler {
        check::check(&cx, handler);
    }
    match (cx.check(), handler) {
        (Ok(()), Some(handler)) => expand::expand(&handler).into(),
        (Err(errors), _) => fallback::invalid(errors, &func).into(),
        (Ok(()), None) => unreachable!("an attribute that does not parse leaves an error"),
    }
}

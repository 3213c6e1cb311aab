//! `#[idempotent(...)]`: the inbox bookkeeping generated around a message handler.
//!
//! Use it through `idem::idempotent` or `idem_runtime::idempotent` (the runtime's default
//! `macros` feature); the generated code names the items of whichever of the two the crate
//! depends on (a renamed dependency too), so that one is the handler crate's one dependency. The function is emitted unchanged, next to a `<name>_handler()` that
//! returns an `idem_runtime::Handler`; every mistake is reported at the token that causes it.
//!
//! See [`idempotent`] for an example and the options, and the guide page
//! [`idem_runtime::guide::attribute`](https://docs.rs/idem-runtime/latest/idem_runtime/guide/attribute/index.html)
//! for the full reference.

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
/// Recognised by their type, in any order: `tx: &DatabaseTransaction` (the handler is
/// transactional), `meta: &Metadata`, `cx: &Context<'_>`, and the message by value (exactly
/// one); a slice handler takes `Vec<M>` and `&SliceContext<'_>`. A method takes `&self` too.
///
/// # Options
///
/// | option | what it says |
/// |---|---|
/// | `key = <expr>` (required) | the message key: a stable identity of the logical message, never a delivery tag or a timestamp |
/// | `consumer = "<name>"` | the first half of the inbox key (default: the function's module path and name) |
/// | `mode = entity` / `natural` | no inbox record: the entity's primary key marks the message, or the handler is naturally idempotent |
/// | `lease = "30s"` | how long a two-phase claim is held before another worker may take it over |
/// | `retention = "14d"` | how long this handler's records are kept |
/// | `fingerprint = <expr>` / `none` | what a reused key's content is compared by (default: the whole message) |
/// | `permanent = <path>` | a `fn(&E) -> bool` naming the errors that go to the dead-letter queue at once |
/// | `slice` | the function handles a batch's fresh messages in one call |
///
/// The mode follows the parameters: with `tx` transactional, without it two-phase.
///
/// **The reference**, with every option's rules and examples, methods with dependencies,
/// outputs and errors, what the expansion generates and how mistakes are reported, is the guide
/// page [`idem_runtime::guide::attribute`](https://docs.rs/idem-runtime/latest/idem_runtime/guide/attribute/index.html).
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

//! The function itself: an `async fn`, not generic, a method with `&self` that names its
//! consumer, never an associated function without `self`.

use crate::ast::{self, Handler};
use crate::ctxt::Ctxt;
use crate::place;

// The inbox awaits the handler, so it is an `async fn`; `const`, `unsafe`, `extern` and
// variadic functions cannot be called the way the generated code calls it.
pub(super) fn check_is_async_fn(cx: &Ctxt, handler: &Handler<'_>) {
    let sig = &handler.func.sig;
    if let Some(constness) = &sig.constness {
        cx.error_spanned_by(
            constness,
            "`#[idempotent]` cannot be applied to a `const fn`: a handler is an `async fn`",
        );
    } else if sig.asyncness.is_none() {
        cx.error_spanned_by(
            sig.fn_token,
            "`#[idempotent]` handlers must be `async fn`: the inbox awaits the handler inside its \
             transaction",
        );
    }
    if let Some(unsafety) = &sig.unsafety {
        cx.error_spanned_by(
            unsafety,
            "`#[idempotent]` cannot be applied to an `unsafe fn`",
        );
    }
    if let Some(abi) = &sig.abi {
        cx.error_spanned_by(abi, "`#[idempotent]` cannot be applied to an `extern` fn");
    }
    if let Some(variadic) = &sig.variadic {
        cx.error_spanned_by(variadic, "`#[idempotent]` handlers cannot be variadic");
    }
}

// A handler has one message type and one output type: a generic function has many. (Lifetime
// parameters are left to the rules on borrowed messages and outputs.)
pub(super) fn check_not_generic(cx: &Ctxt, handler: &Handler<'_>) {
    let generics = &handler.func.sig.generics;
    let lifetimes_only = generics
        .params
        .iter()
        .all(|param| matches!(param, syn::GenericParam::Lifetime(_)));
    if !lifetimes_only {
        cx.error_spanned_by(
            generics,
            "`#[idempotent]` cannot be applied to a generic function: a handler has one message \
             type and one output type. Write a non-generic handler that calls it, or make it a \
             method of a generic service (`impl<C> Service<C> { ... }`)",
        );
    }
}

// A method handler shares its service behind an `Arc` and may run many messages at once:
// it takes `&self`, never `&mut self`, `self` or `self: Box<Self>`.
pub(super) fn check_receiver_is_ref_self(cx: &Ctxt, handler: &Handler<'_>) {
    if let Some(receiver) = handler.receiver
        && (receiver.reference.is_none()
            || receiver.mutability.is_some()
            || receiver.colon_token.is_some())
    {
        cx.error_spanned_by(
            receiver,
            "an `#[idempotent]` method takes `&self`: the generated handler holds the service in \
             an `Arc` and may run many messages at once",
        );
    }
}

// A consumer name keys the inbox's records. A free function's default, its module path and
// name, is its own; a method's would leave out its type (the macro does not see it), and two
// types' methods of one name in one module would share their records: each would take the
// other's messages for duplicates.
pub(super) fn check_method_names_its_consumer(cx: &Ctxt, handler: &Handler<'_>) {
    if handler.is_method() && handler.args.consumer.is_none() {
        let name = handler.ident();
        cx.error_spanned_by(
            name,
            format!(
                "a method handler names its consumer, `consumer = \"...\"`: the default, the \
                 module's path and `{name}`, would leave out the type, so that another type's \
                 `{name}` in this module would share its inbox records (to keep records made \
                 under that default, give it: `consumer = \"<module path>::{name}\"`)"
            ),
        );
    }
}

// An associated function without `self` has no service to hold, and the generated handler
// cannot call it by name. The macro sees only the function: `Self` in its signature or body
// gives it away, and otherwise its source file says whether it sits in an `impl` block.
pub(super) fn check_not_associated_without_self(cx: &Ctxt, handler: &Handler<'_>) {
    if handler.is_method() {
        return;
    }
    let name = handler.ident();
    if ast::first_self_type(handler.func).is_some() || place::is_associated_without_self(name) {
        cx.error_spanned_by(
            name,
            format!(
                "`#[idempotent]` cannot be applied to an associated function without `self`: \
                 take `&self`, so that `{name}_handler` holds the service, or move `{name}` out \
                 of the `impl` block"
            ),
        );
    }
}

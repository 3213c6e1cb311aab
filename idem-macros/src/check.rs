//! The rules a handler must follow, one small function each, every error at the token that
//! breaks the rule. A rule that depends on another's outcome stays quiet when that one has
//! already spoken, so that one mistake gives one error.

use quote::ToTokens;
use syn::{Expr, Ident};

use crate::ast::{self, Handler, Role, Uses};
use crate::attr::{FingerprintArg, ModeArg};
use crate::ctxt::Ctxt;
use crate::place;

const PARAMS_HELP: &str = "a handler takes its message by value and, optionally, \
`&DatabaseTransaction`, `&Metadata`, `&Context<'_>` and `&Outbound<'_>`; dependencies belong \
in `&self` \
(make the handler a method of a service)";

/// Checks every rule, adding each error to `cx`.
pub(crate) fn check(cx: &Ctxt, handler: &Handler<'_>) {
    if place::is_in_trait_impl(handler.ident()) {
        // Nothing generated can go there; every other rule is moot.
        let name = handler.ident();
        cx.error_spanned_by(
            name,
            format!(
                "`#[idempotent]` cannot be applied to a function of a trait's `impl` block: the \
                 items it generates beside `{name}` (`{name}_handler`, ...) cannot go in it; \
                 write the handler in an inherent `impl` block or as a free function, and call \
                 it from the trait's `{name}`"
            ),
        );
        return;
    }
    check_is_async_fn(cx, handler);
    check_params_unconditional(cx, handler);
    check_not_generic(cx, handler);
    check_receiver_is_ref_self(cx, handler);
    check_method_names_its_consumer(cx, handler);
    check_not_associated_without_self(cx, handler);
    check_special_params_by_shared_reference(cx, handler);
    check_message_by_value(cx, handler);
    check_one_of_each(cx, handler);
    check_has_message(cx, handler);
    check_message_owned(cx, handler);
    check_returns_result(cx, handler);
    check_output_owned(cx, handler);
    check_key_given(cx, handler);
    check_expressions_read_the_message(cx, handler);
    check_key_names_the_message(cx, handler);
    check_durations(cx, handler);
    check_two_phase_without_transaction(cx, handler);
    check_lease_only_two_phase(cx, handler);
    check_slice_context_only_in_slices(cx, handler);
    if handler.is_slice() {
        check_slice_takes_vec(cx, handler);
        check_slice_returns_vec(cx, handler);
        check_slice_has_no_single_message_params(cx, handler);
        check_slice_is_transactional(cx, handler);
    }
}

// The inbox awaits the handler, so it is an `async fn`; `const`, `unsafe`, `extern` and
// variadic functions cannot be called the way the generated code calls it.
fn check_is_async_fn(cx: &Ctxt, handler: &Handler<'_>) {
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
fn check_not_generic(cx: &Ctxt, handler: &Handler<'_>) {
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
fn check_receiver_is_ref_self(cx: &Ctxt, handler: &Handler<'_>) {
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
fn check_method_names_its_consumer(cx: &Ctxt, handler: &Handler<'_>) {
    if handler.is_method() && handler.consumer.is_none() {
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
fn check_not_associated_without_self(cx: &Ctxt, handler: &Handler<'_>) {
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

// The generated code passes every parameter the handler declares; one that a `#[cfg]` can
// remove would be passed anyway.
fn check_params_unconditional(cx: &Ctxt, handler: &Handler<'_>) {
    let conditional = handler
        .params
        .iter()
        .flat_map(|param| &param.arg.attrs)
        .filter(|attr| attr.path().is_ident("cfg"));
    for attr in conditional {
        cx.error_spanned_by(
            attr,
            "a handler's parameter cannot be conditional: the inbox passes every parameter the \
             handler declares; move the condition into the body",
        );
    }
}

// The transaction, metadata and context belong to the inbox, which lends them: the handler
// takes them by shared reference.
fn check_special_params_by_shared_reference(cx: &Ctxt, handler: &Handler<'_>) {
    for param in &handler.params {
        if param.role == Role::Message {
            continue;
        }
        let (what, name) = (param.role.describe(), param.role.type_name());
        match param.reference {
            None => cx.error_spanned_by(
                &param.arg.ty,
                format!("take the {what} by reference: `&{name}`"),
            ),
            Some(reference) => {
                if let Some(mutability) = &reference.mutability {
                    cx.error_spanned_by(
                        mutability,
                        format!("take the {what} as `&{name}`, not `&mut`"),
                    );
                }
            }
        }
    }
}

// The message is moved into the handler: by value, and of one named type (`impl Trait` would
// make the handler generic).
fn check_message_by_value(cx: &Ctxt, handler: &Handler<'_>) {
    for param in handler.params.iter().filter(|p| p.role == Role::Message) {
        if param.reference.is_some() {
            cx.error_spanned_by(
                &param.arg.ty,
                format!("the message is taken by value, not by reference; {PARAMS_HELP}"),
            );
        } else if ast::contains_impl_trait(&param.arg.ty) {
            cx.error_spanned_by(
                &param.arg.ty,
                "`impl Trait` makes the handler generic, which `#[idempotent]` does not support: \
                 name the message's type",
            );
        }
    }
}

// One message per delivery, one transaction that records it, one metadata and one context:
// a second of any of them is a mistake (often a dependency that belongs in `&self`).
fn check_one_of_each(cx: &Ctxt, handler: &Handler<'_>) {
    let mut seen = Vec::new();
    for param in &handler.params {
        if !seen.contains(&param.role) {
            seen.push(param.role);
            continue;
        }
        let message = match param.role {
            Role::Message => format!(
                "a handler takes exactly one message parameter, and this is a second one; \
                 {PARAMS_HELP}"
            ),
            Role::Transaction => "a handler takes at most one `&DatabaseTransaction`: all its \
                                  writes go through the one transaction that also records the \
                                  message"
                .to_owned(),
            role => format!(
                "a handler takes at most one `&{}` parameter",
                role.type_name()
            ),
        };
        cx.error_spanned_by(param.arg, message);
    }
}

// Every delivery carries a message: a handler without one has nothing to key on.
fn check_has_message(cx: &Ctxt, handler: &Handler<'_>) {
    if handler.param(Role::Message).is_none() {
        cx.error_spanned_by(
            handler.ident(),
            format!("the handler has no message parameter; {PARAMS_HELP}"),
        );
    }
}

// The message is kept while the handler runs, which the transport may spawn: it owns its data
// (`'static` borrows, such as `Cow<'static, str>`, are fine).
fn check_message_owned(cx: &Ctxt, handler: &Handler<'_>) {
    if let Some(message) = handler.param(Role::Message)
        && message.reference.is_none()
        && ast::borrows(&message.arg.ty)
    {
        cx.error_spanned_by(
            &message.arg.ty,
            "the message must be an owned type without lifetimes (`'static` is fine): it is \
             moved into the handler and kept while the handler runs",
        );
    }
}

// The `Ok` value is recorded and replayed to duplicates, an `Err` records nothing: the
// function returns a `Result`. Aliases (`anyhow::Result<T>`) are left to the type checker.
fn check_returns_result(cx: &Ctxt, handler: &Handler<'_>) {
    const NOT_RESULTS: &[&str] = &[
        "bool", "char", "str", "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32",
        "i64", "i128", "isize", "f32", "f64", "String", "Vec", "Option", "Box", "Self",
    ];
    let Some(ty) = handler.output.ty else {
        cx.error_at(
            handler.func.sig.paren_token.span.close(),
            "an `#[idempotent]` handler returns `Result<T, E>`: the `Ok` value is recorded and \
             returned again for duplicates",
        );
        return;
    };
    let mut ty = ty;
    while let syn::Type::Paren(syn::TypeParen { elem, .. })
    | syn::Type::Group(syn::TypeGroup { elem, .. }) = ty
    {
        ty = elem;
    }
    let certainly_not = match ty {
        syn::Type::Path(path) => {
            path.qself.is_none()
                && path.path.segments.len() == 1
                && NOT_RESULTS
                    .iter()
                    .any(|name| path.path.segments[0].ident == name)
        }
        _ => true,
    };
    if certainly_not {
        cx.error_spanned_by(
            ty,
            "an `#[idempotent]` handler returns `Result<T, E>`: the `Ok` value is recorded and \
             returned again for duplicates, an `Err` records nothing",
        );
    }
}

// The output is stored and returned to duplicates long after the call: it owns its data.
fn check_output_owned(cx: &Ctxt, handler: &Handler<'_>) {
    if let Some(ok) = handler.output.ok
        && ast::borrows(ok)
    {
        cx.error_spanned_by(
            ok,
            "the output is stored and returned again for duplicates: it must be an owned type \
             without lifetimes (`'static` is fine)",
        );
    }
}

// The key is the message's identity and is never implied: not even the transport's message
// id, which the handler must ask for.
fn check_key_given(cx: &Ctxt, handler: &Handler<'_>) {
    if handler.key.is_some() {
        return;
    }
    let help = match handler.param(Role::Metadata) {
        Some(meta) => format!(
            "write `key = {}.message_id()`",
            binding_name(meta).unwrap_or_else(|| "meta".to_owned())
        ),
        None => "take `meta: &Metadata` and write `key = meta.message_id()`".to_owned(),
    };
    cx.error_at(
        proc_macro2::Span::call_site(),
        format!(
            "missing `key = <expr>`: the message key is an expression over the handler's \
             parameters, such as `key = order.id`. To key on the transport's message id, {help}"
        ),
    );
}

// The key (and the fingerprint) is computed before the message is claimed, from the message
// (and, for the key, the transport's metadata) alone; and it reads at least one of them, or
// every message would get the same key.
fn check_expressions_read_the_message(cx: &Ctxt, handler: &Handler<'_>) {
    if let Some(key) = &handler.key {
        check_expression(cx, handler, "key", key);
    }
    if let Some(FingerprintArg::Expr(expr)) = &handler.fingerprint {
        check_expression(cx, handler, "fingerprint", expr);
    }
}

fn check_expression(cx: &Ctxt, handler: &Handler<'_>, option: &str, expr: &Expr) {
    if handler.is_slice() && handler.message_type().is_none() {
        // Which name reads one message is unclear until the messages are a `Vec`, which has
        // its own error.
        return;
    }
    let uses = Uses::of(expr);
    let bound_by = |roles: &[Role]| -> Vec<Ident> {
        handler
            .params
            .iter()
            .filter(|p| roles.contains(&p.role))
            .flat_map(|p| p.bindings())
            .collect()
    };
    let mut readable = handler.message_names(expr);
    if option == "key" {
        readable.extend(bound_by(&[Role::Metadata]));
    }
    let mut later = bound_by(&[
        Role::Transaction,
        Role::Context,
        Role::Metadata,
        Role::Outbound,
        Role::SliceContext,
    ]);
    if handler.is_slice() {
        // The slice as a whole: the option reads one of its messages.
        let slice = bound_by(&[Role::Message]);
        if let Some(ident) = uses.vars.iter().find(|v| slice.contains(v)) {
            cx.error_spanned_by(
                ident,
                format!(
                    "`{ident}` is the whole slice: `{option}` reads one of its messages, under a \
                     name of its own (as `order` in `{option} = order.id`)"
                ),
            );
            return;
        }
        later.extend(slice);
    }
    let from = if option == "key" {
        "the message and its `&Metadata` only"
    } else {
        "the message only"
    };

    if let Some(ident) = uses
        .vars
        .iter()
        .find(|v| later.contains(v) && !readable.contains(v))
    {
        let when = if option == "key" {
            "is computed before the message is claimed, from"
        } else {
            "is computed from"
        };
        cx.error_spanned_by(
            ident,
            format!("`{option}` {when} {from}: `{ident}` is not available then"),
        );
    } else if let Some(ident) = &uses.self_value {
        cx.error_spanned_by(
            ident,
            format!("`{option}` is computed from {from}: `self` is not available there"),
        );
    } else if let Some(ident) = uses
        .metadata_like
        .iter()
        .find(|m| !readable.contains(m) && !later.contains(m))
        && option == "key"
    {
        let message = match handler.param(Role::Metadata).and_then(binding_name) {
            _ if handler.is_slice() => format!(
                "`{ident}` reads like the transport's metadata, which a slice handler's `key` \
                 cannot read: it reads one message of the slice, under a name of its own (as \
                 `order` in `key = order.id`)"
            ),
            Some(meta) => format!(
                "`{ident}` is not a parameter of this handler: its `&Metadata` parameter is \
                 `{meta}`"
            ),
            None => format!(
                "`{ident}` is not a parameter of this handler: to key on the transport's \
                 metadata, take it as one, `{ident}: &Metadata`, next to the message"
            ),
        };
        cx.error_spanned_by(ident, message);
    } else if !uses.vars.iter().any(|v| readable.contains(v)) {
        let params = readable
            .iter()
            .map(|name| format!("`{name}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let params = if params.is_empty() {
            "the message parameter".to_owned()
        } else {
            params
        };
        cx.error_spanned_by(
            expr,
            format!(
                "this `{option}` expression uses none of the handler's parameters: it must be \
                 computed from {params}, so that each message gets its own {option}"
            ),
        );
    }
}

// A key names one message, whichever delivery of it this is: a redelivery must find the same
// key, or it runs again, and two messages must not share one. The redelivered flag, the payload
// fingerprint (set by the transport, absent elsewhere), the clock and random numbers differ
// between deliveries; a correlation id is shared by every message of a conversation.
fn check_key_names_the_message(cx: &Ctxt, handler: &Handler<'_>) {
    let Some(key) = &handler.key else {
        return;
    };
    let mut readable = handler.message_names(key);
    readable.extend(
        (handler.params.iter())
            .filter(|p| p.role == Role::Metadata)
            .flat_map(|p| p.bindings()),
    );
    if !Uses::of(key).vars.iter().any(|v| readable.contains(v)) {
        // A key that reads neither has its error already.
        return;
    }
    let metadata: Vec<Ident> = handler
        .params
        .iter()
        .filter(|p| p.role == Role::Metadata)
        .flat_map(|p| p.bindings())
        .collect();
    let mut found = PerDelivery {
        metadata: &metadata,
        found: None,
    };
    syn::visit::Visit::visit_expr(&mut found, key);
    if let Some((at, what)) = found.found {
        cx.error_spanned_by(
            at,
            format!(
                "`key` must name the message, the same at every delivery of it and no other's: \
                 {what}; key on the message's own id (a field of the message, or the transport's \
                 message id, `meta.message_id()`)"
            ),
        );
    }
}

/// The first part of a key expression that is not the message's own: see
/// [`check_key_names_the_message`].
struct PerDelivery<'a> {
    /// The names the handler's `&Metadata` parameter binds.
    metadata: &'a [Ident],
    found: Option<(proc_macro2::TokenStream, &'static str)>,
}

/// Functions whose every call gives another value.
const VARYING_CALLS: &[&str] = &["now", "now_v7", "new_v4", "new_v7", "random", "thread_rng"];

impl<'ast> syn::visit::Visit<'ast> for PerDelivery<'_> {
    fn visit_expr_field(&mut self, field: &'ast syn::ExprField) {
        let on_metadata = matches!(&*field.base, Expr::Path(path)
            if path.path.get_ident().is_some_and(|ident| self.metadata.contains(ident)));
        if let (true, syn::Member::Named(name), None) = (on_metadata, &field.member, &self.found) {
            let what = match name.to_string().as_str() {
                "redelivered" => Some("whether it is a redelivery differs between its deliveries"),
                "payload_fingerprint" => {
                    Some("the payload's fingerprint is the transport's, and absent elsewhere")
                }
                "correlation_id" => {
                    Some("a correlation id is shared by every message of a conversation")
                }
                _ => None,
            };
            if let Some(what) = what {
                self.found = Some((field.to_token_stream(), what));
            }
        }
        syn::visit::visit_expr_field(self, field);
    }

    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        let varying = matches!(&*call.func, Expr::Path(path)
        if path.path.segments.last().is_some_and(|last| {
            VARYING_CALLS.iter().any(|name| last.ident == name)
        }));
        if varying && self.found.is_none() {
            let what = "the clock and random numbers give another value at every delivery";
            self.found = Some((call.to_token_stream(), what));
        }
        syn::visit::visit_expr_call(self, call);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        // `format!` and its kin: their arguments, where they parse as expressions.
        if let Ok(args) = ast::macro_args(mac.tokens.clone()) {
            for arg in &args {
                self.visit_expr(arg);
            }
        }
    }
}

/// The name a parameter's pattern binds, when it is a single name.
fn binding_name(param: &ast::Param<'_>) -> Option<String> {
    match &*param.arg.pat {
        syn::Pat::Ident(pat) => Some(pat.ident.to_string()),
        _ => None,
    }
}

// A lease or a retention is one whole number and a unit, checked here rather than at start-up.
fn check_durations(cx: &Ctxt, handler: &Handler<'_>) {
    for duration in [&handler.lease, &handler.retention].into_iter().flatten() {
        if let Err(why) = &duration.ms {
            cx.error_spanned_by(&duration.lit, why);
        }
    }
}

// Two-phase handlers run outside any transaction, so they cannot take one.
fn check_two_phase_without_transaction(cx: &Ctxt, handler: &Handler<'_>) {
    if let (Some((ModeArg::TwoPhase, span)), Some(tx)) =
        (handler.mode, handler.param(Role::Transaction))
    {
        let pat = tx.arg.pat.to_token_stream();
        cx.error_at(
            span,
            format!(
                "`mode = two_phase` runs the handler outside any transaction, but it takes \
                 `{pat}: &DatabaseTransaction`: remove that parameter, or remove \
                 `mode = two_phase` to write through the transaction"
            ),
        );
    }
}

// A lease bounds a two-phase claim; a transactional claim lives and dies with its transaction.
fn check_lease_only_two_phase(cx: &Ctxt, handler: &Handler<'_>) {
    let Some(lease) = &handler.lease else { return };
    if matches!(handler.mode, Some((ModeArg::TwoPhase, _))) || !handler.is_transactional() {
        return;
    }
    let why = if handler.param(Role::Transaction).is_some() {
        "it takes a `&DatabaseTransaction`"
    } else {
        "of `mode = transactional`"
    };
    cx.error_spanned_by(
        &lease.lit,
        format!(
            "`lease` applies to two-phase handlers only; this handler is transactional because \
             {why}"
        ),
    );
}

// `&SliceContext<'_>` holds the contexts of a slice's messages: only a slice handler gets one.
fn check_slice_context_only_in_slices(cx: &Ctxt, handler: &Handler<'_>) {
    if handler.is_slice() {
        return;
    }
    if let Some(param) = handler.param(Role::SliceContext) {
        cx.error_spanned_by(
            &param.arg.ty,
            "`&SliceContext<'_>` is a slice handler's (`slice`, with the messages as `Vec<M>`); \
             a handler of one message takes `&Context<'_>`",
        );
    }
}

// The slice's messages come in one `Vec`, in the batch's order.
fn check_slice_takes_vec(cx: &Ctxt, handler: &Handler<'_>) {
    if let Some(message) = handler.param(Role::Message)
        && message.reference.is_none()
        && ast::vec_element(&message.arg.ty).is_none()
    {
        let ty = &message.arg.ty;
        cx.error_spanned_by(
            ty,
            format!(
                "a slice handler takes its messages as `Vec<M>`: `{}: Vec<{}>`",
                message.arg.pat.to_token_stream(),
                ty.to_token_stream()
            ),
        );
    }
}

// One output per message, in their order: each is recorded with its message.
fn check_slice_returns_vec(cx: &Ctxt, handler: &Handler<'_>) {
    if let Some(ok) = handler.output.ok
        && ast::vec_element(ok).is_none()
    {
        cx.error_spanned_by(
            ok,
            format!(
                "a slice handler returns one output per message, in their order: \
                 `Result<Vec<{}>, _>`",
                ok.to_token_stream()
            ),
        );
    }
}

// What is one message's (its metadata, its context, its outbound) comes through the slice's
// context, message by message.
fn check_slice_has_no_single_message_params(cx: &Ctxt, handler: &Handler<'_>) {
    for param in &handler.params {
        if matches!(param.role, Role::Metadata | Role::Context | Role::Outbound) {
            cx.error_spanned_by(
                &param.arg.ty,
                format!(
                    "a slice handler takes `&SliceContext<'_>`, whose `messages()` give each \
                     message's context (its key, metadata and stagings), not `&{}`",
                    param.role.type_name()
                ),
            );
        }
    }
}

// A slice's messages share the batch's transaction: a slice cannot run in two phases.
fn check_slice_is_transactional(cx: &Ctxt, handler: &Handler<'_>) {
    if let Some((ModeArg::TwoPhase, span)) = handler.mode {
        cx.error_at(
            span,
            "a slice handler is transactional: its messages' effects commit in the batch's \
             transaction; handle one message per call for two-phase mode",
        );
    }
}

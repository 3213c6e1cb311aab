//! The key and fingerprint expressions: given, and reading the message (and, for the key, the
//! transport's metadata) and nothing that is not there yet.

use syn::{Expr, Ident};

use crate::ast::{self, Handler, Role, Uses};
use crate::attr::FingerprintArg;
use crate::ctxt::Ctxt;

// The key is the message's identity and is never implied: not even the transport's message
// id, which the handler must ask for.
pub(super) fn check_key_given(cx: &Ctxt, handler: &Handler<'_>) {
    if handler.args.key.is_some() {
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
pub(super) fn check_expressions_read_the_message(cx: &Ctxt, handler: &Handler<'_>) {
    if let Some(key) = &handler.args.key {
        check_expression(cx, handler, "key", key);
    }
    if let Some(FingerprintArg::Expr(expr)) = &handler.args.fingerprint {
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
    let mut readable = handler.message_names(expr);
    if option == "key" {
        readable.extend(handler.names_bound_by(&[Role::Metadata]));
    }
    let mut later = handler.names_bound_by(&[
        Role::Transaction,
        Role::Context,
        Role::Metadata,
        Role::Outbound,
        Role::SliceContext,
    ]);
    if handler.is_slice() {
        // The slice as a whole: the option reads one of its messages.
        let slice = handler.names_bound_by(&[Role::Message]);
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
        cx.error_spanned_by(ident, metadata_not_a_parameter(handler, ident));
    } else if !uses.vars.iter().any(|v| readable.contains(v)) {
        cx.error_spanned_by(expr, reads_no_parameter(option, &readable));
    }
}

/// Why `ident`, which a key reads like the transport's metadata, is not the handler's.
fn metadata_not_a_parameter(handler: &Handler<'_>, ident: &Ident) -> String {
    match handler.param(Role::Metadata).and_then(binding_name) {
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
    }
}

/// Why an `option` expression that reads none of `readable` would give every message the same
/// value.
fn reads_no_parameter(option: &str, readable: &[Ident]) -> String {
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
    format!(
        "this `{option}` expression uses none of the handler's parameters: it must be \
         computed from {params}, so that each message gets its own {option}"
    )
}

/// The name a parameter's pattern binds, when it is a single name.
fn binding_name(param: &ast::Param<'_>) -> Option<String> {
    match &*param.arg.pat {
        syn::Pat::Ident(pat) => Some(pat.ident.to_string()),
        _ => None,
    }
}

//! A key names the message, whichever delivery of it this is.

use quote::ToTokens;
use syn::visit::Visit;
use syn::{Expr, Ident};

use crate::ast::{self, Handler, Role, Uses};
use crate::ctxt::Ctxt;

// A key names one message, whichever delivery of it this is: a redelivery must find the same
// key, or it runs again, and two messages must not share one. The redelivered flag, the payload
// fingerprint (set by the transport, absent elsewhere), the clock and random numbers differ
// between deliveries; a correlation id is shared by every message of a conversation.
pub(super) fn check_key_names_the_message(cx: &Ctxt, handler: &Handler<'_>) {
    let Some(key) = &handler.args.key else {
        return;
    };
    let metadata = handler.names_bound_by(&[Role::Metadata]);
    let mut readable = handler.message_names(key);
    readable.extend(metadata.iter().cloned());
    if !Uses::of(key).vars.iter().any(|v| readable.contains(v)) {
        // A key that reads neither has its error already.
        return;
    }
    let mut found = PerDelivery {
        metadata: &metadata,
        found: None,
    };
    found.visit_expr(key);
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

impl<'ast> Visit<'ast> for PerDelivery<'_> {
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

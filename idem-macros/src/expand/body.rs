//! The bodies of the handler's key and fingerprint functions, and the arguments the annotated
//! function is called with.

use proc_macro2::{Delimiter, Group, TokenStream};
use quote::{quote, quote_spanned};
use syn::Expr;
use syn::spanned::Spanned;

use super::names::{rt, rt_at};
use crate::ast::{self, Handler, Role};
use crate::attr::FingerprintArg;

/// A reference to an option's expression, with each component of a tuple borrowed in turn:
/// `(order.tenant, order.id)` reads the message's fields without moving them out of the
/// reference the message is bound to. The tokens added take the expression's spans, so that an
/// error about its value underlines the whole expression.
fn borrowed(expr: &Expr) -> TokenStream {
    let span = expr.span();
    match expr {
        Expr::Tuple(tuple) if !tuple.elems.is_empty() => {
            let elems = tuple.elems.iter().map(borrowed);
            let mut group = Group::new(Delimiter::Parenthesis, quote!(#(#elems,)*));
            group.set_span(tuple.paren_token.span.join());
            quote_spanned!(span=> &#group)
        }
        // `&` binds tighter than these: keep them whole.
        Expr::Binary(_)
        | Expr::Cast(_)
        | Expr::Range(_)
        | Expr::Assign(_)
        | Expr::Closure(_)
        | Expr::Let(_) => quote_spanned!(span=> &(#expr)),
        other => quote_spanned!(span=> &#other),
    }
}

/// `let <message pattern> = __idem_message;` and, for the key, the metadata's; for a slice
/// handler, the name `expr` reads one message by.
fn bindings(handler: &Handler<'_>, expr: &Expr, with_metadata: bool) -> TokenStream {
    let mut out = TokenStream::new();
    if handler.is_slice() {
        for name in handler.message_names(expr) {
            out.extend(quote! {
                #[allow(unused_variables)]
                let #name = __idem_message;
            });
        }
        return out;
    }
    let roles: &[Role] = if with_metadata {
        &[Role::Message, Role::Metadata]
    } else {
        &[Role::Message]
    };
    for &role in roles {
        if let Some(param) = handler.param(role) {
            let pat = ast::by_reference(&param.arg.pat);
            let value = match role {
                Role::Metadata => quote!(__idem_meta),
                _ => quote!(__idem_message),
            };
            out.extend(quote! {
                #[allow(unused_variables)]
                let #pat = #value;
            });
        }
    }
    out
}

/// The body of the key function, with `__idem_message: &M` and `__idem_meta: &Metadata`.
pub(super) fn key_body(handler: &Handler<'_>) -> TokenStream {
    let key = handler.args.key.as_ref().expect("checked: a key");
    let bindings = bindings(handler, key, true);
    let span = key.span();
    let rt = rt_at(span);
    let key = borrowed(key);
    // A value that cannot be a key is reported on the expression.
    let call = quote_spanned!(span=> #rt::KeySource::to_message_key(#key));
    quote! {
        #bindings
        #call
    }
}

/// The body of the fingerprint function, with `__idem_message: &M` and `__idem_fp_meta:
/// &Metadata`.
pub(super) fn fingerprint_body(handler: &Handler<'_>, message: &TokenStream) -> TokenStream {
    let rt = rt();
    match &handler.args.fingerprint {
        None => {
            // A message that is not `Serialize` is reported on its type, with what the
            // fingerprint needs and how to do without.
            let span = message.span();
            let rt = rt_at(span);
            quote_spanned! {span=>
                <#message as #rt::Fingerprintable>::content_fingerprint(
                    __idem_message,
                    __idem_fp_meta,
                )
            }
        }
        Some(FingerprintArg::Off) => quote!(#rt::Ok(#rt::None)),
        Some(FingerprintArg::Expr(expr)) => {
            let bindings = bindings(handler, expr, false);
            let span = expr.span();
            let rt = rt_at(span);
            let expr = borrowed(expr);
            let call =
                quote_spanned!(span=> #rt::Result::map(#rt::Fingerprint::of(#expr), #rt::Some));
            quote! {
                #bindings
                #call
            }
        }
    }
}

/// The arguments the function is called with, from `__idem_cx` and `__idem_message`.
pub(super) fn call_args(handler: &Handler<'_>) -> Vec<TokenStream> {
    let rt = rt();
    handler
        .params
        .iter()
        .map(|param| match param.role {
            Role::Transaction => quote!(#rt::transaction(__idem_cx)),
            Role::Metadata => quote!(__idem_cx.metadata()),
            Role::Context => quote!(__idem_cx),
            Role::Outbound => quote!(__idem_cx.outbound()),
            Role::SliceContext => quote!(__idem_cx),
            Role::Message => quote!(__idem_message),
        })
        .collect()
}

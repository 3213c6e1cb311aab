//! The values of the options that are not expressions: the consumer name (checked at compile
//! time), the mode and the retention.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};

use super::names::{rt, rt_at};
use crate::ast::Handler;
use crate::attr::ModeArg;

/// The consumer name's expression, and the item that checks it at compile time with the
/// runtime's rules (reported at the literal, or at the function's name for the default): the
/// `consumer = "..."` literal, or `"<module path>::<function name>"`.
pub(super) fn consumer(handler: &Handler<'_>) -> (TokenStream, TokenStream) {
    match &handler.args.consumer {
        Some(name) => {
            let span = name.span();
            let rt = rt_at(span);
            let check = quote_spanned! {span=>
                const _: () = if let #rt::Some(problem) = #rt::consumer_name_problem(#name) {
                    ::core::panic!("{}", problem)
                };
            };
            (check, quote!(#name))
        }
        None => {
            let ident = handler.ident();
            let name = ident.to_string();
            let span = ident.span();
            let rt = rt_at(span);
            let check = quote_spanned! {span=>
                const __IDEM_CONSUMER: &str = #rt::concat!(#rt::module_path!(), "::", #name);
                const _: () = if let #rt::Some(problem) =
                    #rt::default_consumer_name_problem(__IDEM_CONSUMER)
                {
                    ::core::panic!("{}", problem)
                };
            };
            (check, quote!(__IDEM_CONSUMER))
        }
    }
}

/// The handler's `Mode`: entity, natural, transactional, or two-phase with the `lease`.
pub(super) fn mode(handler: &Handler<'_>) -> TokenStream {
    let rt = rt();
    match handler.args.mode {
        Some((ModeArg::Entity, _)) => return quote!(#rt::Mode::Entity),
        Some((ModeArg::Natural, _)) => return quote!(#rt::Mode::Natural),
        _ if handler.is_transactional() => return quote!(#rt::Mode::Transactional),
        _ => {}
    }
    match handler
        .args
        .lease
        .as_ref()
        .and_then(|lease| lease.ms.as_ref().ok())
    {
        Some(ms) => quote!(#rt::Mode::TwoPhase { lease: #rt::Duration::from_millis(#ms) }),
        None => quote!(#rt::Mode::two_phase()),
    }
}

/// The handler's own retention, `None` without `retention = "..."`.
pub(super) fn retention(handler: &Handler<'_>) -> TokenStream {
    let rt = rt();
    match handler
        .args
        .retention
        .as_ref()
        .and_then(|r| r.ms.as_ref().ok())
    {
        Some(ms) => quote!(#rt::Some(#rt::Duration::from_millis(#ms))),
        None => quote!(#rt::None),
    }
}

//! What a slice handler adds to a handler of one message: its function is called with the slice,
//! and one message alone runs as a slice of one. (That its messages must clone is checked with
//! the types.)

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::Ident;

use super::names::{rt, rt_at};
use super::setup::Setup;
use crate::ast::{Handler, Role};

/// The arguments a slice handler's function is called with, from `__idem_cx` (the slice's
/// context) and `__idem_messages`.
pub(super) fn call_args(handler: &Handler<'_>) -> Vec<TokenStream> {
    handler
        .params
        .iter()
        .map(|param| match param.role {
            Role::Transaction => quote!(__idem_cx.transaction()),
            Role::Message => quote!(__idem_messages),
            // Checked: a slice context, or nothing else.
            _ => quote!(__idem_cx),
        })
        .collect()
}

/// A free slice handler's `impl SliceHandler`, whose `handle_slice` calls the function with the
/// slice.
pub(super) fn free_impl(setup: &Setup<'_>) -> TokenStream {
    let rt = rt();
    let handler_fn = &setup.handler_fn;
    // A future that is not `Send` is reported on the function's name.
    let span = setup.span();
    let rt_span = rt_at(span);
    let slice_future = quote_spanned! {span=>
        impl #rt_span::Future<
            Output = #rt_span::Result<#rt_span::Vec<Self::Output>, Self::Error>,
        > + #rt_span::Send
    };
    let call = setup.adapted_call(&call_args(setup.handler));
    quote! {
        #[automatically_derived]
        impl #rt::SliceHandler for #handler_fn {
            fn handle_slice(
                &self,
                __idem_cx: &#rt::SliceContext<'_>,
                __idem_messages: #rt::Vec<Self::Message>,
            ) -> #slice_future {
                #call
            }
        }
    }
}

/// A slice method's hidden `handle`: its one message as a slice of one, passed to the hidden
/// function for a slice, `handle_slice_fn`.
pub(super) fn method_handle_one(handle_slice_fn: &Ident) -> TokenStream {
    let rt = rt();
    quote! {
        #rt::Box::pin(async move {
            let __idem_slice = #rt::SliceContext::new(
                #rt::transaction(__idem_cx),
                #rt::slice_of_one(__idem_cx),
            );
            let __idem_messages = #rt::vec_of_one(__idem_message);
            let __idem_outputs =
                Self::#handle_slice_fn(__idem_this, &__idem_slice, __idem_messages).await?;
            #rt::Ok(#rt::single_output(__idem_outputs))
        })
    }
}

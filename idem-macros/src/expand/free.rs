//! A free function's handler: `fn <name>_handler() -> impl Handler` (`impl SliceHandler` for a
//! slice), returning a struct defined in its body, named like the function so that diagnostics
//! listing handlers name it.

use proc_macro2::TokenStream;
use quote::quote;

use super::body::call_args;
use super::names::rt;
use super::setup::Setup;
use super::slice;

/// `fn <name>_handler()`, its struct and the struct's `Handler` (and `SliceHandler`) impl.
pub(super) fn free(setup: &Setup<'_>) -> TokenStream {
    let rt = rt();
    let (handle, slice_impl) = if setup.handler.is_slice() {
        // One message is a slice of one.
        let handle = quote!(#rt::handle_one(self, __idem_cx, __idem_message));
        (handle, slice::free_impl(setup))
    } else {
        let call = setup.adapted_call(&call_args(setup.handler));
        (call, TokenStream::new())
    };
    let handler_impl = handler_impl(setup, &handle);
    let handler_fn = &setup.handler_fn;
    let body = quote! {
        #[allow(non_camel_case_types)]
        struct #handler_fn {}

        #handler_impl
        #slice_impl

        #handler_fn {}
    };
    let target = setup.ident.to_string();
    setup.handler_fn_item(&target, TokenStream::new(), TokenStream::new(), body)
}

/// `impl Handler for <name>_handler`, whose `handle` is `handle` (with `__idem_cx: &Context` and
/// `__idem_message`).
fn handler_impl(setup: &Setup<'_>, handle: &TokenStream) -> TokenStream {
    let rt = rt();
    let Setup {
        handler_fn,
        consumer,
        mode,
        retention,
        key,
        fingerprint,
        ..
    } = setup;
    let items = setup.types.items();
    let permanent = setup.permanent().unwrap_or_else(|| quote!(false));
    let future = setup.future();
    quote! {
        #[automatically_derived]
        impl #rt::Handler for #handler_fn {
            #items

            fn consumer(&self) -> &str {
                #consumer
            }

            fn key(
                &self,
                __idem_message: &Self::Message,
                __idem_meta: &#rt::Metadata,
            ) -> #rt::Result<#rt::MessageKey, #rt::KeyError> {
                #key
            }

            #[allow(unused_variables)]
            fn fingerprint(
                &self,
                __idem_message: &Self::Message,
                __idem_fp_meta: &#rt::Metadata,
            ) -> #rt::Result<#rt::Option<#rt::Fingerprint>, #rt::FingerprintError> {
                #fingerprint
            }

            fn mode(&self) -> #rt::Mode {
                #mode
            }

            fn retention(&self) -> #rt::Option<#rt::Duration> {
                #retention
            }

            fn is_permanent(&self, __idem_error: &Self::Error) -> bool {
                #permanent
            }

            fn handle(
                &self,
                __idem_cx: &#rt::Context<'_>,
                __idem_message: Self::Message,
            ) -> #future {
                #handle
            }
        }
    }
}

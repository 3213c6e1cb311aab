//! A method's handler: `fn <name>_handler(self: &Arc<Self>) -> impl Handler` (`impl
//! SliceHandler` for a slice) and hidden associated functions in the same `impl` block (an
//! attribute on a method can add nothing else), assembled by `__private::MethodHandler`
//! (`MethodSliceHandler`).

use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::Ident;

use super::body::call_args;
use super::names::{rt, rt_at};
use super::setup::Setup;
use super::slice;

/// The names of the hidden associated functions, `__idem_<name>_key` and the like.
struct Hidden {
    key: Ident,
    fingerprint: Ident,
    handle: Ident,
    handle_slice: Ident,
}

impl Hidden {
    fn of(ident: &Ident) -> Self {
        Hidden {
            key: format_ident!("__idem_{}_key", ident),
            fingerprint: format_ident!("__idem_{}_fingerprint", ident),
            handle: format_ident!("__idem_{}_handle", ident),
            handle_slice: format_ident!("__idem_{}_handle_slice", ident),
        }
    }
}

/// `fn <name>_handler(self: &Arc<Self>)` and the hidden functions it is made of.
pub(super) fn method(setup: &Setup<'_>) -> TokenStream {
    let rt = rt();
    let hidden = Hidden::of(setup.ident);
    let bounds = service_bounds(setup);
    let spec = spec(setup, &hidden);
    let construct = construct(setup, &hidden);
    let body = quote! {
        let __idem_spec = #spec;
        #construct
    };
    let target = format!("Self::{}", setup.ident);
    let receiver = quote!(self: &#rt::Arc<Self>);
    let handler_fn = setup.handler_fn_item(&target, receiver, bounds.clone(), body);
    let hidden_fns = hidden_fns(setup, &hidden, &bounds);
    quote! {
        #handler_fn

        #hidden_fns
    }
}

/// The service's bounds: one that cannot be shared between threads is reported on the method's
/// name.
fn service_bounds(setup: &Setup<'_>) -> TokenStream {
    let span = setup.span();
    let rt = rt_at(span);
    quote_spanned! {span=>
        where
            Self: #rt::Send + #rt::Sync + 'static,
    }
}

/// The `MethodSpec`: the settings and the hidden functions.
fn spec(setup: &Setup<'_>, hidden: &Hidden) -> TokenStream {
    let rt = rt();
    let (consumer, mode, retention) = (&setup.consumer, &setup.mode, &setup.retention);
    let (key, fingerprint, handle) = (&hidden.key, &hidden.fingerprint, &hidden.handle);
    let permanent = match setup.permanent() {
        Some(call) => quote!(|__idem_error| #call),
        None => quote!(#rt::never_permanent),
    };
    quote! {
        #rt::MethodSpec {
            consumer: #consumer,
            mode: #mode,
            retention: #retention,
            key: Self::#key,
            fingerprint: Self::#fingerprint,
            permanent: #permanent,
            handle: Self::#handle,
        }
    }
}

/// The handler built from `__idem_spec`, through a function of a local type whose bounds name
/// the user's types.
///
/// Each unmet bound is reported on the type argument that lacks it, and names this local type
/// rather than a runtime item. The error type's bound is on the `impl` block, not on the
/// function: when it does not hold, the call does not resolve, nothing is built from it, and the
/// `impl Handler` returned is not checked again (a bound of the function would be reported a
/// second time there, at the output type).
fn construct(setup: &Setup<'_>, hidden: &Hidden) -> TokenStream {
    let rt = rt();
    let handler_fn = &setup.handler_fn;
    let (message, output) = (&setup.types.message, &setup.types.output);
    let handler_error = setup.types.handler_error();
    let handler_with_error = quote_spanned!(setup.types.error_span=> handler_with_error);
    // A slice method's handler also holds the hidden function for a slice.
    let (kind, new, param, arg, pass) = if setup.handler.is_slice() {
        let handle_slice = &hidden.handle_slice;
        (
            quote!(SliceHandler),
            quote!(MethodSliceHandler),
            quote!(handle_slice: #rt::HandleSliceFn<S, M, O, E>,),
            quote!(, handle_slice),
            quote!(, Self::#handle_slice,),
        )
    } else {
        let none = TokenStream::new;
        (
            quote!(Handler),
            quote!(MethodHandler),
            none(),
            none(),
            none(),
        )
    };
    quote! {
        #[allow(non_camel_case_types)]
        struct #handler_fn<E> {
            error: #rt::PhantomData<fn() -> E>,
        }
        impl<E> #handler_fn<E>
        where
            E: #rt::StdError + #rt::Send + #rt::Sync + 'static,
        {
            fn handler_with_error<S, M, O>(
                service: &#rt::Arc<S>,
                spec: #rt::MethodSpec<S, M, O, E>,
                #param
            ) -> impl #rt::#kind<Message = M, Output = O, Error = E> + 'static
            where
                S: #rt::Send + #rt::Sync + 'static,
                M: #rt::Send + 'static,
                O: #rt::Serialize + #rt::DeserializeOwned + #rt::Send + 'static,
            {
                #rt::#new::new(service, spec #arg)
            }
        }
        #handler_fn::<#handler_error>::#handler_with_error::<Self, #message, #output>(
            self,
            __idem_spec
            #pass
        )
    }
}

/// The hidden associated functions: the key, the fingerprint, the call with one message and,
/// for a slice, the call with a slice.
fn hidden_fns(setup: &Setup<'_>, hidden: &Hidden, bounds: &TokenStream) -> TokenStream {
    let rt = rt();
    let Setup {
        key, fingerprint, ..
    } = setup;
    let message = &setup.types.message;
    let (handle, handle_slice) = if setup.handler.is_slice() {
        let slice_call = calling(setup, &slice::call_args(setup.handler));
        let handle_slice = hidden_call(setup, &hidden.handle_slice, true, bounds, &slice_call);
        (slice::method_handle_one(&hidden.handle_slice), handle_slice)
    } else {
        (
            calling(setup, &call_args(setup.handler)),
            TokenStream::new(),
        )
    };
    let handle = hidden_call(setup, &hidden.handle, false, bounds, &handle);
    let (key_fn, fingerprint_fn) = (&hidden.key, &hidden.fingerprint);
    quote! {
        #[doc(hidden)]
        #[allow(dead_code)]
        fn #key_fn(
            __idem_message: &#message,
            __idem_meta: &#rt::Metadata,
        ) -> #rt::Result<#rt::MessageKey, #rt::KeyError> {
            #key
        }

        #[doc(hidden)]
        #[allow(dead_code, unused_variables)]
        fn #fingerprint_fn(
            __idem_message: &#message,
            __idem_fp_meta: &#rt::Metadata,
        ) -> #rt::Result<#rt::Option<#rt::Fingerprint>, #rt::FingerprintError> {
            #fingerprint
        }

        #handle

        #handle_slice
    }
}

/// A hidden function that runs `body` on a clone of the service's `Arc`: with one message and
/// its context, or with a slice (`slice`) and the slice's context.
fn hidden_call(
    setup: &Setup<'_>,
    name: &Ident,
    slice: bool,
    bounds: &TokenStream,
    body: &TokenStream,
) -> TokenStream {
    let rt = rt();
    let (message, output) = (&setup.types.message, &setup.types.output);
    let handler_error = setup.types.handler_error();
    let (context, messages, outputs) = if slice {
        (
            quote!(SliceContext),
            quote!(__idem_messages: #rt::Vec<#message>),
            quote!(#rt::Vec<#output>),
        )
    } else {
        (
            quote!(Context),
            quote!(__idem_message: #message),
            quote!(#output),
        )
    };
    quote! {
        #[doc(hidden)]
        #[allow(dead_code)]
        fn #name<'__idem>(
            __idem_this: #rt::Arc<Self>,
            __idem_cx: &'__idem #rt::#context<'__idem>,
            #messages,
        ) -> #rt::BoxFuture<'__idem, #rt::Result<#outputs, #handler_error>>
        #bounds
        {
            #body
        }
    }
}

/// The method called on `__idem_this` with `args`, its error adapted, boxed: a future that is not
/// `Send` is reported on the method's name.
fn calling(setup: &Setup<'_>, args: &[TokenStream]) -> TokenStream {
    let (span, ident, adapter) = (setup.span(), setup.ident, &setup.adapter);
    let rt = rt_at(span);
    quote_spanned! {span=>
        #rt::Box::pin(async move {
            match __idem_this.#ident(#(#args),*).await {
                #rt::Ok(output) => #rt::Ok(output),
                #rt::Err(error) => #rt::Err(#adapter::adapt(error)),
            }
        })
    }
}

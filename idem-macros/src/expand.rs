//! Generating the handler next to the annotated function.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, ItemFn};

use crate::attr::Args;
use crate::valid::{self, Fingerprint, Kind, Mode, Spec};

/// The whole macro: parse, validate, expand; on an error, the error and the function unchanged.
pub(crate) fn idempotent(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item_fn = match syn::parse2::<ItemFn>(item.clone()) {
        Ok(item_fn) => item_fn,
        Err(_) => {
            let error = syn::Error::new(
                Span::call_site(),
                "`#[idempotent]` applies to an `async fn` (a free function or a method with `&self`)",
            );
            return with_item(error, item);
        }
    };
    let spec = syn::parse2::<Args>(attr).and_then(|args| valid::validate(args, &item_fn));
    match spec {
        Ok(spec) => {
            let generated = expand(&spec);
            quote! {
                #item_fn
                #generated
            }
        }
        Err(error) => with_item(error, item),
    }
}

/// The error next to the item unchanged, so that one mistake gives one error.
fn with_item(error: syn::Error, item: TokenStream) -> TokenStream {
    let error = error.into_compile_error();
    quote! {
        #error
        #item
    }
}

fn expand(spec: &Spec) -> TokenStream {
    if spec.method {
        expand_method(spec)
    } else {
        expand_free(spec)
    }
}

/// `::idem_runtime::__private`.
fn rt() -> TokenStream {
    quote!(::idem_runtime::__private)
}

/// `::idem_runtime::__private`, spanned at a user's token: an error in an expression built with
/// it is reported there.
fn rt_at(span: Span) -> TokenStream {
    quote_spanned!(span=> ::idem_runtime::__private)
}

fn handler_ident(spec: &Spec) -> Ident {
    format_ident!("{}_handler", spec.ident)
}

/// `impl Handler<Message = M, Output = O, Error = E> + 'static`.
///
/// Spanned at the output type: for a method, an unmet bound of the runtime's generic handler
/// is reported there rather than on the attribute.
fn return_type(spec: &Spec) -> TokenStream {
    let span = spec.output_span;
    let rt = rt_at(span);
    let message = &spec.message_ty;
    let (output, error) = output_and_error(spec);
    quote_spanned! {span=>
        impl #rt::Handler<Message = #message, Output = #output, Error = #error> + 'static
    }
}

/// The output and error types, spanned at the user's types so that unmet bounds are reported
/// there.
fn output_and_error(spec: &Spec) -> (TokenStream, TokenStream) {
    let ret = &spec.ret;
    let output_rt = rt_at(spec.output_span);
    let error_rt = rt_at(spec.error_span);
    let output = match &spec.output_ty {
        Some(ty) => quote!(#ty),
        None => quote_spanned!(spec.output_span=> #output_rt::OutputOf<#ret>),
    };
    let error = match &spec.error_ty {
        Some(ty) => quote!(#ty),
        None => quote_spanned!(spec.error_span=> #error_rt::ErrorOf<#ret>),
    };
    (output, error)
}

/// The consumer name: the `consumer = "..."` literal, or a hidden constant holding
/// `"<module path>::<function name>"`, which the compiler checks to be a valid consumer name
/// (reported on the function's name).
fn consumer(spec: &Spec) -> (TokenStream, TokenStream) {
    match &spec.consumer {
        Some(name) => (TokenStream::new(), quote!(#name)),
        None => {
            let name = spec.ident.to_string();
            let span = spec.ident.span();
            let rt = rt_at(span);
            let item = quote_spanned! {span=>
                const __IDEM_CONSUMER: &str = #rt::concat!(#rt::module_path!(), "::", #name);
                const _: () = #rt::assert!(
                    __IDEM_CONSUMER.len() <= #rt::ConsumerName::MAX_LEN,
                    "the default consumer name, `<module path>::<function name>`, is longer than \
                     128 bytes: set `consumer = \"...\"`",
                );
            };
            (item, quote!(__IDEM_CONSUMER))
        }
    }
}

fn mode(spec: &Spec) -> TokenStream {
    let rt = rt();
    match spec.mode {
        Mode::Transactional => quote!(#rt::Mode::Transactional),
        Mode::TwoPhase { lease_ms: None } => quote!(#rt::Mode::two_phase()),
        Mode::TwoPhase { lease_ms: Some(ms) } => {
            quote!(#rt::Mode::TwoPhase { lease: #rt::Duration::from_millis(#ms) })
        }
    }
}

fn retention(spec: &Spec) -> TokenStream {
    let rt = rt();
    match spec.retention_ms {
        Some(ms) => quote!(#rt::Some(#rt::Duration::from_millis(#ms))),
        None => quote!(#rt::None),
    }
}

/// The body of the key function, with `__idem_message: &M` and `__idem_meta: &Metadata`.
fn key_body(spec: &Spec) -> TokenStream {
    let rt = rt();
    let pat = &spec.message_pat;
    let key = &spec.key;
    let meta = spec.meta_pat.as_ref().map(|meta| {
        quote! {
            #[allow(unused_variables)]
            let #meta = __idem_meta;
        }
    });
    quote! {
        #[allow(unused_variables)]
        let #pat = __idem_message;
        #meta
        #rt::key_of(&(#key))
    }
}

/// The body of the fingerprint function, with `__idem_message: &M` and `__idem_fp_meta:
/// &Metadata`.
fn fingerprint_body(spec: &Spec) -> TokenStream {
    let rt = rt();
    match &spec.fingerprint {
        Fingerprint::Message => {
            // A message that is not `Serialize` is reported on its type.
            let span = spec.message_ty.span();
            let rt = rt_at(span);
            quote_spanned!(span=> #rt::content_fingerprint(__idem_message, __idem_fp_meta))
        }
        Fingerprint::Off => quote!(#rt::Ok(#rt::None)),
        Fingerprint::Expr(expr) => {
            let pat = &spec.message_pat;
            quote! {
                #[allow(unused_variables)]
                let #pat = __idem_message;
                #rt::fingerprint_of(&(#expr))
            }
        }
    }
}

/// The arguments the user's function is called with, from `__idem_cx` and `__idem_message`.
fn call_args(spec: &Spec) -> Vec<TokenStream> {
    let rt = rt();
    spec.params
        .iter()
        .map(|param| match param.kind {
            Kind::Transaction => quote!(#rt::transaction(__idem_cx)),
            Kind::Metadata => quote!(__idem_cx.metadata()),
            Kind::Context => quote!(__idem_cx),
            Kind::Message => quote!(__idem_message),
        })
        .collect()
}

fn handler_doc(target: &str) -> String {
    format!(
        "The idempotent handler of [`{target}`], generated by `#[idempotent]`: run it with \
         `Inbox::process` or bind it to a queue."
    )
}

/// A free function: `fn <name>_handler() -> impl Handler` returning a unit struct defined in its
/// body.
fn expand_free(spec: &Spec) -> TokenStream {
    let rt = rt();
    let vis = &spec.vis;
    let ident = &spec.ident;
    let handler = handler_ident(spec);
    let ret_ty = return_type(spec);
    let message = &spec.message_ty;
    let (output, error) = output_and_error(spec);
    let message_span = message.span();
    let message_item = quote_spanned!(message_span=> type Message = #message;);
    let output_item = quote_spanned!(spec.output_span=> type Output = #output;);
    let error_item = quote_spanned!(spec.error_span=> type Error = #error;);
    let (consumer_item, consumer) = consumer(spec);
    let mode = mode(spec);
    let retention = retention(spec);
    let key = key_body(spec);
    let fingerprint = fingerprint_body(spec);
    let args = call_args(spec);
    // A future that is not `Send` is reported on the function's name.
    let span = ident.span();
    let rt_span = rt_at(span);
    let future = quote_spanned! {span=>
        impl #rt_span::Future<Output = #rt_span::Result<Self::Output, Self::Error>> + #rt_span::Send
    };
    let call = quote_spanned!(span=> #ident(#(#args),*));
    let permanent = match &spec.permanent {
        Some(path) => quote!((#path)(__idem_error)),
        None => quote!(false),
    };
    let doc = handler_doc(&ident.to_string());
    quote! {
        #[doc = #doc]
        #[allow(dead_code)]
        #vis fn #handler() -> #ret_ty {
            #consumer_item

            #[doc(hidden)]
            #[allow(non_camel_case_types)]
            struct __idem_handler;

            #[automatically_derived]
            impl #rt::Handler for __idem_handler {
                #message_item
                #output_item
                #error_item

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
                    #call
                }
            }

            __idem_handler
        }
    }
}

/// A method with `&self`: `fn <name>_handler(self: &Arc<Self>) -> impl Handler` and hidden
/// associated functions in the same `impl` block, assembled by `__private::MethodHandler`.
fn expand_method(spec: &Spec) -> TokenStream {
    let rt = rt();
    let vis = &spec.vis;
    let ident = &spec.ident;
    let handler = handler_ident(spec);
    let ret_ty = return_type(spec);
    let message = &spec.message_ty;
    let (output, error) = output_and_error(spec);
    let (consumer_item, consumer) = consumer(spec);
    let mode = mode(spec);
    let retention = retention(spec);
    let key = key_body(spec);
    let fingerprint = fingerprint_body(spec);
    let args = call_args(spec);
    let key_fn = format_ident!("__idem_{}_key", ident);
    let fingerprint_fn = format_ident!("__idem_{}_fingerprint", ident);
    let handle_fn = format_ident!("__idem_{}_handle", ident);
    // A future that is not `Send` is reported on the method's name.
    let span = ident.span();
    let rt_span = rt_at(span);
    let boxed = quote_spanned! {span=>
        #rt_span::Box::pin(async move { __idem_this.#ident(#(#args),*).await })
    };
    let permanent = match &spec.permanent {
        Some(path) => quote!(#path),
        None => quote!(#rt::never_permanent),
    };
    let doc = handler_doc(&format!("Self::{ident}"));
    // A service that cannot be shared between threads is reported on the method's name.
    let service_bounds = quote_spanned! {span=>
        where
            Self: #rt_span::Send + #rt_span::Sync + 'static,
    };
    // Each unmet bound is reported on the type argument that lacks it.
    let construct = quote! {
        #rt::method_handler::<Self, #message, #output, #error>(self, __idem_spec)
    };
    quote! {
        #[doc = #doc]
        #[allow(dead_code)]
        #vis fn #handler(self: &#rt::Arc<Self>) -> #ret_ty
        #service_bounds
        {
            #consumer_item
            let __idem_spec = #rt::MethodSpec {
                consumer: #consumer,
                mode: #mode,
                retention: #retention,
                key: Self::#key_fn,
                fingerprint: Self::#fingerprint_fn,
                permanent: #permanent,
                handle: Self::#handle_fn,
            };
            #construct
        }

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

        #[doc(hidden)]
        #[allow(dead_code)]
        fn #handle_fn<'__idem>(
            __idem_this: #rt::Arc<Self>,
            __idem_cx: &'__idem #rt::Context<'__idem>,
            __idem_message: #message,
        ) -> #rt::BoxFuture<'__idem, #rt::Result<#output, #error>>
        #service_bounds
        {
            #boxed
        }
    }
}

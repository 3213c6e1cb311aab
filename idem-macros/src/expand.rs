//! Generating `<name>_handler` next to the function, which is emitted unchanged.

use proc_macro2::{Delimiter, Group, Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Expr, Ident, Type};

use crate::ast::{self, Handler, Role};
use crate::attr::FingerprintArg;

/// The function and its handler.
pub(crate) fn expand(handler: &Handler<'_>) -> TokenStream {
    let func = handler.func;
    let generated = if handler.is_method() {
        method(handler)
    } else if handler.is_slice() {
        free_slice(handler)
    } else {
        free(handler)
    };
    quote! {
        #func
        #generated
    }
}

/// `::idem_runtime::__private`, spanned at a user's token: an error in an expression built with
/// it is reported there.
fn rt_at(span: Span) -> TokenStream {
    quote_spanned!(span=> ::idem_runtime::__private)
}

/// `::idem_runtime::__private`.
fn rt() -> TokenStream {
    rt_at(Span::call_site())
}

/// The name of the generated function.
pub(crate) fn handler_ident(name: &Ident) -> Ident {
    format_ident!("{}_handler", name)
}

/// The types the handler is made of, each spanned at the user's own type, so that a missing
/// bound is reported there.
struct Types {
    message: TokenStream,
    output: TokenStream,
    output_span: Span,
    /// The function's error type.
    error: TokenStream,
    error_span: Span,
    /// Whether the function's error is wrapped in a `Report`: a constant expression.
    report: TokenStream,
}

impl Types {
    fn of(handler: &Handler<'_>) -> Self {
        let message = handler
            .message_type()
            .expect("checked: one message parameter (a `Vec` for a slice)");
        let ret = handler.output.ty.expect("checked: a return type");
        let output_span = handler
            .output_type()
            .map_or_else(|| ret.span(), Spanned::span);
        let error_span = handler.output.err.map_or_else(|| ret.span(), Spanned::span);
        let output = match handler.output_type() {
            Some(ty) => ty.to_token_stream(),
            None if handler.is_slice() => {
                let rt = rt_at(output_span);
                quote_spanned!(output_span=> #rt::ElementOf<#rt::OutputOf<#ret>>)
            }
            None => {
                let rt = rt_at(output_span);
                quote_spanned!(output_span=> #rt::OutputOf<#ret>)
            }
        };
        let error = match handler.output.err {
            Some(ty) => ty.to_token_stream(),
            None => {
                let rt = rt_at(error_span);
                quote_spanned!(error_span=> #rt::ErrorOf<#ret>)
            }
        };
        let report = match handler.output.err {
            // A method's error type may name its `impl` block's generic parameters, which a
            // constant cannot: go by the spelling.
            Some(ty) if handler.is_method() => {
                let report = ast::is_report_type(ty);
                quote!(#report)
            }
            _ => {
                let rt = rt();
                quote! {{
                    #[allow(unused_imports)]
                    use #rt::ProbeFallback as _;
                    !<#rt::Probe<#error>>::IS_STD_ERROR && <#rt::Probe<#error>>::IS_REPORT
                }}
            }
        };
        Types {
            message: message.to_token_stream(),
            output,
            output_span,
            error,
            error_span,
            report,
        }
    }

    /// The handler's error type: the function's, or a `Report` of it.
    fn handler_error(&self) -> TokenStream {
        let rt = rt_at(self.error_span);
        let (error, report) = (&self.error, &self.report);
        quote_spanned!(self.error_span=> #rt::AdaptedError<#error, #report>)
    }

    /// `ErrorKind<..>`: what adapts the function's error to the handler's.
    fn kind(&self) -> TokenStream {
        let rt = rt();
        let report = &self.report;
        quote!(#rt::ErrorKind<#report>)
    }

    /// `<ErrorKind<..> as AdaptError<E>>`.
    fn adapter(&self) -> TokenStream {
        let rt = rt();
        let (kind, error) = (self.kind(), &self.error);
        quote!(<#kind as #rt::AdaptError<#error>>)
    }

    /// `impl Handler<Message = M, Output = O, Error = E> + 'static`, spanned at the output type:
    /// for a method, an unmet bound of the runtime's generic handler is reported there.
    fn return_type(&self) -> TokenStream {
        let rt = rt_at(self.output_span);
        let (message, output) = (&self.message, &self.output);
        let error = self.handler_error();
        quote_spanned! {self.output_span=>
            impl #rt::Handler<Message = #message, Output = #output, Error = #error> + 'static
        }
    }
}

/// The consumer name's expression, and the item that checks it at compile time with the
/// runtime's rules (reported at the literal, or at the function's name for the default): the
/// `consumer = "..."` literal, or `"<module path>::<function name>"`.
fn consumer(handler: &Handler<'_>) -> (TokenStream, TokenStream) {
    match &handler.consumer {
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

fn mode(handler: &Handler<'_>) -> TokenStream {
    let rt = rt();
    if handler.is_transactional() {
        return quote!(#rt::Mode::Transactional);
    }
    match handler
        .lease
        .as_ref()
        .and_then(|lease| lease.ms.as_ref().ok())
    {
        Some(ms) => quote!(#rt::Mode::TwoPhase { lease: #rt::Duration::from_millis(#ms) }),
        None => quote!(#rt::Mode::two_phase()),
    }
}

fn retention(handler: &Handler<'_>) -> TokenStream {
    let rt = rt();
    match handler.retention.as_ref().and_then(|r| r.ms.as_ref().ok()) {
        Some(ms) => quote!(#rt::Some(#rt::Duration::from_millis(#ms))),
        None => quote!(#rt::None),
    }
}

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
fn key_body(handler: &Handler<'_>) -> TokenStream {
    let key = handler.key.as_ref().expect("checked: a key");
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
fn fingerprint_body(handler: &Handler<'_>, message: &TokenStream) -> TokenStream {
    let rt = rt();
    match &handler.fingerprint {
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
fn call_args(handler: &Handler<'_>) -> Vec<TokenStream> {
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

/// The arguments a slice handler's function is called with, from `__idem_cx` (the slice's
/// context) and `__idem_messages`.
fn slice_call_args(handler: &Handler<'_>) -> Vec<TokenStream> {
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

fn handler_doc(target: &str) -> String {
    format!(
        "The idempotent handler of [`{target}`], generated by `#[idempotent]`: run it with \
         `Inbox::process` or bind it to a queue."
    )
}

/// A free function: `fn <name>_handler() -> impl Handler`, returning a struct defined in its
/// body (named like the function, so that diagnostics listing handlers name it).
fn free(handler: &Handler<'_>) -> TokenStream {
    let rt = rt();
    let vis = &handler.func.vis;
    let ident = handler.ident();
    let handler_fn = handler_ident(ident);
    let types = Types::of(handler);
    let ret_ty = types.return_type();
    let message_item = {
        let message = &types.message;
        quote_spanned!(message.span()=> type Message = #message;)
    };
    let output_item = {
        let output = &types.output;
        quote_spanned!(types.output_span=> type Output = #output;)
    };
    let error_item = {
        let error = types.handler_error();
        quote_spanned!(types.error_span=> type Error = #error;)
    };
    let adapter = types.adapter();
    let (consumer_check, consumer) = consumer(handler);
    let mode = mode(handler);
    let retention = retention(handler);
    let key = key_body(handler);
    let fingerprint = fingerprint_body(handler, &types.message);
    let args = call_args(handler);
    let permanent = match &handler.permanent {
        Some(path) => quote!((#path)(#adapter::inner(__idem_error))),
        None => quote!(false),
    };
    // A future that is not `Send` is reported on the function's name.
    let span = ident.span();
    let rt_span = rt_at(span);
    let future = quote_spanned! {span=>
        impl #rt_span::Future<Output = #rt_span::Result<Self::Output, Self::Error>> + #rt_span::Send
    };
    let call = quote_spanned!(span=> #adapter::adapt_future(#ident(#(#args),*)));
    let doc = handler_doc(&ident.to_string());
    quote! {
        #[doc = #doc]
        #[allow(dead_code)]
        #vis fn #handler_fn() -> #ret_ty {
            #consumer_check

            #[allow(non_camel_case_types)]
            struct #handler_fn {}

            #[automatically_derived]
            impl #rt::Handler for #handler_fn {
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

            #handler_fn {}
        }
    }
}

/// A slice handler: `fn <name>_handler() -> impl SliceHandler`, whose `handle_slice` calls the
/// function with the slice and whose `handle` calls it with a slice of one message.
fn free_slice(handler: &Handler<'_>) -> TokenStream {
    let rt = rt();
    let vis = &handler.func.vis;
    let ident = handler.ident();
    let handler_fn = handler_ident(ident);
    let types = Types::of(handler);
    let (message, output) = (&types.message, &types.output);
    let handler_error = types.handler_error();
    let ret_ty = {
        let rt = rt_at(types.output_span);
        quote_spanned! {types.output_span=>
            impl #rt::SliceHandler<Message = #message, Output = #output, Error = #handler_error>
                + 'static
        }
    };
    let message_item = quote_spanned!(message.span()=> type Message = #message;);
    let output_item = quote_spanned!(types.output_span=> type Output = #output;);
    let error_item = quote_spanned!(types.error_span=> type Error = #handler_error;);
    // Messages a slice handler gets are cloned (a slice may run again in halves): a message
    // type that is not `Clone` is reported on it.
    let clone_check = {
        let span = message.span();
        let rt = rt_at(span);
        quote_spanned!(span=> #rt::slice_message::<#message>();)
    };
    let adapter = types.adapter();
    let (consumer_check, consumer) = consumer(handler);
    let retention = retention(handler);
    let key = key_body(handler);
    let fingerprint = fingerprint_body(handler, message);
    let args = slice_call_args(handler);
    let permanent = match &handler.permanent {
        Some(path) => quote!((#path)(#adapter::inner(__idem_error))),
        None => quote!(false),
    };
    // A future that is not `Send` is reported on the function's name.
    let span = ident.span();
    let rt_span = rt_at(span);
    let future = quote_spanned! {span=>
        impl #rt_span::Future<Output = #rt_span::Result<Self::Output, Self::Error>> + #rt_span::Send
    };
    let slice_future = quote_spanned! {span=>
        impl #rt_span::Future<
            Output = #rt_span::Result<#rt_span::Vec<Self::Output>, Self::Error>,
        > + #rt_span::Send
    };
    let call = quote_spanned!(span=> #adapter::adapt_future(#ident(#(#args),*)));
    let doc = handler_doc(&ident.to_string());
    quote! {
        #[doc = #doc]
        #[allow(dead_code)]
        #vis fn #handler_fn() -> #ret_ty {
            #consumer_check
            #clone_check

            #[allow(non_camel_case_types)]
            struct #handler_fn {}

            #[automatically_derived]
            impl #rt::Handler for #handler_fn {
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
                    #rt::Mode::Transactional
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
                    #rt::handle_one(self, __idem_cx, __idem_message)
                }
            }

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

            #handler_fn {}
        }
    }
}

/// A method with `&self`: `fn <name>_handler(self: &Arc<Self>) -> impl Handler` and hidden
/// associated functions in the same `impl` block, assembled by `__private::MethodHandler`.
fn method(handler: &Handler<'_>) -> TokenStream {
    let rt = rt();
    let vis = &handler.func.vis;
    let ident = handler.ident();
    let handler_fn = handler_ident(ident);
    let types = Types::of(handler);
    let message = &types.message;
    let output = &types.output;
    let handler_error = types.handler_error();
    let ret_ty = if handler.is_slice() {
        let rt = rt_at(types.output_span);
        quote_spanned! {types.output_span=>
            impl #rt::SliceHandler<Message = #message, Output = #output, Error = #handler_error>
                + 'static
        }
    } else {
        types.return_type()
    };
    let adapter = types.adapter();
    let (consumer_check, consumer) = consumer(handler);
    let mode = mode(handler);
    let retention = retention(handler);
    let key = key_body(handler);
    let fingerprint = fingerprint_body(handler, message);
    let key_fn = format_ident!("__idem_{}_key", ident);
    let fingerprint_fn = format_ident!("__idem_{}_fingerprint", ident);
    let handle_fn = format_ident!("__idem_{}_handle", ident);
    let handle_slice_fn = format_ident!("__idem_{}_handle_slice", ident);
    // A future that is not `Send` is reported on the method's name.
    let span = ident.span();
    let rt_span = rt_at(span);
    let calling = |args: Vec<TokenStream>| {
        quote_spanned! {span=>
            #rt_span::Box::pin(async move {
                match __idem_this.#ident(#(#args),*).await {
                    #rt_span::Ok(output) => #rt_span::Ok(output),
                    #rt_span::Err(error) => #rt_span::Err(#adapter::adapt(error)),
                }
            })
        }
    };
    // A slice method's one message is a slice of one.
    let boxed = if handler.is_slice() {
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
    } else {
        calling(call_args(handler))
    };
    let permanent = match &handler.permanent {
        Some(path) => quote!(|__idem_error| (#path)(#adapter::inner(__idem_error))),
        None => quote!(#rt::never_permanent),
    };
    let doc = handler_doc(&format!("Self::{ident}"));
    // A service that cannot be shared between threads is reported on the method's name.
    let service_bounds = quote_spanned! {span=>
        where
            Self: #rt_span::Send + #rt_span::Sync + 'static,
    };
    // Each unmet bound is reported on the type argument that lacks it, and names this local
    // type rather than a runtime item. The error type's bound is on the `impl` block, not on
    // the function: when it does not hold, the call does not resolve, nothing is built from it,
    // and the `impl Handler` returned is not checked again (a bound of the function would be
    // reported a second time there, at the output type).
    let handler_with_error = quote_spanned!(types.error_span=> handler_with_error);
    let construct = if handler.is_slice() {
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
                    handle_slice: #rt::HandleSliceFn<S, M, O, E>,
                ) -> impl #rt::SliceHandler<Message = M, Output = O, Error = E> + 'static
                where
                    S: #rt::Send + #rt::Sync + 'static,
                    M: #rt::Send + 'static,
                    O: #rt::Serialize + #rt::DeserializeOwned + #rt::Send + 'static,
                {
                    #rt::MethodSliceHandler::new(service, spec, handle_slice)
                }
            }
            #handler_fn::<#handler_error>::#handler_with_error::<Self, #message, #output>(
                self,
                __idem_spec,
                Self::#handle_slice_fn,
            )
        }
    } else {
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
                ) -> impl #rt::Handler<Message = M, Output = O, Error = E> + 'static
                where
                    S: #rt::Send + #rt::Sync + 'static,
                    M: #rt::Send + 'static,
                    O: #rt::Serialize + #rt::DeserializeOwned + #rt::Send + 'static,
                {
                    #rt::MethodHandler::new(service, spec)
                }
            }
            #handler_fn::<#handler_error>::#handler_with_error::<Self, #message, #output>(self, __idem_spec)
        }
    };
    // A slice method's hidden function for a slice, and the check that its messages clone.
    let (slice_fn, clone_check) = if handler.is_slice() {
        let boxed_slice = calling(slice_call_args(handler));
        let message_span = message.span();
        let rt_message = rt_at(message_span);
        let check = quote_spanned!(message_span=> #rt_message::slice_message::<#message>(););
        let slice_fn = quote! {
            #[doc(hidden)]
            #[allow(dead_code)]
            fn #handle_slice_fn<'__idem>(
                __idem_this: #rt::Arc<Self>,
                __idem_cx: &'__idem #rt::SliceContext<'__idem>,
                __idem_messages: #rt::Vec<#message>,
            ) -> #rt::BoxFuture<'__idem, #rt::Result<#rt::Vec<#output>, #handler_error>>
            #service_bounds
            {
                #boxed_slice
            }
        };
        (slice_fn, check)
    } else {
        (TokenStream::new(), TokenStream::new())
    };
    quote! {
        #[doc = #doc]
        #[allow(dead_code)]
        #vis fn #handler_fn(self: &#rt::Arc<Self>) -> #ret_ty
        #service_bounds
        {
            #consumer_check
            #clone_check
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
        ) -> #rt::BoxFuture<'__idem, #rt::Result<#output, #handler_error>>
        #service_bounds
        {
            #boxed
        }

        #slice_fn
    }
}

/// The types a stand-in handler is written with when the real one cannot be generated: those
/// the function states plainly, generic parameters for the others.
pub(crate) fn stand_in(
    vis: &syn::Visibility,
    name: &Ident,
    method: bool,
    message: Option<&Type>,
    output: Option<&Type>,
) -> TokenStream {
    let rt = rt();
    let handler_fn = handler_ident(name);
    let (generics, message) = match message {
        Some(ty) => (TokenStream::new(), ty.to_token_stream()),
        None => (
            quote!(<__IdemMessage: #rt::Send + 'static>),
            quote!(__IdemMessage),
        ),
    };
    let output = match output {
        Some(ty) => ty.to_token_stream(),
        None => quote!(()),
    };
    let receiver = method.then(|| quote!(self: &#rt::Arc<Self>));
    let doc = handler_doc(&name.to_string());
    quote! {
        #[doc = #doc]
        #[allow(dead_code, unused_variables)]
        #vis fn #handler_fn #generics(#receiver) -> #rt::Unavailable<#message, #output> {
            #rt::Unavailable::new()
        }
    }
}

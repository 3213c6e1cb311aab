//! What every generated handler is made of, whichever shape it takes (a free function's, a
//! slice's, a method's): worked out once here, so that each shape only assembles it.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::{Ident, Visibility};

use super::body::{fingerprint_body, key_body};
use super::names::{handler_doc, handler_ident, rt_at};
use super::options::{consumer, mode, retention};
use super::types::Types;
use crate::ast::Handler;

/// The pieces of one handler.
pub(super) struct Setup<'a> {
    pub(super) handler: &'a Handler<'a>,
    /// The function's visibility, which `<name>_handler` takes.
    pub(super) vis: &'a Visibility,
    /// The function's name.
    pub(super) ident: &'a Ident,
    /// `<name>_handler`.
    pub(super) handler_fn: Ident,
    pub(super) types: Types,
    /// `<ErrorKind<..> as AdaptError<E>>`: what adapts the function's error to the handler's.
    pub(super) adapter: TokenStream,
    /// The item that checks the consumer name at compile time.
    pub(super) consumer_check: TokenStream,
    /// The consumer name's expression.
    pub(super) consumer: TokenStream,
    /// The `Mode`'s expression.
    pub(super) mode: TokenStream,
    /// The retention's expression, an `Option<Duration>`.
    pub(super) retention: TokenStream,
    /// The key function's body, with `__idem_message: &M` and `__idem_meta: &Metadata`.
    pub(super) key: TokenStream,
    /// The fingerprint function's body, with `__idem_message: &M` and `__idem_fp_meta:
    /// &Metadata`.
    pub(super) fingerprint: TokenStream,
}

impl<'a> Setup<'a> {
    pub(super) fn of(handler: &'a Handler<'a>) -> Self {
        let func = handler.func;
        let ident = handler.ident();
        let types = Types::of(handler);
        let (consumer_check, consumer) = consumer(handler);
        Setup {
            handler,
            vis: &func.vis,
            ident,
            handler_fn: handler_ident(ident),
            adapter: types.adapter(),
            consumer_check,
            consumer,
            mode: mode(handler),
            retention: retention(handler),
            key: key_body(handler),
            fingerprint: fingerprint_body(handler, &types.message),
            types,
        }
    }

    /// `fn <name>_handler(<receiver>) -> impl Handler <bounds> { ... }`, documented as the handler
    /// of `target`: the compile-time checks (the consumer name, a slice's messages that clone),
    /// then `body`.
    pub(super) fn handler_fn_item(
        &self,
        target: &str,
        receiver: TokenStream,
        bounds: TokenStream,
        body: TokenStream,
    ) -> TokenStream {
        let Setup {
            vis,
            handler_fn,
            consumer_check,
            ..
        } = self;
        let ret_ty = self.types.return_type();
        let clone_check = self.types.clone_check();
        let doc = handler_doc(target);
        quote! {
            #[doc = #doc]
            #[allow(dead_code)]
            #vis fn #handler_fn(#receiver) -> #ret_ty
            #bounds
            {
                #consumer_check
                #clone_check
                #body
            }
        }
    }

    /// The span of the function's name: a future that is not `Send`, or a service that cannot
    /// be shared between threads, is reported there.
    pub(super) fn span(&self) -> Span {
        self.ident.span()
    }

    /// `permanent = <path>` called with the function's error inside `__idem_error: &Self::Error`;
    /// `None` without the option.
    pub(super) fn permanent(&self) -> Option<TokenStream> {
        let adapter = &self.adapter;
        let path = self.handler.args.permanent.as_ref()?;
        Some(quote!((#path)(#adapter::inner(__idem_error))))
    }

    /// `impl Future<Output = Result<Self::Output, Self::Error>> + Send`, at the function's name.
    pub(super) fn future(&self) -> TokenStream {
        let span = self.span();
        let rt = rt_at(span);
        quote_spanned! {span=>
            impl #rt::Future<Output = #rt::Result<Self::Output, Self::Error>> + #rt::Send
        }
    }

    /// The function called with `args`, the error of its future adapted to the handler's.
    pub(super) fn adapted_call(&self, args: &[TokenStream]) -> TokenStream {
        let (adapter, ident) = (&self.adapter, self.ident);
        quote_spanned!(self.span()=> #adapter::adapt_future(#ident(#(#args),*)))
    }
}

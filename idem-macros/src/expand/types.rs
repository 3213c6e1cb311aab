//! The handler's message, output and error types, and the return type of `<name>_handler`.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::Ident;
use syn::spanned::Spanned;

use super::names::{rt, rt_at};
use crate::ast::{self, Handler};

/// The types the handler is made of, each spanned at the user's own type, so that a missing
/// bound is reported there.
pub(super) struct Types {
    /// One message's type.
    pub(super) message: TokenStream,
    /// One output's type.
    pub(super) output: TokenStream,
    pub(super) output_span: Span,
    /// The function's error type.
    error: TokenStream,
    pub(super) error_span: Span,
    /// Whether the function's error is wrapped in a `Report`: a constant expression.
    report: TokenStream,
    /// Whether the handler is a `SliceHandler`.
    slice: bool,
}

impl Types {
    pub(super) fn of(handler: &Handler<'_>) -> Self {
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
            slice: handler.is_slice(),
        }
    }

    /// The handler's error type: the function's, or a `Report` of it.
    pub(super) fn handler_error(&self) -> TokenStream {
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
    pub(super) fn adapter(&self) -> TokenStream {
        let rt = rt();
        let (kind, error) = (self.kind(), &self.error);
        quote!(<#kind as #rt::AdaptError<#error>>)
    }

    /// `impl Handler<Message = M, Output = O, Error = E> + 'static` (`SliceHandler` for a slice),
    /// spanned at the output type: for a method, an unmet bound of the runtime's generic handler
    /// is reported there.
    pub(super) fn return_type(&self) -> TokenStream {
        let rt = rt_at(self.output_span);
        let (message, output) = (&self.message, &self.output);
        let error = self.handler_error();
        let name = if self.slice {
            Ident::new("SliceHandler", self.output_span)
        } else {
            Ident::new("Handler", self.output_span)
        };
        quote_spanned! {self.output_span=>
            impl #rt::#name<Message = #message, Output = #output, Error = #error> + 'static
        }
    }

    /// For a slice handler, the check that its messages clone (a slice that fails runs again in
    /// halves, on copies): a message type that is not `Clone` is reported on it.
    pub(super) fn clone_check(&self) -> TokenStream {
        if !self.slice {
            return TokenStream::new();
        }
        let message = &self.message;
        let span = message.span();
        let rt = rt_at(span);
        quote_spanned!(span=> #rt::slice_message::<#message>();)
    }

    /// `type Message = M;`, `type Output = O;` and `type Error = E;`, each at the user's type.
    pub(super) fn items(&self) -> TokenStream {
        let (message, output) = (&self.message, &self.output);
        let error = self.handler_error();
        let message_item = quote_spanned!(message.span()=> type Message = #message;);
        let output_item = quote_spanned!(self.output_span=> type Output = #output;);
        let error_item = quote_spanned!(self.error_span=> type Error = #error;);
        quote! {
            #message_item
            #output_item
            #error_item
        }
    }
}

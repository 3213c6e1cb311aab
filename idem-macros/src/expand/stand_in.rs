//! The stand-in `<name>_handler()` written when the real one cannot be generated.

use proc_macro2::TokenStream;
use quote::{ToTokens, quote};
use syn::{Ident, Type};

use super::names::{handler_doc, handler_ident, rt};

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

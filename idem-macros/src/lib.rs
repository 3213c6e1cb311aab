//! `#[idempotent(...)]`: the inbox bookkeeping generated around a message handler.

mod attr;
mod expand;
mod valid;

use proc_macro::TokenStream;

/// Makes an async handler function idempotent.
#[proc_macro_attribute]
pub fn idempotent(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::idempotent(attr.into(), item.into()).into()
}

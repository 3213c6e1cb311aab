//! `#[idempotent(...)]`: the inbox bookkeeping generated around a message handler.

use proc_macro::TokenStream;

/// Makes an async handler function idempotent.
#[proc_macro_attribute]
pub fn idempotent(_attr: TokenStream, item: TokenStream) -> TokenStream {
    item
}

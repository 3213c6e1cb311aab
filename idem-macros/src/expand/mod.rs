//! Generating `<name>_handler` next to the function, which is emitted unchanged: a free
//! function's handler (`free`), a method's (`method`), either with what a slice adds (`slice`),
//! from pieces worked out once (`setup`); and the stand-in written when it cannot be generated.

mod body;
mod free;
mod method;
mod names;
mod options;
mod setup;
mod slice;
mod stand_in;
mod types;

use proc_macro2::TokenStream;
use quote::quote;

use crate::ast::Handler;
use setup::Setup;

pub(crate) use stand_in::stand_in;

/// The function and its handler.
pub(crate) fn expand(handler: &Handler<'_>) -> TokenStream {
    let func = handler.func;
    let setup = Setup::of(handler);
    let generated = if handler.is_method() {
        method::method(&setup)
    } else {
        free::free(&setup)
    };
    quote! {
        #func
        #generated
    }
}

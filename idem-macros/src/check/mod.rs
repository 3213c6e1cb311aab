//! The rules a handler must follow, one small function each, every error at the token that
//! breaks the rule. A rule that depends on another's outcome stays quiet when that one has
//! already spoken, so that one mistake gives one error.
//!
//! By what they check: the function itself (`function`), its parameters (`params`), what it
//! returns (`output`), the key and fingerprint expressions (`expr`, and `key` for a key that
//! varies per delivery), the mode and durations (`mode`), and what a slice handler adds
//! (`slice`).

mod expr;
mod function;
mod key;
mod mode;
mod output;
mod params;
mod slice;

use crate::ast::Handler;
use crate::ctxt::Ctxt;
use crate::place;

/// Checks every rule, adding each error to `cx`.
pub(crate) fn check(cx: &Ctxt, handler: &Handler<'_>) {
    if place::is_in_trait_impl(handler.ident()) {
        // Nothing generated can go there; every other rule is moot.
        let name = handler.ident();
        cx.error_spanned_by(
            name,
            format!(
                "`#[idempotent]` cannot be applied to a function of a trait's `impl` block: the \
                 items it generates beside `{name}` (`{name}_handler`, ...) cannot go in it; \
                 write the handler in an inherent `impl` block or as a free function, and call \
                 it from the trait's `{name}`"
            ),
        );
        return;
    }
    function::check_is_async_fn(cx, handler);
    params::check_params_unconditional(cx, handler);
    function::check_not_generic(cx, handler);
    function::check_receiver_is_ref_self(cx, handler);
    function::check_method_names_its_consumer(cx, handler);
    function::check_not_associated_without_self(cx, handler);
    params::check_special_params_by_shared_reference(cx, handler);
    params::check_message_by_value(cx, handler);
    params::check_one_of_each(cx, handler);
    params::check_has_message(cx, handler);
    params::check_message_owned(cx, handler);
    output::check_returns_result(cx, handler);
    output::check_output_owned(cx, handler);
    expr::check_key_given(cx, handler);
    expr::check_expressions_read_the_message(cx, handler);
    key::check_key_names_the_message(cx, handler);
    mode::check_durations(cx, handler);
    mode::check_two_phase_without_transaction(cx, handler);
    mode::check_lease_only_two_phase(cx, handler);
    mode::check_retention_only_with_records(cx, handler);
    mode::check_no_fingerprint_when_natural(cx, handler);
    mode::check_entity_takes_context(cx, handler);
    slice::check_slice_context_only_in_slices(cx, handler);
    if handler.is_slice() {
        slice::check_slice_takes_vec(cx, handler);
        slice::check_slice_returns_vec(cx, handler);
        slice::check_slice_has_no_single_message_params(cx, handler);
        slice::check_slice_is_transactional(cx, handler);
    }
}

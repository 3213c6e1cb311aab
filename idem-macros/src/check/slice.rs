//! What a slice handler is: `Vec` in, `Vec` out, transactional, its messages' own parameters
//! through its `&SliceContext<'_>`.

use quote::ToTokens;

use crate::ast::{self, Handler, Role};
use crate::attr::ModeArg;
use crate::ctxt::Ctxt;

// `&SliceContext<'_>` holds the contexts of a slice's messages: only a slice handler gets one.
pub(super) fn check_slice_context_only_in_slices(cx: &Ctxt, handler: &Handler<'_>) {
    if handler.is_slice() {
        return;
    }
    if let Some(param) = handler.param(Role::SliceContext) {
        cx.error_spanned_by(
            &param.arg.ty,
            "`&SliceContext<'_>` is a slice handler's (`slice`, with the messages as `Vec<M>`); \
             a handler of one message takes `&Context<'_>`",
        );
    }
}

// The slice's messages come in one `Vec`, in the batch's order.
pub(super) fn check_slice_takes_vec(cx: &Ctxt, handler: &Handler<'_>) {
    if let Some(message) = handler.param(Role::Message)
        && message.reference.is_none()
        && ast::vec_element(&message.arg.ty).is_none()
    {
        let ty = &message.arg.ty;
        cx.error_spanned_by(
            ty,
            format!(
                "a slice handler takes its messages as `Vec<M>`: `{}: Vec<{}>`",
                message.arg.pat.to_token_stream(),
                ty.to_token_stream()
            ),
        );
    }
}

// One output per message, in their order: each is recorded with its message.
pub(super) fn check_slice_returns_vec(cx: &Ctxt, handler: &Handler<'_>) {
    if let Some(ok) = handler.output.ok
        && ast::vec_element(ok).is_none()
    {
        cx.error_spanned_by(
            ok,
            format!(
                "a slice handler returns one output per message, in their order: \
                 `Result<Vec<{}>, _>`",
                ok.to_token_stream()
            ),
        );
    }
}

// What is one message's (its metadata, its context, its outbound) comes through the slice's
// context, message by message.
pub(super) fn check_slice_has_no_single_message_params(cx: &Ctxt, handler: &Handler<'_>) {
    for param in &handler.params {
        if matches!(param.role, Role::Metadata | Role::Context | Role::Outbound) {
            cx.error_spanned_by(
                &param.arg.ty,
                format!(
                    "a slice handler takes `&SliceContext<'_>`, whose `messages()` give each \
                     message's context (its key, metadata and stagings), not `&{}`",
                    param.role.type_name()
                ),
            );
        }
    }
}

// A slice's messages share the batch's transaction and its inbox claims: a slice cannot run in
// two phases, nor without records.
pub(super) fn check_slice_is_transactional(cx: &Ctxt, handler: &Handler<'_>) {
    if let Some((mode @ (ModeArg::TwoPhase | ModeArg::Entity | ModeArg::Natural), span)) =
        handler.args.mode
    {
        cx.error_at(
            span,
            format!(
                "a slice handler is transactional: its messages' effects commit in the batch's \
                 transaction; handle one message per call for `{}`",
                mode.spelling()
            ),
        );
    }
}

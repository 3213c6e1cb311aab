//! The parameters: the message by value and owned, one of each, the runtime's by shared
//! reference, none of them conditional.

use crate::ast::{self, Handler, Role};
use crate::ctxt::Ctxt;

const PARAMS_HELP: &str = "a handler takes its message by value and, optionally, \
`&DatabaseTransaction`, `&Metadata`, `&Context<'_>` and `&Outbound<'_>`; dependencies belong \
in `&self` \
(make the handler a method of a service)";

// The generated code passes every parameter the handler declares; one that a `#[cfg]` can
// remove would be passed anyway.
pub(super) fn check_params_unconditional(cx: &Ctxt, handler: &Handler<'_>) {
    let conditional = handler
        .params
        .iter()
        .flat_map(|param| &param.arg.attrs)
        .filter(|attr| attr.path().is_ident("cfg"));
    for attr in conditional {
        cx.error_spanned_by(
            attr,
            "a handler's parameter cannot be conditional: the inbox passes every parameter the \
             handler declares; move the condition into the body",
        );
    }
}

// The transaction, metadata and context belong to the inbox, which lends them: the handler
// takes them by shared reference.
pub(super) fn check_special_params_by_shared_reference(cx: &Ctxt, handler: &Handler<'_>) {
    for param in &handler.params {
        if param.role == Role::Message {
            continue;
        }
        let (what, name) = (param.role.describe(), param.role.type_name());
        match param.reference {
            None => cx.error_spanned_by(
                &param.arg.ty,
                format!("take the {what} by reference: `&{name}`"),
            ),
            Some(reference) => {
                if let Some(mutability) = &reference.mutability {
                    cx.error_spanned_by(
                        mutability,
                        format!("take the {what} as `&{name}`, not `&mut`"),
                    );
                }
            }
        }
    }
}

// The message is moved into the handler: by value, and of one named type (`impl Trait` would
// make the handler generic).
pub(super) fn check_message_by_value(cx: &Ctxt, handler: &Handler<'_>) {
    for param in handler.params.iter().filter(|p| p.role == Role::Message) {
        if param.reference.is_some() {
            cx.error_spanned_by(
                &param.arg.ty,
                format!("the message is taken by value, not by reference; {PARAMS_HELP}"),
            );
        } else if ast::contains_impl_trait(&param.arg.ty) {
            cx.error_spanned_by(
                &param.arg.ty,
                "`impl Trait` makes the handler generic, which `#[idempotent]` does not support: \
                 name the message's type",
            );
        }
    }
}

// One message per delivery, one transaction that records it, one metadata and one context:
// a second of any of them is a mistake (often a dependency that belongs in `&self`).
pub(super) fn check_one_of_each(cx: &Ctxt, handler: &Handler<'_>) {
    let mut seen = Vec::new();
    for param in &handler.params {
        if !seen.contains(&param.role) {
            seen.push(param.role);
            continue;
        }
        let message = match param.role {
            Role::Message => format!(
                "a handler takes exactly one message parameter, and this is a second one; \
                 {PARAMS_HELP}"
            ),
            Role::Transaction => "a handler takes at most one `&DatabaseTransaction`: all its \
                                  writes go through the one transaction that also records the \
                                  message"
                .to_owned(),
            role => format!(
                "a handler takes at most one `&{}` parameter",
                role.type_name()
            ),
        };
        cx.error_spanned_by(param.arg, message);
    }
}

// Every delivery carries a message: a handler without one has nothing to key on.
pub(super) fn check_has_message(cx: &Ctxt, handler: &Handler<'_>) {
    if handler.param(Role::Message).is_none() {
        cx.error_spanned_by(
            handler.ident(),
            format!("the handler has no message parameter; {PARAMS_HELP}"),
        );
    }
}

// The message is kept while the handler runs, which the transport may spawn: it owns its data
// (`'static` borrows, such as `Cow<'static, str>`, are fine).
pub(super) fn check_message_owned(cx: &Ctxt, handler: &Handler<'_>) {
    if let Some(message) = handler.param(Role::Message)
        && message.reference.is_none()
        && ast::borrows(&message.arg.ty)
    {
        cx.error_spanned_by(
            &message.arg.ty,
            "the message must be an owned type without lifetimes (`'static` is fine): it is \
             moved into the handler and kept while the handler runs",
        );
    }
}

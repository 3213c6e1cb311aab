//! What the function returns: a `Result` whose `Ok` value owns its data.

use crate::ast::{self, Handler};
use crate::ctxt::Ctxt;

// The `Ok` value is recorded and replayed to duplicates, an `Err` records nothing: the
// function returns a `Result`. Aliases (`anyhow::Result<T>`) are left to the type checker.
pub(super) fn check_returns_result(cx: &Ctxt, handler: &Handler<'_>) {
    const NOT_RESULTS: &[&str] = &[
        "bool", "char", "str", "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32",
        "i64", "i128", "isize", "f32", "f64", "String", "Vec", "Option", "Box", "Self",
    ];
    let Some(ty) = handler.output.ty else {
        cx.error_at(
            handler.func.sig.paren_token.span.close(),
            "an `#[idempotent]` handler returns `Result<T, E>`: the `Ok` value is recorded and \
             returned again for duplicates",
        );
        return;
    };
    let mut ty = ty;
    while let syn::Type::Paren(syn::TypeParen { elem, .. })
    | syn::Type::Group(syn::TypeGroup { elem, .. }) = ty
    {
        ty = elem;
    }
    let certainly_not = match ty {
        syn::Type::Path(path) => {
            path.qself.is_none()
                && path.path.segments.len() == 1
                && NOT_RESULTS
                    .iter()
                    .any(|name| path.path.segments[0].ident == name)
        }
        _ => true,
    };
    if certainly_not {
        cx.error_spanned_by(
            ty,
            "an `#[idempotent]` handler returns `Result<T, E>`: the `Ok` value is recorded and \
             returned again for duplicates, an `Err` records nothing",
        );
    }
}

// The output is stored and returned to duplicates long after the call: it owns its data.
pub(super) fn check_output_owned(cx: &Ctxt, handler: &Handler<'_>) {
    if let Some(ok) = handler.output.ok
        && ast::borrows(ok)
    {
        cx.error_spanned_by(
            ok,
            "the output is stored and returned again for duplicates: it must be an owned type \
             without lifetimes (`'static` is fine)",
        );
    }
}

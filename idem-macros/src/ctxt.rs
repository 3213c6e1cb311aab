//! Where the errors of one expansion are collected, so that independent mistakes are reported
//! together, each at its own token.

use std::cell::RefCell;
use std::fmt::Display;
use std::thread;

use proc_macro2::Span;
use quote::ToTokens;

/// The errors found so far. Checks add to it through a shared reference; [`Ctxt::check`] ends
/// it. Dropping it unchecked is a bug in the macro (errors would be lost), so it panics.
pub(crate) struct Ctxt {
    // `None` once checked.
    errors: RefCell<Option<Vec<syn::Error>>>,
}

impl Ctxt {
    pub(crate) fn new() -> Self {
        Ctxt {
            errors: RefCell::new(Some(Vec::new())),
        }
    }

    /// An error at the tokens `at` (their whole extent).
    pub(crate) fn error_spanned_by(&self, at: impl ToTokens, message: impl Display) {
        self.syn_error(syn::Error::new_spanned(at.into_token_stream(), message));
    }

    /// An error at `span`.
    pub(crate) fn error_at(&self, span: Span, message: impl Display) {
        self.syn_error(syn::Error::new(span, message));
    }

    /// An error from syn, as it is.
    pub(crate) fn syn_error(&self, error: syn::Error) {
        self.errors
            .borrow_mut()
            .as_mut()
            .expect("a checked context is not used again")
            .push(error);
    }

    /// Ends the context: every error found, combined into one.
    pub(crate) fn check(self) -> syn::Result<()> {
        let errors = self.errors.borrow_mut().take().expect("checked once");
        let mut errors = errors.into_iter();
        let Some(mut combined) = errors.next() else {
            return Ok(());
        };
        for error in errors {
            combined.combine(error);
        }
        Err(combined)
    }
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        if !thread::panicking() && self.errors.borrow().is_some() {
            panic!("an `idem_macros::ctxt::Ctxt` was dropped without `check()`");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_combined_in_order() {
        let cx = Ctxt::new();
        cx.error_at(Span::call_site(), "first");
        cx.error_at(Span::call_site(), "second");
        let messages: Vec<String> = cx
            .check()
            .unwrap_err()
            .into_iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(messages, ["first", "second"]);
        assert!(Ctxt::new().check().is_ok());
    }

    #[test]
    #[should_panic(expected = "without `check()`")]
    fn an_unchecked_context_panics() {
        let cx = Ctxt::new();
        drop(cx);
    }
}

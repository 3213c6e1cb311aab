//! The names a parameter's pattern binds, and the pattern as the generated code binds it.

use syn::visit::{self, Visit};
use syn::visit_mut::{self, VisitMut};
use syn::{Ident, Pat};

/// The names a pattern binds.
pub(crate) fn bindings(pat: &Pat) -> Vec<Ident> {
    struct Bindings(Vec<Ident>);
    impl<'ast> Visit<'ast> for Bindings {
        fn visit_pat_ident(&mut self, pat: &'ast syn::PatIdent) {
            self.0.push(pat.ident.clone());
            visit::visit_pat_ident(self, pat);
        }
    }
    let mut found = Bindings(Vec::new());
    found.visit_pat(pat);
    found.0
}

/// The pattern with its bindings' `mut` and `ref` removed: the generated code binds it to a
/// reference, where they are not allowed.
pub(crate) fn by_reference(pat: &Pat) -> Pat {
    struct Strip;
    impl VisitMut for Strip {
        fn visit_pat_ident_mut(&mut self, pat: &mut syn::PatIdent) {
            pat.by_ref = None;
            pat.mutability = None;
            visit_mut::visit_pat_ident_mut(self, pat);
        }
    }
    let mut pat = pat.clone();
    Strip.visit_pat_mut(&mut pat);
    pat
}

//! Types taken apart by their spelling: a `Vec`'s element, a `Result`'s halves, a report
//! type, a borrow, an `impl Trait`.

use syn::visit::{self, Visit};
use syn::{GenericArgument, Ident, PathArguments, Type, TypeReference};

/// The `T` of a type written `Vec<T>` (any path ending in `Vec`).
pub(crate) fn vec_element(ty: &Type) -> Option<&Type> {
    let Type::Path(path) = ty else {
        return None;
    };
    let last = path.path.segments.last()?;
    if path.qself.is_some() || last.ident != "Vec" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.iter().collect::<Vec<_>>().as_slice() {
        [GenericArgument::Type(element)] => Some(element),
        _ => None,
    }
}

/// The last identifier of a plain type path: `Metadata` in `idem_runtime::Metadata`.
pub(super) fn last_ident(ty: &Type) -> Option<&Ident> {
    match ty {
        Type::Path(path) if path.qself.is_none() => Some(&path.path.segments.last()?.ident),
        Type::Group(group) => last_ident(&group.elem),
        Type::Paren(paren) => last_ident(&paren.elem),
        _ => None,
    }
}

/// The `T` and `E` of a return type written `Result<T, E>` (or `Result<T>`, an alias with a
/// default error).
pub(super) fn result_types(ty: &Type) -> (Option<&Type>, Option<&Type>) {
    let Type::Path(path) = ty else {
        return (None, None);
    };
    let Some(last) = path.path.segments.last() else {
        return (None, None);
    };
    if path.qself.is_some() || last.ident != "Result" {
        return (None, None);
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return (None, None);
    };
    let types: Vec<&Type> = args
        .args
        .iter()
        .filter_map(|arg| match arg {
            GenericArgument::Type(ty) => Some(ty),
            _ => None,
        })
        .collect();
    match types.as_slice() {
        [ok] => (Some(ok), None),
        [ok, err] => (Some(ok), Some(err)),
        _ => (None, None),
    }
}

/// Whether an error type is written as a report type — `anyhow::Error`, `eyre::Report`,
/// `color_eyre::Report`, `Box<dyn ...>` or `BoxError` — which the handler wraps in a `Report`.
/// Methods rely on the spelling (their error type may name the `impl` block's generic
/// parameters, which the compiler's own answer cannot); free functions ask the compiler.
pub(crate) fn is_report_type(ty: &Type) -> bool {
    let Type::Path(path) = ty else {
        return false;
    };
    if path.qself.is_some() {
        return false;
    }
    let segments: Vec<String> = path
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    let Some(last) = path.path.segments.last() else {
        return false;
    };
    let in_crate = |names: &[&str]| segments.iter().any(|s| names.contains(&s.as_str()));
    match last.ident.to_string().as_str() {
        "Error" => in_crate(&["anyhow"]),
        "Report" => in_crate(&["eyre", "color_eyre"]),
        "BoxError" => true,
        "Box" => matches!(
            &last.arguments,
            PathArguments::AngleBracketed(args)
                if matches!(args.args.first(), Some(GenericArgument::Type(Type::TraitObject(_))))
        ),
        _ => false,
    }
}

/// Whether a type borrows: a reference without `'static`, or any lifetime but `'static`
/// (thiserror's `contains_non_static_lifetime`).
pub(crate) fn borrows(ty: &Type) -> bool {
    struct Borrows(bool);
    impl<'ast> Visit<'ast> for Borrows {
        fn visit_type_reference(&mut self, reference: &'ast TypeReference) {
            if reference.lifetime.is_none() {
                self.0 = true;
            }
            visit::visit_type_reference(self, reference);
        }
        fn visit_lifetime(&mut self, lifetime: &'ast syn::Lifetime) {
            if lifetime.ident != "static" {
                self.0 = true;
            }
        }
    }
    let mut found = Borrows(false);
    found.visit_type(ty);
    found.0
}

/// Whether a type contains `impl Trait`.
pub(crate) fn contains_impl_trait(ty: &Type) -> bool {
    struct ImplTrait(bool);
    impl<'ast> Visit<'ast> for ImplTrait {
        fn visit_type_impl_trait(&mut self, _: &'ast syn::TypeImplTrait) {
            self.0 = true;
        }
    }
    let mut found = ImplTrait(false);
    found.visit_type(ty);
    found.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_types_by_spelling() {
        for ty in [
            "anyhow::Error",
            "::anyhow::Error",
            "eyre::Report",
            "color_eyre::Report",
            "BoxError",
            "Box<dyn std::error::Error + Send + Sync>",
        ] {
            assert!(is_report_type(&syn::parse_str(ty).unwrap()), "{ty}");
        }
        for ty in ["Error", "MailError", "std::io::Error", "Box<MailError>"] {
            assert!(!is_report_type(&syn::parse_str(ty).unwrap()), "{ty}");
        }
    }

    #[test]
    fn borrowing_types() {
        for ty in ["&str", "&'a str", "Cow<'a, str>", "Vec<&'static &'a u8>"] {
            assert!(borrows(&syn::parse_str(ty).unwrap()), "{ty}");
        }
        for ty in ["String", "Cow<'static, str>", "&'static str", "Vec<u8>"] {
            assert!(!borrows(&syn::parse_str(ty).unwrap()), "{ty}");
        }
    }
}

//! The annotated function as written: its body kept as tokens, and the `Self` in it that gives
//! an associated function away.

use proc_macro2::{Delimiter, TokenStream, TokenTree};
use quote::{ToTokens, TokenStreamExt};
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, Ident, Signature, Visibility, braced, token};

/// The annotated function, its body kept as tokens: a body that syn cannot parse (newer syntax,
/// or a syntax error the compiler reports itself) does not stop the expansion.
pub(crate) struct Func {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    brace: token::Brace,
    inner_attrs: Vec<Attribute>,
    pub(crate) body: TokenStream,
}

impl Parse for Func {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis = input.parse()?;
        let sig = input.parse()?;
        let content;
        let brace = braced!(content in input);
        let inner_attrs = content.call(Attribute::parse_inner)?;
        let body = content.parse()?;
        Ok(Func {
            attrs,
            vis,
            sig,
            brace,
            inner_attrs,
            body,
        })
    }
}

impl ToTokens for Func {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        tokens.append_all(&self.attrs);
        self.vis.to_tokens(tokens);
        self.sig.to_tokens(tokens);
        self.brace.surround(tokens, |tokens| {
            tokens.append_all(&self.inner_attrs);
            self.body.to_tokens(tokens);
        });
    }
}

/// The first `Self` in the function's signature or body, outside any `impl` or `trait` block
/// the body defines: the sign of an associated function. The body is kept as tokens, and
/// `Self` is a keyword (never a field or a variable), so the tokens are enough.
pub(crate) fn first_self_type(func: &Func) -> Option<Ident> {
    fn find(tokens: TokenStream) -> Option<Ident> {
        let mut in_item = false;
        for tree in tokens {
            match tree {
                TokenTree::Ident(ident) if ident == "impl" || ident == "trait" => in_item = true,
                TokenTree::Ident(ident) if ident == "Self" && !in_item => return Some(ident),
                TokenTree::Group(group) if group.delimiter() == Delimiter::Brace && in_item => {
                    in_item = false;
                }
                TokenTree::Group(group) if !in_item => {
                    if let Some(found) = find(group.stream()) {
                        return Some(found);
                    }
                }
                _ => {}
            }
        }
        None
    }
    find(func.sig.to_token_stream()).or_else(|| find(func.body.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_outside_nested_items_marks_an_associated_function() {
        let func = |text: &str| syn::parse_str::<Func>(text).unwrap();
        assert!(first_self_type(&func("async fn f(o: O) -> R { Self::g(&o) }")).is_some());
        assert!(
            first_self_type(&func("async fn f(o: O) -> Result<Self, E> { todo!() }")).is_some()
        );
        let nested = "async fn f(o: O) -> R { struct S; impl S { fn new() -> Self { S } } Ok(()) }";
        assert!(first_self_type(&func(nested)).is_none());
        // `impl Trait` in a type does not hide what follows it.
        let later = "async fn f(o: impl Into<O>) -> R { Self::g(o) }";
        assert!(first_self_type(&func(later)).is_some());
    }

    #[test]
    fn a_body_that_does_not_parse_is_kept() {
        let func: Func =
            syn::parse_str("async fn charge(order: Order) -> R { let x = ; x }").unwrap();
        assert_eq!(func.sig.ident, "charge");
        assert!(func.body.to_string().contains("let x ="));
    }
}

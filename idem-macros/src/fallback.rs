//! When the handler cannot be generated: the errors, the item as it was written (so that the
//! function keeps working in IDEs and its own callers), and a stand-in `<name>_handler()` so
//! that code calling it gets no second error (as thiserror's `fallback.rs` does).

use proc_macro2::{Delimiter, Group, TokenStream, TokenTree};
use quote::quote;
use syn::{Ident, Type};

use crate::ast::{self, Func, Role};
use crate::{expand, place};

/// The function parsed, but the attribute or a rule refused it: the errors, the function, and
/// a stand-in with the types the function states.
pub(crate) fn invalid(errors: syn::Error, func: &Func) -> TokenStream {
    let errors = errors.into_compile_error();
    if place::is_in_trait_impl(&func.sig.ident) {
        // A stand-in cannot go in a trait's `impl` block either.
        return quote! {
            #errors
            #func
        };
    }
    let (receiver, params) = ast::params(func);
    let message = params
        .iter()
        .find(|param| param.role == Role::Message)
        .filter(|param| {
            param.reference.is_none()
                && !ast::borrows(&param.arg.ty)
                && !ast::contains_impl_trait(&param.arg.ty)
        })
        .map(|param| &*param.arg.ty);
    let output = ast::Output::from_syn(&func.sig.output)
        .ok
        .filter(|ok| !ast::borrows(ok));
    let stand_in = expand::stand_in(
        &func.vis,
        &func.sig.ident,
        receiver.is_some(),
        message,
        output,
    );
    quote! {
        #errors
        #func
        #stand_in
    }
}

/// The item did not parse as a function.
///
/// Another kind of item (a `struct`, an `impl` block) is refused at its first token. A function
/// is emitted next to a stand-in handler, with a body that only diverges:
///
/// - with a body of its own, the compiler, which read the item before the macro did, reports
///   the syntax error itself, better than syn (with a suggestion); syn's error would be a second
///   one at the same token, and the body's uses of a parameter the compiler could not read one
///   more each, so both are left out;
/// - without one (a declaration, which a trait accepts), the compiler may report nothing, so the
///   missing body is the error.
pub(crate) fn unparsed(error: syn::Error, item: TokenStream) -> TokenStream {
    let Some(function) = Function::find(&item) else {
        let at = first_token_of_kind(&item).map_or_else(|| error.span(), |tree| tree.span());
        let error = syn::Error::new(
            at,
            "`#[idempotent]` applies to an `async fn` (a free function or a method with `&self`)",
        )
        .into_compile_error();
        return quote! {
            #error
            #item
        };
    };
    let error = match &function.end {
        End::Body => None,
        End::Semicolon(semi) => Some(syn::Error::new(
            semi.span(),
            "`#[idempotent]` needs the function's body",
        )),
        End::Other => Some(syn::Error::new(
            error.span(),
            format!("`#[idempotent]` could not read this function: {error}"),
        )),
    }
    .map(syn::Error::into_compile_error);
    let item = match function.end {
        End::Other => item,
        End::Body | End::Semicolon(_) => diverging(item),
    };
    let vis = function
        .vis
        .and_then(|vis| syn::parse2(vis).ok())
        .unwrap_or(syn::Visibility::Inherited);
    let stand_in = expand::stand_in(
        &vis,
        &function.name,
        function.method,
        None,
        function.output.as_ref(),
    );
    quote! {
        #error
        #item
        #stand_in
    }
}

/// What can be read of a function that does not parse.
struct Function {
    vis: Option<TokenStream>,
    name: Ident,
    method: bool,
    /// The `T` of a `-> Result<T, ..>` that parses.
    output: Option<Type>,
    /// What it ends with.
    end: End,
}

/// How a function that does not parse ends.
enum End {
    /// A body in braces.
    Body,
    /// `;`: a declaration.
    Semicolon(TokenTree),
    /// Anything else.
    Other,
}

impl Function {
    /// The function's name after `fn`, whether its parameters start with `self` (or `&self`),
    /// its output type when that parses, and how it ends.
    fn find(item: &TokenStream) -> Option<Function> {
        let trees: Vec<TokenTree> = item.clone().into_iter().collect();
        let fn_at = trees
            .iter()
            .position(|tree| matches!(tree, TokenTree::Ident(ident) if ident == "fn"))?;
        let TokenTree::Ident(name) = trees.get(fn_at + 1)? else {
            return None;
        };
        let vis = trees[..fn_at]
            .iter()
            .position(|tree| matches!(tree, TokenTree::Ident(ident) if ident == "pub"))
            .map(|at| {
                let mut vis: TokenStream = trees[at..=at].iter().cloned().collect();
                if let Some(TokenTree::Group(group)) = trees.get(at + 1)
                    && group.delimiter() == Delimiter::Parenthesis
                {
                    vis.extend([trees[at + 1].clone()]);
                }
                vis
            });
        let rest = &trees[fn_at + 2..];
        let params = rest.iter().find_map(|tree| match tree {
            TokenTree::Group(group) if group.delimiter() == Delimiter::Parenthesis => {
                Some(group.stream())
            }
            _ => None,
        });
        let method = params.is_some_and(|params| {
            params
                .into_iter()
                .take(3)
                .any(|tree| matches!(tree, TokenTree::Ident(ident) if ident == "self"))
        });
        let output = Self::output(rest);
        let end = match rest.last() {
            Some(TokenTree::Group(group)) if group.delimiter() == Delimiter::Brace => End::Body,
            Some(semi @ TokenTree::Punct(punct)) if punct.as_char() == ';' => {
                End::Semicolon(semi.clone())
            }
            _ => End::Other,
        };
        Some(Function {
            vis,
            name: name.clone(),
            method,
            output,
            end,
        })
    }

    fn output(rest: &[TokenTree]) -> Option<Type> {
        let arrow = rest.windows(2).position(|pair| {
            matches!((&pair[0], &pair[1]), (TokenTree::Punct(a), TokenTree::Punct(b))
                if a.as_char() == '-' && b.as_char() == '>')
        })?;
        let ty: TokenStream = rest[arrow + 2..]
            .iter()
            .take_while(|tree| match tree {
                TokenTree::Group(group) => group.delimiter() != Delimiter::Brace,
                TokenTree::Ident(ident) => ident != "where",
                TokenTree::Punct(punct) => punct.as_char() != ';',
                TokenTree::Literal(_) => true,
            })
            .cloned()
            .collect();
        let ty: Type = syn::parse2(ty).ok()?;
        let output = ast::Output::from_type(&ty).ok?.clone();
        (!ast::borrows(&output)).then_some(output)
    }
}

/// The function with its body, or the `;` that stands for it, replaced by a body that only
/// diverges: the compiler has nothing more to say about it, not even that its parameters are
/// unused.
fn diverging(item: TokenStream) -> TokenStream {
    let mut trees: Vec<TokenTree> = item.into_iter().collect();
    if let Some(end) = trees.last_mut() {
        let mut body = Group::new(Delimiter::Brace, quote!(::core::unreachable!()));
        body.set_span(end.span());
        *end = TokenTree::Group(body);
    }
    quote! {
        #[allow(unused_variables)]
        #(#trees)*
    }
}

/// The token that says what kind of item this is, after its attributes and visibility:
/// `struct` in `#[derive(Debug)] pub(crate) struct Charge;`.
fn first_token_of_kind(item: &TokenStream) -> Option<TokenTree> {
    let mut trees = item.clone().into_iter().peekable();
    while let Some(tree) = trees.next() {
        match &tree {
            TokenTree::Punct(punct) if punct.as_char() == '#' => {
                trees.next(); // the attribute's brackets
            }
            TokenTree::Ident(ident) if ident == "pub" => {
                if matches!(trees.peek(), Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Parenthesis)
                {
                    trees.next();
                }
            }
            _ => return Some(tree),
        }
    }
    None
}

//! The variables an option's expression reads, found with a visitor.

use proc_macro2::{TokenStream, TokenTree};
use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Expr, Ident, LitStr, Token};

use super::pat::bindings;

/// The variables an option's expression reads, found with a visitor: a field or a method is
/// never taken for a variable (`payment.tx` reads `payment`), and names bound inside the
/// expression (closure parameters, `let`, `match` arms) are not the handler's.
#[derive(Default)]
pub(crate) struct Uses {
    /// Variables read, in order, each once.
    pub(crate) vars: Vec<Ident>,
    /// The first `self`.
    pub(crate) self_value: Option<Ident>,
    /// Variables used as metadata: `x.message_id()`, `x.header(..)`, `x.cloud_event_key()`,
    /// `x.headers`, ..., or named `meta` or `metadata`.
    pub(crate) metadata_like: Vec<Ident>,
    /// Names called as functions: `normalize` in `normalize(order.id)`.
    pub(crate) called: Vec<Ident>,
    /// Names bound inside the expression, while in scope.
    scope: Vec<Ident>,
}

const METADATA_METHODS: &[&str] = &["message_id", "header", "cloud_event_key"];
const METADATA_FIELDS: &[&str] = &[
    "message_id",
    "correlation_id",
    "redelivered",
    "headers",
    "cloud_event",
];

impl Uses {
    pub(crate) fn of(expr: &Expr) -> Self {
        let mut uses = Uses::default();
        uses.visit_expr(expr);
        uses
    }

    fn read(&mut self, ident: &Ident) {
        if ident == "self" {
            self.self_value.get_or_insert_with(|| ident.clone());
        } else if !self.scope.contains(ident) && !self.vars.contains(ident) {
            if (ident == "meta" || ident == "metadata") && !self.metadata_like.contains(ident) {
                self.metadata_like.push(ident.clone());
            }
            self.vars.push(ident.clone());
        }
    }

    /// The variable an expression is, when it is one.
    fn variable(expr: &Expr) -> Option<&Ident> {
        match expr {
            Expr::Path(path) if path.qself.is_none() => path.path.get_ident(),
            Expr::Paren(paren) => Self::variable(&paren.expr),
            Expr::Reference(reference) => Self::variable(&reference.expr),
            _ => None,
        }
    }

    fn metadata_receiver(&mut self, receiver: &Expr) {
        if let Some(ident) = Self::variable(receiver)
            && !self.scope.contains(ident)
            && !self.metadata_like.contains(ident)
        {
            self.metadata_like.push(ident.clone());
        }
    }

    /// Visits `f` with `names` in scope.
    fn scoped(&mut self, names: Vec<Ident>, f: impl FnOnce(&mut Self)) {
        let depth = self.scope.len();
        self.scope.extend(names);
        f(self);
        self.scope.truncate(depth);
    }

    /// A macro's arguments: as expressions where they parse as such (`format!`, `concat!`,
    /// `vec!`), reading the names a format string captures (`"{order_id}"`); otherwise every
    /// identifier not after a `.`, a macro being opaque to a visitor.
    fn macro_tokens(&mut self, tokens: TokenStream) {
        match macro_args(tokens.clone()) {
            Ok(exprs) => {
                for expr in &exprs {
                    if let Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Str(lit),
                        ..
                    }) = expr
                    {
                        self.format_captures(lit);
                    }
                    self.visit_expr(expr);
                }
            }
            Err(_) => self.opaque_tokens(tokens),
        }
    }

    fn format_captures(&mut self, lit: &LitStr) {
        let text = lit.value();
        let mut rest = text.as_str();
        while let Some(open) = rest.find('{') {
            rest = &rest[open + 1..];
            if rest.starts_with('{') {
                rest = &rest[1..];
                continue;
            }
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let starts_like_a_name = name
                .chars()
                .next()
                .is_some_and(|c| c.is_alphabetic() || c == '_');
            if starts_like_a_name && let Ok(ident) = syn::parse_str::<Ident>(&name) {
                self.read(&Ident::new(&ident.to_string(), lit.span()));
            }
        }
    }

    fn opaque_tokens(&mut self, tokens: TokenStream) {
        let mut after_dot = false;
        for tree in tokens {
            match &tree {
                TokenTree::Ident(ident) if !after_dot => self.read(ident),
                TokenTree::Group(group) => self.opaque_tokens(group.stream()),
                _ => {}
            }
            after_dot = matches!(&tree, TokenTree::Punct(p) if p.as_char() == '.');
        }
    }
}

/// A macro's arguments as expressions (`format!`, `concat!`, `vec!`), where they parse so.
pub(crate) fn macro_args(tokens: TokenStream) -> syn::Result<Punctuated<Expr, Token![,]>> {
    syn::parse::Parser::parse2(Punctuated::<Expr, Token![,]>::parse_terminated, tokens)
}

impl<'ast> Visit<'ast> for Uses {
    fn visit_expr_path(&mut self, expr: &'ast syn::ExprPath) {
        if expr.qself.is_none()
            && let Some(ident) = expr.path.get_ident()
        {
            self.read(ident);
        }
        visit::visit_expr_path(self, expr);
    }

    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        if let Some(ident) = Self::variable(&call.func)
            && !self.called.contains(ident)
        {
            self.called.push(ident.clone());
        }
        visit::visit_expr_call(self, call);
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        if METADATA_METHODS.iter().any(|m| call.method == m) {
            self.metadata_receiver(&call.receiver);
        }
        visit::visit_expr_method_call(self, call);
    }

    fn visit_expr_field(&mut self, field: &'ast syn::ExprField) {
        if let syn::Member::Named(name) = &field.member
            && METADATA_FIELDS.iter().any(|f| name == f)
        {
            self.metadata_receiver(&field.base);
        }
        visit::visit_expr_field(self, field);
    }

    fn visit_expr_closure(&mut self, closure: &'ast syn::ExprClosure) {
        let names = closure.inputs.iter().flat_map(bindings).collect();
        self.scoped(names, |uses| uses.visit_expr(&closure.body));
    }

    fn visit_block(&mut self, block: &'ast syn::Block) {
        let depth = self.scope.len();
        for stmt in &block.stmts {
            self.visit_stmt(stmt);
            if let syn::Stmt::Local(local) = stmt {
                self.scope.extend(bindings(&local.pat));
            }
        }
        self.scope.truncate(depth);
    }

    fn visit_arm(&mut self, arm: &'ast syn::Arm) {
        self.scoped(bindings(&arm.pat), |uses| {
            if let Some((_, guard)) = &arm.guard {
                uses.visit_expr(guard);
            }
            uses.visit_expr(&arm.body);
        });
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.macro_tokens(mac.tokens.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uses(expr: &str) -> Uses {
        Uses::of(&syn::parse_str(expr).unwrap())
    }

    fn names(idents: &[Ident]) -> Vec<String> {
        idents.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn fields_and_methods_are_not_variables() {
        assert_eq!(names(&uses("payment.tx").vars), ["payment"]);
        assert_eq!(names(&uses("order.tx()").vars), ["order"]);
        assert_eq!(names(&uses("(order.tenant, order.id)").vars), ["order"]);
    }

    #[test]
    fn macros_closures_and_locals() {
        assert_eq!(
            names(&uses("format!(\"{}{tx}\", order.id)").vars),
            ["tx", "order"]
        );
        assert_eq!(
            names(&uses("order.lines.iter().map(|tx| tx.id).sum::<u64>()").vars),
            ["order"]
        );
        assert_eq!(names(&uses("{ let tx = order.id; tx }").vars), ["order"]);
        assert!(uses("format!(\"{}\", self.prefix)").self_value.is_some());
        assert_eq!(names(&uses("my_macro!(a b . c)").vars), ["a", "b"]);
    }

    #[test]
    fn metadata_reads_are_recognised() {
        assert_eq!(names(&uses("meta.message_id()").metadata_like), ["meta"]);
        assert_eq!(names(&uses("m.header(\"x\")").metadata_like), ["m"]);
        assert_eq!(names(&uses("md.correlation_id").metadata_like), ["md"]);
        assert!(uses("order.id").metadata_like.is_empty());
    }
}

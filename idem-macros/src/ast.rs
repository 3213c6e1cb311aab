//! The annotated function as a typed handler: its parameters recognised by their types, its
//! return type taken apart, the attribute's options beside them. Nothing here judges: the rules
//! are in `check.rs`.

use proc_macro2::{Delimiter, Span, TokenStream, TokenTree};
use quote::{ToTokens, TokenStreamExt};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::visit_mut::{self, VisitMut};
use syn::{
    Attribute, Expr, FnArg, GenericArgument, Ident, LitStr, Pat, PatType, PathArguments, Receiver,
    ReturnType, Signature, Token, Type, TypeReference, Visibility, braced, token,
};

use crate::attr::{self, Args, FingerprintArg, ModeArg};
use crate::ctxt::Ctxt;

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

/// What a parameter is to the runtime, recognised by its type.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// `&DatabaseTransaction`.
    Transaction,
    /// `&Metadata`.
    Metadata,
    /// `&Context<'_>`.
    Context,
    /// `&Outbound<'_>`: what the run stages and passes downstream.
    Outbound,
    /// `&SliceContext<'_>`: a slice handler's messages' contexts.
    SliceContext,
    /// Any other type: the message (a slice handler's messages, `Vec<M>`).
    Message,
}

impl Role {
    /// What the parameter is called in messages: "transaction", "metadata", "context".
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Role::Transaction => "transaction",
            Role::Metadata => "metadata",
            Role::Context => "context",
            Role::Outbound => "outbound",
            Role::SliceContext => "slice context",
            Role::Message => "message",
        }
    }

    /// The type's name: `DatabaseTransaction`, `Metadata`, `Context`.
    pub(crate) fn type_name(self) -> &'static str {
        match self {
            Role::Transaction => "DatabaseTransaction",
            Role::Metadata => "Metadata",
            Role::Context => "Context",
            Role::Outbound => "Outbound",
            Role::SliceContext => "SliceContext",
            Role::Message => "the message type",
        }
    }
}

/// One parameter, other than `self`.
pub(crate) struct Param<'a> {
    pub(crate) arg: &'a PatType,
    pub(crate) role: Role,
    /// The `&` or `&mut` of its type, when it has one.
    pub(crate) reference: Option<&'a TypeReference>,
}

impl Param<'_> {
    /// The names its pattern binds.
    pub(crate) fn bindings(&self) -> Vec<Ident> {
        bindings(&self.arg.pat)
    }
}

/// The return type taken apart.
pub(crate) struct Output<'a> {
    /// `None` without `-> ...`.
    pub(crate) ty: Option<&'a Type>,
    /// The `T` of a `Result<T, ..>` written out.
    pub(crate) ok: Option<&'a Type>,
    /// The `E` of a `Result<T, E>` written out; `None` for an alias with a default error
    /// (`anyhow::Result<T>`).
    pub(crate) err: Option<&'a Type>,
}

/// A duration option: the literal and its value in milliseconds, or why it has none.
pub(crate) struct Duration {
    pub(crate) lit: LitStr,
    pub(crate) ms: Result<u64, String>,
}

/// The typed handler.
pub(crate) struct Handler<'a> {
    pub(crate) func: &'a Func,
    pub(crate) receiver: Option<&'a Receiver>,
    /// The parameters after `self`, in order.
    pub(crate) params: Vec<Param<'a>>,
    pub(crate) output: Output<'a>,
    pub(crate) key: Option<Expr>,
    pub(crate) consumer: Option<LitStr>,
    pub(crate) mode: Option<(ModeArg, Span)>,
    pub(crate) lease: Option<Duration>,
    pub(crate) retention: Option<Duration>,
    pub(crate) fingerprint: Option<FingerprintArg>,
    pub(crate) permanent: Option<syn::Path>,
    /// `slice`, at its token.
    pub(crate) slice: Option<Span>,
}

impl<'a> Handler<'a> {
    /// The handler of `func` with the attribute's tokens `attr`; `None` when they do not parse
    /// (the error is in `cx`).
    pub(crate) fn from_syn(cx: &Ctxt, attr: TokenStream, func: &'a Func) -> Option<Self> {
        let args: Args = match syn::parse2(attr) {
            Ok(args) => args,
            Err(error) => {
                cx.syn_error(error);
                return None;
            }
        };
        let (receiver, params) = params(func);
        let duration = |lit: LitStr| Duration {
            ms: attr::parse_duration(&lit.value()),
            lit,
        };
        Some(Handler {
            func,
            receiver,
            params,
            output: Output::from_syn(&func.sig.output),
            key: args.key,
            consumer: args.consumer,
            mode: args.mode,
            lease: args.lease.map(duration),
            retention: args.retention.map(duration),
            fingerprint: args.fingerprint,
            permanent: args.permanent,
            slice: args.slice,
        })
    }

    /// Whether the function handles a slice of messages at once.
    pub(crate) fn is_slice(&self) -> bool {
        self.slice.is_some()
    }

    /// The type of one message: the message parameter's, or its element for a slice handler
    /// (`None` when a slice handler's is not a `Vec`).
    pub(crate) fn message_type(&self) -> Option<&'a Type> {
        let ty = &*self.param(Role::Message)?.arg.ty;
        if self.is_slice() {
            vec_element(ty)
        } else {
            Some(ty)
        }
    }

    /// The type of one output: the `Ok` type, or its element for a slice handler.
    pub(crate) fn output_type(&self) -> Option<&'a Type> {
        let ok = self.output.ok?;
        if self.is_slice() {
            vec_element(ok)
        } else {
            Some(ok)
        }
    }

    /// The names an option's expression may read one message by: the message parameter's
    /// bindings, or for a slice handler the first name it reads that no parameter binds (one
    /// message of the slice, `order` in `key = order.id`), other than a function it calls or a
    /// name it uses as metadata.
    pub(crate) fn message_names(&self, expr: &Expr) -> Vec<Ident> {
        if !self.is_slice() {
            return self
                .param(Role::Message)
                .map(|param| param.bindings())
                .unwrap_or_default();
        }
        let bound: Vec<Ident> = self.params.iter().flat_map(|p| p.bindings()).collect();
        let uses = Uses::of(expr);
        // Not a message: a name starting with a capital (a constant or a unit struct), a
        // function called, a name used as the transport's metadata.
        let message = |var: &Ident| {
            !var.to_string().starts_with(char::is_uppercase)
                && !uses.called.contains(var)
                && !uses.metadata_like.contains(var)
        };
        uses.vars
            .iter()
            .find(|var| !bound.contains(var) && message(var))
            .cloned()
            .into_iter()
            .collect()
    }

    pub(crate) fn ident(&self) -> &'a Ident {
        &self.func.sig.ident
    }

    /// Whether the function takes `self` in some form.
    pub(crate) fn is_method(&self) -> bool {
        self.receiver.is_some()
    }

    /// The first parameter with `role`.
    pub(crate) fn param(&self, role: Role) -> Option<&Param<'a>> {
        self.params.iter().find(|param| param.role == role)
    }

    /// Whether the handler runs in its inbox's transaction: it takes one, or `mode =
    /// transactional` says so.
    pub(crate) fn is_transactional(&self) -> bool {
        match self.mode {
            // A slice shares the batch's transaction.
            None if self.is_slice() => true,
            Some((ModeArg::Transactional, _)) => true,
            Some((ModeArg::TwoPhase, _)) => false,
            None => self.param(Role::Transaction).is_some(),
        }
    }
}

/// The function's `self`, if any, and its other parameters.
pub(crate) fn params(func: &Func) -> (Option<&Receiver>, Vec<Param<'_>>) {
    let mut receiver = None;
    let mut params = Vec::new();
    for input in &func.sig.inputs {
        match input {
            FnArg::Receiver(r) => receiver = Some(r),
            FnArg::Typed(arg) => params.push(Param::from_syn(arg)),
        }
    }
    (receiver, params)
}

impl<'a> Param<'a> {
    fn from_syn(arg: &'a PatType) -> Self {
        let (reference, target) = match &*arg.ty {
            Type::Reference(reference) => (Some(reference), &*reference.elem),
            other => (None, other),
        };
        let role = match last_ident(target) {
            Some(name) if name == "DatabaseTransaction" => Role::Transaction,
            Some(name) if name == "Metadata" => Role::Metadata,
            Some(name) if name == "Context" => Role::Context,
            Some(name) if name == "Outbound" => Role::Outbound,
            Some(name) if name == "SliceContext" => Role::SliceContext,
            _ => Role::Message,
        };
        Param {
            arg,
            role,
            reference,
        }
    }
}

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
fn last_ident(ty: &Type) -> Option<&Ident> {
    match ty {
        Type::Path(path) if path.qself.is_none() => Some(&path.path.segments.last()?.ident),
        Type::Group(group) => last_ident(&group.elem),
        Type::Paren(paren) => last_ident(&paren.elem),
        _ => None,
    }
}

impl<'a> Output<'a> {
    pub(crate) fn from_syn(output: &'a ReturnType) -> Self {
        match output {
            ReturnType::Type(_, ty) => Self::from_type(ty),
            ReturnType::Default => Output {
                ty: None,
                ok: None,
                err: None,
            },
        }
    }

    pub(crate) fn from_type(ty: &'a Type) -> Self {
        let (ok, err) = result_types(ty);
        Output {
            ty: Some(ty),
            ok,
            err,
        }
    }
}

/// The `T` and `E` of a return type written `Result<T, E>` (or `Result<T>`, an alias with a
/// default error).
fn result_types(ty: &Type) -> (Option<&Type>, Option<&Type>) {
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

//! Checking what the arguments and the function mean, into a typed [`Spec`] for expansion.
//!
//! Every error points at the token that causes it.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{
    Expr, FnArg, GenericArgument, Ident, ItemFn, LitStr, Pat, PathArguments, ReturnType, Type,
    Visibility,
};

use crate::attr::{Args, FingerprintArg, ModeArg};

/// The longest consumer name the runtime accepts, in bytes (`ConsumerName::MAX_LEN`).
const CONSUMER_MAX_LEN: usize = 128;

/// A validated handler, ready to expand.
pub(crate) struct Spec {
    /// The function's name.
    pub(crate) ident: Ident,
    /// Its visibility, given to the generated `<name>_handler`.
    pub(crate) vis: Visibility,
    /// Whether it is a method taking `&self`.
    pub(crate) method: bool,
    /// Its parameters, in order.
    pub(crate) params: Vec<Param>,
    /// The message's type.
    pub(crate) message_ty: Type,
    /// The message parameter's pattern, with `mut` removed: bound to `&Message` for the key
    /// and fingerprint expressions.
    pub(crate) message_pat: Pat,
    /// The metadata parameter's pattern, when there is one.
    pub(crate) meta_pat: Option<Pat>,
    /// The return type, `Result<O, E>` in some spelling.
    pub(crate) ret: Type,
    /// Where to report a bound missing on the output type.
    pub(crate) output_span: Span,
    /// Where to report a bound missing on the error type.
    pub(crate) error_span: Span,
    /// The `T` of a `Result<T, ..>` written out, when it is.
    pub(crate) output_ty: Option<Type>,
    /// The `E` of a `Result<T, E>` written out, when it is.
    pub(crate) error_ty: Option<Type>,
    /// `key = <expr>`.
    pub(crate) key: Expr,
    /// The consumer name: a literal given, or none for the default.
    pub(crate) consumer: Option<LitStr>,
    /// The mode.
    pub(crate) mode: Mode,
    /// `retention = ...` in milliseconds.
    pub(crate) retention_ms: Option<u64>,
    /// What is fingerprinted.
    pub(crate) fingerprint: Fingerprint,
    /// `permanent = <path>`.
    pub(crate) permanent: Option<syn::Path>,
}

/// One parameter of the handler.
pub(crate) struct Param {
    /// What the runtime passes for it.
    pub(crate) kind: Kind,
}

/// What a parameter is, recognised by its type.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `&DatabaseTransaction`.
    Transaction,
    /// `&Metadata`.
    Metadata,
    /// `&Context<'_>`.
    Context,
    /// The message, by value.
    Message,
}

/// The mode the handler runs in.
pub(crate) enum Mode {
    Transactional,
    TwoPhase { lease_ms: Option<u64> },
}

/// What counts as the same content.
pub(crate) enum Fingerprint {
    /// The message's serialized form.
    Message,
    /// No content check.
    Off,
    /// The serialized form of this expression over the message.
    Expr(Expr),
}

/// Collects errors so that independent mistakes are all reported at once.
#[derive(Default)]
struct Errors(Option<syn::Error>);

impl Errors {
    fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    fn spanned(&mut self, tokens: impl ToTokens, message: impl std::fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}

const PARAMS_HELP: &str = "a handler takes its message by value and, optionally, \
`&DatabaseTransaction`, `&Metadata` and `&Context<'_>`; dependencies belong in `&self` \
(make the handler a method of a service)";

/// Checks `args` against `item`.
pub(crate) fn validate(args: Args, item: &ItemFn) -> syn::Result<Spec> {
    let mut errors = Errors::default();
    let sig = &item.sig;

    if let Some(constness) = &sig.constness {
        errors.spanned(
            constness,
            "`#[idempotent]` cannot be applied to a `const fn`: a handler is an `async fn`",
        );
    } else if sig.asyncness.is_none() {
        errors.spanned(
            sig.fn_token,
            "`#[idempotent]` handlers must be `async fn`: the inbox awaits the handler inside its transaction",
        );
    }
    if let Some(unsafety) = &sig.unsafety {
        errors.spanned(
            unsafety,
            "`#[idempotent]` cannot be applied to an `unsafe fn`",
        );
    }
    if let Some(abi) = &sig.abi {
        errors.spanned(abi, "`#[idempotent]` cannot be applied to an `extern` fn");
    }
    if !sig.generics.params.is_empty() {
        errors.spanned(
            &sig.generics,
            "`#[idempotent]` cannot be applied to a generic function: a handler has one message \
             type and one output type. Write a non-generic handler that calls it, or make it a \
             method of a generic service (`impl<C> Service<C> { ... }`)",
        );
    }
    if let Some(variadic) = &sig.variadic {
        errors.spanned(variadic, "`#[idempotent]` handlers cannot be variadic");
    }

    // Parameters.
    let mut method = false;
    let mut params = Vec::new();
    let mut message: Option<(Pat, Type)> = None;
    let mut meta_pat = None;
    let mut names = Names::default();
    let mut seen_tx: Option<&syn::PatType> = None;
    let mut seen_meta = false;
    let mut seen_cx = false;
    for input in &sig.inputs {
        let typed = match input {
            FnArg::Receiver(receiver) => {
                if receiver.reference.is_none()
                    || receiver.mutability.is_some()
                    || receiver.colon_token.is_some()
                {
                    errors.spanned(
                        receiver,
                        "an `#[idempotent]` method takes `&self`: the generated handler holds the \
                         service in an `Arc` and may run many messages at once",
                    );
                }
                method = true;
                continue;
            }
            FnArg::Typed(typed) => typed,
        };
        let kind = match classify(&typed.ty) {
            Ok(kind) => kind,
            Err(error) => {
                errors.push(error);
                // Its names are still the user's: no second error for a key that uses them.
                names.key.extend(pat_bindings(&typed.pat));
                continue;
            }
        };
        match kind {
            Kind::Transaction => {
                if seen_tx.is_some() {
                    errors.spanned(
                        typed,
                        "a handler takes at most one `&DatabaseTransaction`: all its writes go \
                         through the one transaction that also records the message",
                    );
                    continue;
                }
                seen_tx = Some(typed);
                names.other.extend(pat_bindings(&typed.pat));
            }
            Kind::Metadata => {
                if seen_meta {
                    errors.spanned(typed, "a handler takes at most one `&Metadata` parameter");
                    continue;
                }
                seen_meta = true;
                names.key.extend(pat_bindings(&typed.pat));
                meta_pat = Some(without_mut((*typed.pat).clone()));
            }
            Kind::Context => {
                if seen_cx {
                    errors.spanned(typed, "a handler takes at most one `&Context` parameter");
                    continue;
                }
                seen_cx = true;
                names.other.extend(pat_bindings(&typed.pat));
            }
            Kind::Message => {
                if message.is_some() {
                    errors.spanned(
                        typed,
                        format!(
                            "a handler takes exactly one message parameter, and this is a second \
                             one; {PARAMS_HELP}"
                        ),
                    );
                    continue;
                }
                if let Err(error) = check_owned(&typed.ty) {
                    errors.push(error);
                }
                names.key.extend(pat_bindings(&typed.pat));
                message = Some((without_mut((*typed.pat).clone()), (*typed.ty).clone()));
            }
        }
        params.push(Param { kind });
    }
    if message.is_none() && errors.0.is_none() {
        errors.spanned(
            &sig.ident,
            format!("the handler has no message parameter; {PARAMS_HELP}"),
        );
    }

    // Return type.
    let ret = match &sig.output {
        ReturnType::Type(_, ty) => {
            if let Err(error) = check_result(ty) {
                errors.push(error);
            }
            Some((**ty).clone())
        }
        ReturnType::Default => {
            errors.push(syn::Error::new(
                sig.paren_token.span.close(),
                "an `#[idempotent]` handler returns `Result<T, E>`: the `Ok` value is recorded \
                 and returned again for duplicates",
            ));
            None
        }
    };

    // Options.
    let key = match args.key {
        Some(key) => {
            check_names(&mut errors, &key, &names, "key");
            Some(key)
        }
        None => {
            let help = if seen_meta {
                "write `key = meta.message_id()` (with your `&Metadata` parameter's name)"
            } else {
                "take `meta: &Metadata` and write `key = meta.message_id()`"
            };
            errors.push(syn::Error::new(
                Span::call_site(),
                format!(
                    "missing `key = <expr>`: the message key is an expression over the handler's \
                     parameters, such as `key = order.id`. To key on the transport's message id, \
                     {help}"
                ),
            ));
            None
        }
    };

    if let Some(consumer) = &args.consumer {
        let name = consumer.value();
        if name.is_empty() {
            errors.spanned(consumer, "the consumer name is empty");
        } else if name.len() > CONSUMER_MAX_LEN {
            errors.spanned(
                consumer,
                format!(
                    "the consumer name is {} bytes long, more than the limit of {CONSUMER_MAX_LEN}",
                    name.len()
                ),
            );
        } else if name.contains('\0') {
            errors.spanned(consumer, "the consumer name contains a NUL character");
        }
    }

    let lease_ms = args.lease.as_ref().and_then(|lit| match duration_ms(lit) {
        Ok(ms) => Some(ms),
        Err(error) => {
            errors.push(error);
            None
        }
    });
    let retention_ms = args
        .retention
        .as_ref()
        .and_then(|lit| match duration_ms(lit) {
            Ok(ms) => Some(ms),
            Err(error) => {
                errors.push(error);
                None
            }
        });

    let mode = match (args.mode, seen_tx) {
        (Some((ModeArg::TwoPhase, span)), Some(tx)) => {
            errors.push(syn::Error::new(
                span,
                format!(
                    "`mode = two_phase` runs the handler outside any transaction, but it takes \
                     `{}`: remove that parameter, or remove `mode = two_phase` to write through \
                     the transaction",
                    tx.to_token_stream()
                ),
            ));
            Mode::Transactional
        }
        (Some((ModeArg::TwoPhase, _)), None) | (None, None) => Mode::TwoPhase { lease_ms },
        (Some((ModeArg::Transactional, _)), _) | (None, Some(_)) => Mode::Transactional,
    };
    if let (Mode::Transactional, Some(lease)) = (&mode, &args.lease) {
        let why = if seen_tx.is_some() {
            "it takes a `&DatabaseTransaction`"
        } else {
            "of `mode = transactional`"
        };
        errors.spanned(
            lease,
            format!(
                "`lease` applies to two-phase handlers only; this handler is transactional because \
                 {why}"
            ),
        );
    }

    let fingerprint = match args.fingerprint {
        None => Fingerprint::Message,
        Some(FingerprintArg::Off) => Fingerprint::Off,
        Some(FingerprintArg::Expr(expr)) => {
            check_names(&mut errors, &expr, &names, "fingerprint");
            Fingerprint::Expr(expr)
        }
    };

    errors.finish()?;
    let (message_pat, message_ty) = message.expect("checked above");
    let ret = ret.expect("checked above");
    let (output_ty, error_ty) = result_types(&ret);
    let output_span = output_ty.as_ref().map_or_else(|| ret.span(), Spanned::span);
    let error_span = error_ty.as_ref().map_or_else(|| ret.span(), Spanned::span);
    Ok(Spec {
        ident: sig.ident.clone(),
        vis: item.vis.clone(),
        method,
        params,
        message_ty,
        message_pat,
        meta_pat,
        ret,
        output_span,
        error_span,
        output_ty,
        error_ty,
        key: key.expect("checked above"),
        consumer: args.consumer,
        mode,
        retention_ms,
        fingerprint,
        permanent: args.permanent,
    })
}

/// Recognises a parameter by its type.
fn classify(ty: &Type) -> syn::Result<Kind> {
    let Type::Reference(reference) = ty else {
        if let Some(name) = special_name(ty) {
            return Err(syn::Error::new_spanned(
                ty,
                format!("take the {} by reference: `&{name}`", describe(name)),
            ));
        }
        if contains_impl_trait(ty) {
            return Err(syn::Error::new_spanned(
                ty,
                "`impl Trait` makes the handler generic, which `#[idempotent]` does not support: \
                 name the message's type",
            ));
        }
        return Ok(Kind::Message);
    };
    let Some(name) = special_name(&reference.elem) else {
        return Err(syn::Error::new_spanned(
            ty,
            format!("the message is taken by value, not by reference; {PARAMS_HELP}"),
        ));
    };
    if let Some(mutability) = &reference.mutability {
        return Err(syn::Error::new_spanned(
            mutability,
            format!("take the {} as `&{name}`, not `&mut`", describe(name)),
        ));
    }
    Ok(match name {
        "DatabaseTransaction" => Kind::Transaction,
        "Metadata" => Kind::Metadata,
        _ => Kind::Context,
    })
}

fn describe(name: &str) -> &'static str {
    match name {
        "DatabaseTransaction" => "transaction",
        "Metadata" => "metadata",
        _ => "context",
    }
}

/// `DatabaseTransaction`, `Metadata` or `Context` when the type's path ends in one of them.
fn special_name(ty: &Type) -> Option<&'static str> {
    let Type::Path(path) = ty else { return None };
    if path.qself.is_some() {
        return None;
    }
    let last = path.path.segments.last()?;
    ["DatabaseTransaction", "Metadata", "Context"]
        .into_iter()
        .find(|name| last.ident == name)
}

fn contains_impl_trait(ty: &Type) -> bool {
    let mut found = false;
    walk_tokens(ty.to_token_stream(), &mut |tree| {
        if let TokenTree::Ident(ident) = tree {
            found |= ident == "impl";
        }
    });
    found
}

/// The message must be an owned type: it is moved into the handler's future, which the
/// transport may spawn.
fn check_owned(ty: &Type) -> syn::Result<()> {
    let mut borrowed = None;
    walk_tokens(ty.to_token_stream(), &mut |tree| {
        if borrowed.is_none() {
            match tree {
                TokenTree::Punct(punct) if punct.as_char() == '&' || punct.as_char() == '\'' => {
                    borrowed = Some(punct.span());
                }
                _ => {}
            }
        }
    });
    match borrowed {
        Some(_) => Err(syn::Error::new_spanned(
            ty,
            "the message must be an owned type without lifetimes: it is moved into the handler \
             and kept while the handler runs",
        )),
        None => Ok(()),
    }
}

/// The names a key or fingerprint expression may use, and those it may not.
#[derive(Default)]
struct Names {
    /// Bindings of the message and metadata parameters.
    key: Vec<Ident>,
    /// Bindings of the transaction and context parameters: not there before the claim.
    other: Vec<Ident>,
}

/// Refuses an expression that mentions no parameter, or one that is not available yet.
fn check_names(errors: &mut Errors, expr: &Expr, names: &Names, option: &str) {
    let mut mentions_key = false;
    let mut unavailable = None;
    let mut self_token = None;
    walk_tokens(expr.to_token_stream(), &mut |tree| {
        if let TokenTree::Ident(ident) = tree {
            if names.key.iter().any(|name| name == ident) {
                mentions_key = true;
            } else if names.other.iter().any(|name| name == ident) {
                unavailable.get_or_insert_with(|| ident.clone());
            } else if ident == "self" {
                self_token.get_or_insert_with(|| ident.clone());
            }
        }
    });
    if let Some(ident) = unavailable {
        errors.spanned(
            &ident,
            format!(
                "`{option}` is computed before the message is claimed, from the message and its \
                 `&Metadata` only: `{ident}` is not available then"
            ),
        );
    } else if let Some(ident) = self_token {
        errors.spanned(
            &ident,
            format!(
                "`{option}` is computed from the message and its `&Metadata` only: `self` is not \
                 available there"
            ),
        );
    } else if !mentions_key {
        let params = names
            .key
            .iter()
            .map(|name| format!("`{name}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let params = if params.is_empty() {
            "the message parameter".to_owned()
        } else {
            params
        };
        errors.spanned(
            expr,
            format!(
                "this `{option}` expression uses none of the handler's parameters: it must be \
                 computed from {params}, so that each message gets its own {option}"
            ),
        );
    }
}

/// The identifiers a pattern binds.
fn pat_bindings(pat: &Pat) -> Vec<Ident> {
    let mut out = Vec::new();
    collect_bindings(pat, &mut out);
    out
}

fn collect_bindings(pat: &Pat, out: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(ident) => {
            out.push(ident.ident.clone());
            if let Some((_, sub)) = &ident.subpat {
                collect_bindings(sub, out);
            }
        }
        Pat::Struct(s) => s.fields.iter().for_each(|f| collect_bindings(&f.pat, out)),
        Pat::TupleStruct(s) => s.elems.iter().for_each(|p| collect_bindings(p, out)),
        Pat::Tuple(t) => t.elems.iter().for_each(|p| collect_bindings(p, out)),
        Pat::Slice(s) => s.elems.iter().for_each(|p| collect_bindings(p, out)),
        Pat::Reference(r) => collect_bindings(&r.pat, out),
        Pat::Type(t) => collect_bindings(&t.pat, out),
        Pat::Paren(p) => collect_bindings(&p.pat, out),
        Pat::Or(o) => o.cases.iter().for_each(|p| collect_bindings(p, out)),
        _ => {}
    }
}

/// The pattern without `mut` on its bindings: it is bound to a reference.
fn without_mut(pat: Pat) -> Pat {
    match pat {
        Pat::Ident(mut ident) => {
            ident.mutability = None;
            Pat::Ident(ident)
        }
        other => other,
    }
}

/// Refuses return types that are certainly not a `Result`; aliases of `Result` are checked by
/// the type checker through `__private::HandlerResult`.
fn check_result(ty: &Type) -> syn::Result<()> {
    const NOT_RESULTS: &[&str] = &[
        "bool", "char", "str", "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32",
        "i64", "i128", "isize", "f32", "f64", "String", "Vec", "Option", "Box", "Self",
    ];
    let certainly_not = match ty {
        Type::Path(path) => {
            path.qself.is_none()
                && path.path.segments.len() == 1
                && NOT_RESULTS
                    .iter()
                    .any(|name| path.path.segments[0].ident == name)
        }
        Type::Paren(paren) => return check_result(&paren.elem),
        Type::Group(group) => return check_result(&group.elem),
        _ => true,
    };
    if certainly_not {
        return Err(syn::Error::new_spanned(
            ty,
            "an `#[idempotent]` handler returns `Result<T, E>`: the `Ok` value is recorded and \
             returned again for duplicates, an `Err` records nothing",
        ));
    }
    Ok(())
}

/// The `T` and `E` of a return type written `Result<T, E>` (or `Result<T>`, an alias with a
/// default error): named directly in the generated code so that an unmet bound is reported on
/// them. Other spellings go through `__private::HandlerResult`.
fn result_types(ret: &Type) -> (Option<Type>, Option<Type>) {
    let Type::Path(path) = ret else {
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
        [ok] => (Some((*ok).clone()), None),
        [ok, err] => (Some((*ok).clone()), Some((*err).clone())),
        _ => (None, None),
    }
}

/// Visits every token, descending into groups (and so into macro calls such as `format!`).
fn walk_tokens(tokens: TokenStream, visit: &mut impl FnMut(&TokenTree)) {
    for tree in tokens {
        visit(&tree);
        if let TokenTree::Group(group) = &tree {
            walk_tokens(group.stream(), visit);
        }
    }
}

/// A duration literal (`"500ms"`, `"30s"`, `"5m"`, `"2h"`, `"14d"`) in milliseconds.
fn duration_ms(lit: &LitStr) -> syn::Result<u64> {
    parse_duration(&lit.value()).map_err(|why| syn::Error::new_spanned(lit, why))
}

pub(crate) fn parse_duration(text: &str) -> Result<u64, String> {
    const HELP: &str = "write one whole number and a unit: `500ms`, `30s`, `5m`, `2h` or `14d`";
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    let scale: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("invalid duration `{text}`: {HELP}")),
    };
    if number.is_empty() {
        return Err(format!("invalid duration `{text}`: {HELP}"));
    }
    let number: u64 = number
        .parse()
        .map_err(|_| format!("duration `{text}` is too long"))?;
    if number == 0 {
        return Err(format!("duration `{text}` is zero: it must be positive"));
    }
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("duration `{text}` is too long"))
}

#[cfg(test)]
mod tests {
    use super::parse_duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(500));
        assert_eq!(parse_duration("30s"), Ok(30_000));
        assert_eq!(parse_duration("5m"), Ok(300_000));
        assert_eq!(parse_duration("2h"), Ok(7_200_000));
        assert_eq!(parse_duration("14d"), Ok(1_209_600_000));
        for bad in [
            "", "30", "s", "0s", "1.5s", "30 s", "-1s", "30sec", "1w", " 1s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_duration("99999999999999999999d").is_err());
        assert!(parse_duration("999999999999999d").is_err());
    }
}

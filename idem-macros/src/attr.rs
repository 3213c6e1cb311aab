//! Parsing the attribute's arguments: `key = <expr>, consumer = "...", ...` into [`Args`], each
//! option kept with its tokens so that later errors can point at them.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::{Expr, LitStr, Path, Token};

mod kw {
    syn::custom_keyword!(key);
    syn::custom_keyword!(consumer);
    syn::custom_keyword!(mode);
    syn::custom_keyword!(lease);
    syn::custom_keyword!(retention);
    syn::custom_keyword!(fingerprint);
    syn::custom_keyword!(permanent);
    syn::custom_keyword!(transactional);
    syn::custom_keyword!(two_phase);
}

/// The options of one `#[idempotent(...)]`, as written.
#[derive(Default)]
pub(crate) struct Args {
    /// `key = <expr>`.
    pub(crate) key: Option<Expr>,
    /// `consumer = "<name>"`.
    pub(crate) consumer: Option<LitStr>,
    /// `mode = transactional | two_phase`.
    pub(crate) mode: Option<(ModeArg, Span)>,
    /// `lease = "30s"`.
    pub(crate) lease: Option<LitStr>,
    /// `retention = "14d"`.
    pub(crate) retention: Option<LitStr>,
    /// `fingerprint = none | <expr>`.
    pub(crate) fingerprint: Option<FingerprintArg>,
    /// `permanent = <path>`.
    pub(crate) permanent: Option<Path>,
}

/// The mode asked for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum ModeArg {
    Transactional,
    TwoPhase,
}

/// What `fingerprint = ...` says.
pub(crate) enum FingerprintArg {
    /// `fingerprint = none`: no content check.
    Off,
    /// `fingerprint = <expr>`: the serialized form of the expression.
    Expr(Expr),
}

const OPTIONS: &str =
    "`key`, `consumer`, `mode`, `lease`, `retention`, `fingerprint` or `permanent`";

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut args = Args::default();
        while !input.is_empty() {
            let lookahead = input.lookahead1();
            if lookahead.peek(kw::key) {
                let name = input.parse::<kw::key>()?;
                input.parse::<Token![=]>()?;
                set(&mut args.key, input.parse()?, name.span, "key")?;
            } else if lookahead.peek(kw::consumer) {
                let name = input.parse::<kw::consumer>()?;
                input.parse::<Token![=]>()?;
                set(&mut args.consumer, input.parse()?, name.span, "consumer")?;
            } else if lookahead.peek(kw::mode) {
                let name = input.parse::<kw::mode>()?;
                input.parse::<Token![=]>()?;
                let mode = parse_mode(input)?;
                set(&mut args.mode, mode, name.span, "mode")?;
            } else if lookahead.peek(kw::lease) {
                let name = input.parse::<kw::lease>()?;
                input.parse::<Token![=]>()?;
                set(&mut args.lease, input.parse()?, name.span, "lease")?;
            } else if lookahead.peek(kw::retention) {
                let name = input.parse::<kw::retention>()?;
                input.parse::<Token![=]>()?;
                set(&mut args.retention, input.parse()?, name.span, "retention")?;
            } else if lookahead.peek(kw::fingerprint) {
                let name = input.parse::<kw::fingerprint>()?;
                input.parse::<Token![=]>()?;
                let value = match input.parse()? {
                    Expr::Path(path) if path.qself.is_none() && path.path.is_ident("none") => {
                        FingerprintArg::Off
                    }
                    expr => FingerprintArg::Expr(expr),
                };
                set(&mut args.fingerprint, value, name.span, "fingerprint")?;
            } else if lookahead.peek(kw::permanent) {
                let name = input.parse::<kw::permanent>()?;
                input.parse::<Token![=]>()?;
                set(&mut args.permanent, input.parse()?, name.span, "permanent")?;
            } else if input.peek(syn::Ident::peek_any) {
                let ident: proc_macro2::TokenTree = input.parse()?;
                return Err(syn::Error::new_spanned(
                    &ident,
                    format!("unknown option `{ident}`: expected {OPTIONS}"),
                ));
            } else {
                return Err(lookahead.error());
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

fn parse_mode(input: ParseStream<'_>) -> syn::Result<(ModeArg, Span)> {
    let lookahead = input.lookahead1();
    if lookahead.peek(kw::transactional) {
        let token = input.parse::<kw::transactional>()?;
        Ok((ModeArg::Transactional, token.span))
    } else if lookahead.peek(kw::two_phase) {
        let token = input.parse::<kw::two_phase>()?;
        Ok((ModeArg::TwoPhase, token.span))
    } else if input.peek(syn::LitStr) {
        let lit: LitStr = input.parse()?;
        Err(syn::Error::new_spanned(
            &lit,
            "write the mode without quotes: `mode = transactional` or `mode = two_phase`",
        ))
    } else {
        Err(lookahead.error())
    }
}

fn set<T>(slot: &mut Option<T>, value: T, name: Span, option: &str) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(
            name,
            format!("`{option}` specified more than once"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

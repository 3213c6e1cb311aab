//! Parsing the attribute's arguments, `key = <expr>, consumer = "...", ...`, into [`Args`]: each
//! option kept with its tokens, so that later errors can point at them.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::{Expr, Ident, LitStr, Path, Token};

mod kw {
    syn::custom_keyword!(transactional);
    syn::custom_keyword!(two_phase);
    syn::custom_keyword!(entity);
    syn::custom_keyword!(natural);
}

/// The options of one `#[idempotent(...)]`, as written.
#[derive(Default)]
pub(crate) struct Args {
    /// `key = <expr>`.
    pub(crate) key: Option<Expr>,
    /// `consumer = "<name>"`.
    pub(crate) consumer: Option<LitStr>,
    /// `mode = transactional | two_phase | entity | natural`, with the value's span.
    pub(crate) mode: Option<(ModeArg, Span)>,
    /// `lease = "30s"`.
    pub(crate) lease: Option<Duration>,
    /// `retention = "14d"`.
    pub(crate) retention: Option<Duration>,
    /// `fingerprint = none | <expr>`.
    pub(crate) fingerprint: Option<FingerprintArg>,
    /// `permanent = <path>`.
    pub(crate) permanent: Option<Path>,
    /// `slice`: the function handles a `Vec` of messages at once.
    pub(crate) slice: Option<Span>,
}

/// A duration option: the literal and its value in milliseconds, or why it has none (a rule
/// reports that, with the other mistakes).
pub(crate) struct Duration {
    pub(crate) lit: LitStr,
    pub(crate) ms: Result<u64, String>,
}

/// The mode asked for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum ModeArg {
    Transactional,
    TwoPhase,
    /// The business entity keeps the key.
    Entity,
    /// Naturally idempotent: no bookkeeping.
    Natural,
}

impl ModeArg {
    /// How the attribute spells it.
    pub(crate) fn spelling(self) -> &'static str {
        match self {
            ModeArg::Transactional => "mode = transactional",
            ModeArg::TwoPhase => "mode = two_phase",
            ModeArg::Entity => "mode = entity",
            ModeArg::Natural => "mode = natural",
        }
    }
}

/// What `fingerprint = ...` says.
pub(crate) enum FingerprintArg {
    /// `fingerprint = none`: no content check.
    Off,
    /// `fingerprint = <expr>`: the serialized form of the expression.
    Expr(Expr),
}

const OPTIONS: &str =
    "`key`, `consumer`, `mode`, `lease`, `retention`, `fingerprint`, `permanent` or `slice`";

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut args = Args::default();
        while !input.is_empty() {
            if !input.peek(Ident::peek_any) {
                return Err(input.error(format!("expected an option: {OPTIONS}")));
            }
            let name = input.call(Ident::parse_any)?;
            match name.to_string().as_str() {
                "key" => option(input, &name, &mut args.key, <Expr as Parse>::parse)?,
                "consumer" => option(input, &name, &mut args.consumer, <LitStr as Parse>::parse)?,
                "mode" => option(input, &name, &mut args.mode, parse_mode)?,
                "lease" => option(input, &name, &mut args.lease, parse_duration_lit)?,
                "retention" => option(input, &name, &mut args.retention, parse_duration_lit)?,
                "fingerprint" => option(input, &name, &mut args.fingerprint, parse_fingerprint)?,
                "permanent" => option(input, &name, &mut args.permanent, <Path as Parse>::parse)?,
                "slice" => flag(input, &name, &mut args.slice)?,
                _ => {
                    return Err(syn::Error::new(
                        name.span(),
                        format!("unknown option `{name}`: expected {OPTIONS}"),
                    ));
                }
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

/// The rest of one option after its name, `= <value>`, into its slot: "`key` specified more
/// than once" at the second name.
fn option<T>(
    input: ParseStream<'_>,
    name: &Ident,
    slot: &mut Option<T>,
    value: fn(ParseStream<'_>) -> syn::Result<T>,
) -> syn::Result<()> {
    input.parse::<Token![=]>()?;
    let value = value(input)?;
    if slot.is_some() {
        return Err(syn::Error::new(
            name.span(),
            format!("`{name}` specified more than once"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

/// An option without a value, such as `slice`: "`slice` takes no value" at a `=`.
fn flag(input: ParseStream<'_>, name: &Ident, slot: &mut Option<Span>) -> syn::Result<()> {
    if input.peek(Token![=]) {
        return Err(syn::Error::new(
            name.span(),
            format!("`{name}` takes no value: write `{name}` alone"),
        ));
    }
    if slot.is_some() {
        return Err(syn::Error::new(
            name.span(),
            format!("`{name}` specified more than once"),
        ));
    }
    *slot = Some(name.span());
    Ok(())
}

fn parse_mode(input: ParseStream<'_>) -> syn::Result<(ModeArg, Span)> {
    let lookahead = input.lookahead1();
    if lookahead.peek(kw::transactional) {
        let token = input.parse::<kw::transactional>()?;
        Ok((ModeArg::Transactional, token.span))
    } else if lookahead.peek(kw::two_phase) {
        let token = input.parse::<kw::two_phase>()?;
        Ok((ModeArg::TwoPhase, token.span))
    } else if lookahead.peek(kw::entity) {
        let token = input.parse::<kw::entity>()?;
        Ok((ModeArg::Entity, token.span))
    } else if lookahead.peek(kw::natural) {
        let token = input.parse::<kw::natural>()?;
        Ok((ModeArg::Natural, token.span))
    } else if input.peek(LitStr) {
        let lit: LitStr = input.parse()?;
        Err(syn::Error::new_spanned(
            &lit,
            "write the mode without quotes: `mode = transactional`, `mode = two_phase`, \
             `mode = entity` or `mode = natural`",
        ))
    } else {
        Err(lookahead.error())
    }
}

fn parse_fingerprint(input: ParseStream<'_>) -> syn::Result<FingerprintArg> {
    Ok(match input.parse()? {
        Expr::Path(path) if path.qself.is_none() && path.path.is_ident("none") => {
            FingerprintArg::Off
        }
        Expr::Path(path)
            if path.qself.is_none()
                && ["None", "off"].iter().any(|off| path.path.is_ident(off)) =>
        {
            return Err(syn::Error::new_spanned(
                path,
                "to fingerprint nothing, write `fingerprint = none`",
            ));
        }
        expr => FingerprintArg::Expr(expr),
    })
}

/// A duration option's literal with its value, or why it has none: a bad duration is not a
/// parse error but a rule's, reported with the other mistakes.
fn parse_duration_lit(input: ParseStream<'_>) -> syn::Result<Duration> {
    let lit: LitStr = input.parse()?;
    Ok(Duration {
        ms: parse_duration(&lit.value()),
        lit,
    })
}

/// A duration literal (`"500ms"`, `"30s"`, `"5m"`, `"2h"`, `"14d"`) in milliseconds, or why it
/// is not one.
fn parse_duration(text: &str) -> Result<u64, String> {
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
    use super::*;

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

    #[test]
    fn options_parse_once_each() {
        let args: Args = syn::parse_quote!(key = order.id, consumer = "billing", mode = two_phase);
        assert!(args.key.is_some());
        assert_eq!(args.consumer.unwrap().value(), "billing");
        assert!(matches!(args.mode, Some((ModeArg::TwoPhase, _))));
        let repeated = syn::parse_str::<Args>("key = a.b, key = a.c");
        let error = repeated.err().expect("a repeated option is refused");
        assert_eq!(error.to_string(), "`key` specified more than once");
        let slice: Args = syn::parse_quote!(key = order.id, slice);
        assert!(slice.slice.is_some());
        let valued = syn::parse_str::<Args>("key = a.b, slice = true");
        let error = valued.err().expect("a value is refused");
        assert_eq!(
            error.to_string(),
            "`slice` takes no value: write `slice` alone"
        );
        let unknown = syn::parse_str::<Args>("retries = 3")
            .err()
            .expect("refused");
        assert!(unknown.to_string().starts_with("unknown option `retries`"));
    }
}

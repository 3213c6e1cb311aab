//! The mode and the durations: a lease only for two phases, a transaction never with them, a
//! retention only with records, no fingerprint without one, a context for entity handlers.

use quote::ToTokens;

use crate::ast::{Handler, Role};
use crate::attr::{FingerprintArg, ModeArg};
use crate::ctxt::Ctxt;

// A lease or a retention is one whole number and a unit, checked here rather than at start-up.
pub(super) fn check_durations(cx: &Ctxt, handler: &Handler<'_>) {
    for duration in [&handler.args.lease, &handler.args.retention]
        .into_iter()
        .flatten()
    {
        if let Err(why) = &duration.ms {
            cx.error_spanned_by(&duration.lit, why);
        }
    }
}

// Two-phase handlers run outside any transaction, so they cannot take one.
pub(super) fn check_two_phase_without_transaction(cx: &Ctxt, handler: &Handler<'_>) {
    if let (Some((ModeArg::TwoPhase, span)), Some(tx)) =
        (handler.args.mode, handler.param(Role::Transaction))
    {
        let pat = tx.arg.pat.to_token_stream();
        cx.error_at(
            span,
            format!(
                "`mode = two_phase` runs the handler outside any transaction, but it takes \
                 `{pat}: &DatabaseTransaction`: remove that parameter, or remove \
                 `mode = two_phase` to write through the transaction"
            ),
        );
    }
}

// A lease bounds a two-phase claim; a transactional claim lives and dies with its transaction.
pub(super) fn check_lease_only_two_phase(cx: &Ctxt, handler: &Handler<'_>) {
    let Some(lease) = &handler.args.lease else {
        return;
    };
    if matches!(handler.args.mode, Some((ModeArg::TwoPhase, _))) || !handler.is_transactional() {
        return;
    }
    let why = match handler.args.mode {
        Some((mode, _)) => format!("of `{}`", mode.spelling()),
        None => "it takes a `&DatabaseTransaction`".to_owned(),
    };
    cx.error_spanned_by(
        &lease.lit,
        format!(
            "`lease` applies to two-phase handlers only; this handler is transactional because \
             {why}"
        ),
    );
}

// A retention says how long the inbox keeps a record; entity and natural handlers have none.
pub(super) fn check_retention_only_with_records(cx: &Ctxt, handler: &Handler<'_>) {
    if let (Some(retention), Some((mode @ (ModeArg::Entity | ModeArg::Natural), _))) =
        (&handler.args.retention, handler.args.mode)
    {
        cx.error_spanned_by(
            &retention.lit,
            format!(
                "`retention` says how long the inbox keeps a handler's records; `{}` keeps none",
                mode.spelling()
            ),
        );
    }
}

// A natural handler runs without a record to compare a copy with: a fingerprint would be ignored.
pub(super) fn check_no_fingerprint_when_natural(cx: &Ctxt, handler: &Handler<'_>) {
    if let (Some(FingerprintArg::Expr(expr)), Some((ModeArg::Natural, _))) =
        (&handler.args.fingerprint, handler.args.mode)
    {
        cx.error_spanned_by(
            expr,
            "`mode = natural` keeps no record to compare a copy's fingerprint with, so a reused \
             key with other content would not be caught: remove `fingerprint`, or remove \
             `mode = natural` to have the inbox check it",
        );
    }
}

// An entity-mode handler creates its marker through the context, so it must take one.
pub(super) fn check_entity_takes_context(cx: &Ctxt, handler: &Handler<'_>) {
    if let Some((ModeArg::Entity, span)) = handler.args.mode
        && handler.param(Role::Context).is_none()
    {
        cx.error_at(
            span,
            "`mode = entity` handlers create their marker entity with `cx.create(entity)`: take \
             `cx: &Context<'_>`",
        );
    }
}

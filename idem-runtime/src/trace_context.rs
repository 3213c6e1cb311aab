//! W3C Trace Context across messages (feature `otel`): a consumer's span continues the trace of
//! the message it processes, and what a handler publishes or stages carries the handler's span
//! on, through the [`tracing`] to OpenTelemetry bridge (`tracing-opentelemetry`).
//!
//! The context travels in the `traceparent` and `tracestate` headers, the CloudEvents
//! distributed-tracing extension's names; in CloudEvents' AMQP binding they are
//! `cloudEvents:traceparent` (or `cloudEvents_traceparent`), read too. A span whose subscriber
//! has no OpenTelemetry layer carries no context: nothing is read or written then.

use opentelemetry::Context;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The header of the trace and parent span (`00-<trace id>-<span id>-<flags>`).
pub const TRACEPARENT: &str = "traceparent";

/// The header of vendors' trace state, carried along.
pub const TRACESTATE: &str = "tracestate";

/// Makes `span` a child of the span a message's headers name, if they name a valid one; call
/// it before the span is first entered. `header` reads a text header by name.
pub fn continue_trace(span: &tracing::Span, header: impl Fn(&str) -> Option<String>) {
    if let Some(parent) = remote_parent(header) {
        // A subscriber without the OpenTelemetry layer: nothing to continue.
        let _ = span.set_parent(parent);
    }
}

/// Links `span` (a batch's) to the span a message's headers name, if they name a valid one:
/// a batch has many parents, each message's trace shows the batch that processed it.
pub fn link_trace(span: &tracing::Span, header: impl Fn(&str) -> Option<String>) {
    if let Some(parent) = remote_parent(header) {
        span.add_link(parent.span().span_context().clone());
    }
}

/// Makes `span`, one message's inside a batch's span (the current one), continue the trace the
/// message's `metadata` names, linked to the batch's span: what the message's handler publishes
/// or stages goes on in the message's own trace, not in the batch's.
pub(crate) fn continue_message_trace(span: &tracing::Span, metadata: &crate::Metadata) {
    let batch = tracing::Span::current()
        .context()
        .span()
        .span_context()
        .clone();
    continue_trace(span, |name| metadata.headers.get(name).cloned());
    if batch.is_valid() {
        span.add_link(batch);
    }
}

/// The context of the span a message's headers name, if they name a valid one.
pub fn remote_parent(header: impl Fn(&str) -> Option<String>) -> Option<Context> {
    let named = |name: &str| {
        header(name)
            .or_else(|| header(&format!("cloudEvents:{name}")))
            .or_else(|| header(&format!("cloudEvents_{name}")))
    };
    let parent = parse(&named(TRACEPARENT)?, named(TRACESTATE).as_deref())?;
    Some(Context::new().with_remote_span_context(parent))
}

/// A `traceparent` of version 00 (or a later one, read as 00), with its `tracestate`. Every
/// field is lowercase hexadecimal of its exact width, as W3C Trace Context requires: anything
/// else (uppercase, a sign, version `ff`) is not a parent.
fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<SpanContext> {
    let mut parts = traceparent.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let sizes = [(version, 2), (trace, 32), (span, 16), (flags, 2)];
    let lower_hex = |part: &str| part.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if sizes
        .iter()
        .any(|(part, size)| part.len() != *size || !lower_hex(part))
        || version == "ff"
    {
        return None;
    }
    if version == "00" && parts.next().is_some() {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let context = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        TraceFlags::new(flags) & TraceFlags::SAMPLED,
        true,
        tracestate
            .and_then(|state| state.parse().ok())
            .unwrap_or_default(),
    );
    context.is_valid().then_some(context)
}

/// The headers that carry the current span's context to the next hop: `traceparent`, and
/// `tracestate` when there is one; none outside a span OpenTelemetry knows.
pub fn current_headers() -> Vec<(&'static str, String)> {
    let context = tracing::Span::current().context();
    let span = context.span();
    let current = span.span_context();
    if !current.is_valid() {
        return Vec::new();
    }
    let flags = current.trace_flags().to_u8();
    let parent = format!(
        "00-{}-{}-{flags:02x}",
        current.trace_id(),
        current.span_id()
    );
    let mut headers = vec![(TRACEPARENT, parent)];
    let state = current.trace_state().header();
    if !state.is_empty() {
        headers.push((TRACESTATE, state));
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_are_read_as_the_recommendation_writes_them() {
        let valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let read = parse(valid, Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(
            read.trace_id(),
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
        );
        assert!(read.is_remote() && read.is_sampled());
        assert_eq!(read.trace_state().header(), "congo=t61rcWkgMzE");
        for invalid in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-xyz92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-+0f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-+1",
            "",
        ] {
            assert!(parse(invalid, None).is_none(), "{invalid:?} accepted");
        }
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        assert!(
            parse(later, None).is_some(),
            "a later version is read as 00"
        );
        let cloud = |name: &str| (name == "cloudEvents:traceparent").then(|| valid.to_owned());
        assert!(remote_parent(cloud).is_some());
    }
}

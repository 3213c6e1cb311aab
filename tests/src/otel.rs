//! Spans exported in memory, for the tests of traces across services: a global subscriber with
//! the `tracing` to OpenTelemetry bridge, and what the spans it exported say.

pub use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};

use opentelemetry::trace::TracerProvider;
use tracing_subscriber::layer::SubscriberExt;

/// Installs, as the process's global subscriber, one that exports every span in memory;
/// returns the exporter and its provider (`force_flush` before reading). Once per test binary.
///
/// # Panics
///
/// When a global subscriber is installed already.
pub fn in_memory_traces() -> (InMemorySpanExporter, SdkTracerProvider) {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("idem-test"));
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    (exporter, provider)
}

/// The value of a span's attribute (a field of its `tracing` span), as text.
pub fn attribute(span: &SpanData, name: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == name)
        .map(|kv| kv.value.as_str().into_owned())
}

/// Whether `span` descends from `ancestor` among `spans`.
pub fn descends_from(spans: &[SpanData], span: &SpanData, ancestor: &SpanData) -> bool {
    let mut parent = span.parent_span_id;
    while parent != ancestor.span_context.span_id() {
        match spans.iter().find(|s| s.span_context.span_id() == parent) {
            Some(up) => parent = up.parent_span_id,
            None => return false,
        }
    }
    true
}

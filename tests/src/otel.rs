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

/// Asserts the journey of a message published twice from the span `root` (a retry): three
/// deliveries in `root`'s trace, the two to `first_queue` children of `root`, one `acked` and
/// one `duplicate`, and the one to `next_queue` (what the first hop published) descending from
/// the acked one.
///
/// # Panics
///
/// When any of that is not so.
pub fn assert_retried_message_is_one_trace(
    spans: &[SpanData],
    root: &str,
    first_queue: &str,
    next_queue: &str,
) {
    let root = (spans.iter().find(|s| s.name == root)).unwrap_or_else(|| panic!("no {root}"));
    let of_journey = |s: &&SpanData| {
        let queue = attribute(s, "queue");
        queue.as_deref() == Some(first_queue) || queue.as_deref() == Some(next_queue)
    };
    let deliveries: Vec<&SpanData> = (spans.iter())
        .filter(|s| s.name == "idem.delivery")
        .filter(of_journey)
        .collect();
    assert_eq!(deliveries.len(), 3, "{deliveries:#?}");
    for delivery in &deliveries {
        let trace = root.span_context.trace_id();
        assert_eq!(delivery.span_context.trace_id(), trace, "{delivery:#?}");
    }
    let of_queue = |queue: &str| -> Vec<&SpanData> {
        (deliveries.iter().copied())
            .filter(|s| attribute(s, "queue").as_deref() == Some(queue))
            .collect()
    };
    let firsts = of_queue(first_queue);
    let mut settles: Vec<String> = firsts
        .iter()
        .filter_map(|s| attribute(s, "settle"))
        .collect();
    settles.sort();
    assert_eq!(settles, ["acked", "duplicate"], "{firsts:#?}");
    for first in &firsts {
        assert_eq!(first.parent_span_id, root.span_context.span_id());
    }
    let acked = (firsts.iter())
        .find(|s| attribute(s, "settle").as_deref() == Some("acked"))
        .expect("an acked delivery");
    let [next] = of_queue(next_queue)[..] else {
        panic!("one delivery to {next_queue}: {deliveries:#?}");
    };
    assert!(
        descends_from(spans, next, acked),
        "the next hop's delivery descends from the first hop's: {spans:#?}"
    );
}

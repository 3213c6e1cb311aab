//! Prometheus metrics for the example services: every metric idem records (and the services'
//! own), served at an HTTP address for scraping.
//!
//! idem records through the [`metrics`](https://docs.rs/metrics) facade; a service picks the
//! recorder. Here it is `metrics-exporter-prometheus`, with histogram buckets fitted to idem's
//! histograms: durations from a millisecond to a minute, duplicate ages from a second to two
//! weeks (retention-sized), batch sizes up to the largest batch.

use std::net::SocketAddr;

use idem_runtime::metrics::{
    BATCH_DURATION_SECONDS, BATCH_SIZE, DUPLICATE_AGE_SECONDS, PROCESSING_DURATION_SECONDS,
};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder};

/// Buckets of idem's duration histograms, in seconds.
const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Buckets of duplicates' ages, in seconds: a second, a minute, ten minutes, an hour, six
/// hours, a day, three days, a week, two weeks.
const AGE_BUCKETS: &[f64] = &[
    1.0,
    60.0,
    600.0,
    3_600.0,
    21_600.0,
    86_400.0,
    259_200.0,
    604_800.0,
    1_209_600.0,
];

/// Buckets of batch sizes.
const SIZE_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1_000.0,
];

/// Installs the Prometheus recorder and serves its metrics at `addr`, from a task of the
/// current Tokio runtime (call it inside one): any path answers, `/metrics` by convention.
///
/// # Errors
///
/// The address cannot be listened on (taken, not local), or a recorder is installed already.
pub fn serve(addr: SocketAddr) -> Result<(), BuildError> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(full(PROCESSING_DURATION_SECONDS), DURATION_BUCKETS)?
        .set_buckets_for_metric(full(BATCH_DURATION_SECONDS), DURATION_BUCKETS)?
        .set_buckets_for_metric(full(DUPLICATE_AGE_SECONDS), AGE_BUCKETS)?
        .set_buckets_for_metric(full(BATCH_SIZE), SIZE_BUCKETS)?
        .install()
}

fn full(name: &str) -> Matcher {
    Matcher::Full(name.to_owned())
}

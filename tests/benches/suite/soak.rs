//! `--soak N`: memory over a long run.

use std::time::{Duration, Instant};

use idem_rabbitmq::Consumer;
use idem_runtime::Inbox;
use idem_tests::TestDb;
use idem_tests::bench::create_charges;
use idem_tests::bench::figures::{peak_rss_mb, rss_mb};
use serde_json::json;

use crate::args::Mode;
use crate::report::{round1, round3};
use crate::{POOL, Suite, charge, idem_batch_binding};

/// `--soak N`: idem's batch consumer on `n` messages, fed while it runs; resident memory every
/// 100 k.
pub(crate) async fn soak(suite: &mut Suite, n: u64) {
    const CHUNK: u64 = 50_000;
    const EVERY: u64 = 100_000;
    let backend = suite.args.backends[0];
    let prefetch = suite.args.prefetch[0];
    let db = TestDb::connect_with_pool(backend.backend(), POOL).await;
    let topology = suite.broker.classic_queue();
    suite.broker.declare(&topology).await;
    let charges = create_charges(&db).await;
    let inbox = Inbox::builder(db.db.clone())
        .table(db.table("inbox"))
        .build()
        .await
        .expect("inbox");
    let binding = idem_batch_binding(
        topology.clone(),
        charge(&charges),
        suite.batch_size(prefetch),
        suite.max_wait(),
    );
    let mode = Mode::IdemBatch;
    suite.probe.take();
    let start = Instant::now();
    let consumer = Consumer::builder(suite.probe.url(), inbox)
        .connection_name("bench-soak")
        .prefetch(prefetch)
        .bind_with(binding)
        .start()
        .await
        .expect("start");
    let mut published = 0;
    let mut next_report = EVERY.min(n);
    let mut distinct = 0;
    while published < n || suite.probe.finished() < n {
        // Keeps at most two chunks ready in the queue.
        if published < n && published < suite.probe.finished() + 2 * CHUNK {
            let chunk = CHUNK.min(n - published);
            suite.publish(topology.queue(), chunk).await;
            published += chunk;
            distinct += chunk - chunk / 10;
        } else {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let finished = suite.probe.finished();
        if finished >= next_report {
            let elapsed = start.elapsed().as_secs_f64();
            if suite.args.json {
                println!(
                    "{}",
                    json!({
                        "bench": "suite-soak",
                        "backend": backend.name(),
                        "prefetch": prefetch,
                        "mode": mode.name(),
                        "settled": finished,
                        "elapsed_s": round3(elapsed),
                        "rss_mb": round1(rss_mb()),
                        "peak_rss_mb": round1(peak_rss_mb()),
                    })
                );
            } else {
                println!(
                    "{} prefetch {prefetch} {}: {finished:>8} settled in {elapsed:>6.1} s, RSS \
                     {:.1} MB (peak {:.1} MB)",
                    backend.name(),
                    mode.name(),
                    rss_mb(),
                    peak_rss_mb()
                );
            }
            next_report = (next_report + EVERY).min(n).max(finished + 1);
        }
    }
    // Settlements sent on a channel the broker closed were discarded: their messages come back.
    let waited = Instant::now();
    let mut quiet = 0;
    while quiet < 2 && waited.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let drained =
            suite.probe.outstanding() == 0 && suite.broker.depth(topology.queue()).await == 0;
        quiet = if drained { quiet + 1 } else { 0 };
    }
    let stats = consumer.stats();
    consumer.shutdown().await;
    let ready = suite.broker.depth(topology.queue()).await;
    let dead = suite.broker.depth(topology.dead_letter_queue()).await;
    let charged = db.count(&charges, "1=1").await as u64;
    let broker_errors = suite.probe.take().broker_errors;
    let outcome = format!(
        "{charged} charges for {distinct} distinct orders; {ready} messages left in the queue, \
         {dead} dead-lettered; {broker_errors} channels closed by the broker; consumer {stats:?}"
    );
    println!("soak: {outcome}");
    assert!(
        charged == distinct && ready == 0 && dead == 0,
        "soak FAILED: {outcome}"
    );
}

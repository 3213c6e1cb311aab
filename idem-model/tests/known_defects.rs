//! What idem does not guarantee, as the model finds it: each test asserts that the checker
//! finds the counterexample, and prints it. Run with `cargo test -p idem-model --test
//! known_defects -- --nocapture`.

use idem_model::properties::LATE_ALWAYS_COUNTED;
use idem_model::{IdemModel, Limits, check, scenarios};

/// `idem-runtime/src/telemetry`: a claim counts a late duplicate by its process's copy of the
/// digests of deleted keys, which the cleaner writes at the end of its run and every process
/// reads back after its cleaner task runs. A copy claimed between the deletion and the
/// claiming process's copy catching up is processed again uncounted.
#[test]
fn a_late_duplicate_goes_uncounted_before_the_digest_reaches_its_process() {
    let model = IdemModel::strict(scenarios::retention());
    let report = check(&model, Limits::default());
    println!("retention, strictly: {report}");
    let path = report
        .discovery(LATE_ALWAYS_COUNTED)
        .expect("an uncounted late copy");
    assert!(!report.holds(LATE_ALWAYS_COUNTED));
    println!("{LATE_ALWAYS_COUNTED} fails:\n{path}\n");
    let others = report_without(&report, LATE_ALWAYS_COUNTED);
    assert!(others.is_empty(), "other properties fail: {others:?}");
}

/// The properties of `report` that fail, but `expected`.
fn report_without(report: &idem_model::Report<IdemModel>, expected: &str) -> Vec<&'static str> {
    report
        .property_names()
        .filter(|name| *name != expected && !report.holds(name))
        .collect()
}

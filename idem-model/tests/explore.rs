use idem_model::{IdemModel, Limits, check, scenarios};

#[test]
fn explore() {
    let which = std::env::var("SCENARIO").unwrap_or_default();
    let config = match which.as_str() {
        "transactional" => scenarios::transactional(),
        "retention" => scenarios::retention(),
        "two_phase" => scenarios::two_phase(),
        "batch" => scenarios::batch(),
        "entity" => scenarios::entity(),
        "relays" => scenarios::relays(),
        "relays_holding_runs" => scenarios::relays_holding_runs(),
        _ => return,
    };
    let report = check(
        &IdemModel::strict(config),
        Limits {
            max_states: 3_000_000,
            stop_at: None,
        },
    );
    println!("{report}");
    for name in [
        "1. at most one committed effect per key while its record lives",
        "2. no delivery acknowledged before its effect committed, unless dead-lettered",
        "3. staged messages published in order within their run",
        "every message ends processed or dead-lettered (every run that ends)",
        "4'. every late duplicate is counted",
        "3. every staged message published (every run that ends)",
        "4. a late duplicate is counted (expired record, or its deletion in the process's digest)",
        "3. each staged message processed once downstream",
    ] {
        if let Some(path) = report.discovery(name) {
            if !report.holds(name) {
                println!("{name}:\n{path}");
            }
        }
    }
}

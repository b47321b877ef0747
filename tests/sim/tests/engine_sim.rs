//! The real engine under seeded faults (see `orca_sim::engine_sim`): needs
//! the PostgreSQL server with the `orca` extension installed
//! (`scripts/setup.sh`). `ENGINE_SEEDS=N` runs seeds 0..N (default 300);
//! `ENGINE_SEED=s` replays one seed and prints its trace.

use orca_sim::engine_sim::{self, ControlPlane};

#[test]
fn the_real_engine_lands_every_record_exactly_once_under_seeded_faults() {
    let cp = ControlPlane::new().expect("a control plane database");
    if let Some(seed) = std::env::var("ENGINE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        match engine_sim::run(&cp, seed) {
            Ok(o) => println!("seed {seed}: {o:?}"),
            Err(e) => panic!("{e}"),
        }
        return;
    }
    let seeds: u64 = std::env::var("ENGINE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let mut total = engine_sim::EngineOutcome::default();
    for seed in 0..seeds {
        match engine_sim::run(&cp, seed) {
            Ok(o) => {
                total.merges += o.merges;
                total.records += o.records;
                total.attempts += o.attempts;
                total.crashes += o.crashes;
                total.source_failures += o.source_failures;
                total.zombies_fenced += o.zombies_fenced;
                total.rewinds += o.rewinds;
            }
            Err(e) => panic!("{e}\nreplay: ENGINE_SEED={seed} cargo test -p orca-sim --test engine_sim -- --nocapture"),
        }
    }
    println!("{seeds} seeds: {total:?}");
    // The faults must actually happen for the run to mean anything.
    if seeds >= 30 {
        assert!(
            total.crashes > 0
                && total.merges > 0
                && total.source_failures > 0
                && total.zombies_fenced > 0
                && total.rewinds > 0,
            "{total:?}"
        );
    }
}

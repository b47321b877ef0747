//! The real engine under seeded faults (see `orca_sim::engine_sim`): needs
//! the PostgreSQL server with the `orca` extension installed
//! (`scripts/setup.sh`). `ENGINE_SEEDS=N` runs seeds 0..N (default 300);
//! `ENGINE_SEED=s` replays one seed and prints its trace.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use orca_sim::engine_sim::{self, ControlPlane, EngineOutcome};

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
    // Seeds are independent (a sync and a folder each), and a seed spends
    // most of its time waiting on the control plane's commits, so they run
    // side by side: the machine's cores, at least two.
    let lanes = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8));
    let next = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let mut results: Vec<(u64, Result<EngineOutcome, String>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..lanes)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    while !failed.load(Ordering::Relaxed) {
                        let seed = next.fetch_add(1, Ordering::Relaxed);
                        if seed >= seeds {
                            break;
                        }
                        let r = engine_sim::run(&cp, seed);
                        if r.is_err() {
                            failed.store(true, Ordering::Relaxed);
                        }
                        mine.push((seed, r));
                    }
                    mine
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a seed's thread panicked"))
            .collect()
    });
    results.sort_by_key(|(seed, _)| *seed);
    let mut total = EngineOutcome::default();
    for (seed, r) in results {
        match r {
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

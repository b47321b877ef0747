//! The commit protocol under seeded faults (a simulation with fake parts; see
//! the crate's documentation). `SEEDS=N` runs seeds 0..N (default 300);
//! `SEED=s` replays one seed and prints its trace.

#[test]
fn every_record_lands_exactly_once_under_seeded_faults() {
    if let Some(seed) = std::env::var("SEED").ok().and_then(|s| s.parse().ok()) {
        match orca_sim::run(seed) {
            Ok(o) => println!("seed {seed}: {o:?}"),
            Err(e) => panic!("{e}"),
        }
        return;
    }
    let seeds: u64 = std::env::var("SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let (mut attempts, mut zombies, mut rewinds) = (0, 0, 0);
    for seed in 0..seeds {
        match orca_sim::run(seed) {
            Ok(o) => {
                attempts += o.attempts;
                zombies += o.zombies_refused;
                rewinds += o.rewinds;
            }
            Err(e) => panic!("{e}\nreplay: SEED={seed} cargo test -p orca-sim"),
        }
    }
    println!("{seeds} seeds: {attempts} attempts, {zombies} zombies refused, {rewinds} rewinds");
    // The faults must actually happen for the run to mean anything.
    assert!(
        zombies > 0 && rewinds > 0 && attempts > seeds,
        "{attempts} {zombies} {rewinds}"
    );
}

/// A change stream's slot forgets what it confirmed: the protocol's
/// one-behind acknowledgement keeps every record; confirming at the barrier
/// (the faulty family) loses some, which proves the check can fail.
#[test]
fn a_slot_confirmed_one_behind_loses_nothing_and_one_confirmed_early_does() {
    let seeds: u64 = std::env::var("SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let cdc = orca_sim::Shape {
        cdc: true,
        early_ack: false,
    };
    for seed in 0..seeds {
        if let Err(e) = orca_sim::run_shaped(seed, cdc) {
            panic!("{e}");
        }
    }
    let early = orca_sim::Shape {
        cdc: true,
        early_ack: true,
    };
    let failed: Vec<String> = (0..seeds)
        .filter_map(|s| orca_sim::run_shaped(s, early).err())
        .collect();
    println!(
        "{seeds} seeds: confirmed early, {} lost records",
        failed.len()
    );
    assert!(
        !failed.is_empty(),
        "confirming before the commit lost nothing in {seeds} seeds: the check cannot fail"
    );
    assert!(failed.iter().all(|e| e.contains("lost")), "{}", failed[0]);
}

#!/usr/bin/env bash
# The chaos suite (tests/tests/chaos): seeded rounds of backfills (typed
# steps, tasks fanned out, commits to an Iceberg table), a continuous
# change stream (into Postgres and an Iceberg table) and batch syncs (a
# connector, dropped files, a table into Parquet) while runners, pipeline
# binaries, task workers, engines and connectors are SIGKILLed, PostgreSQL crashes,
# runners are cut off from the control plane, the S3 bucket fails (500s,
# slow answers, dropped connections) and a store's own disk fills; each
# round checked (every row once, outputs as undisturbed, nothing left
# behind, no retry spent by an infrastructure fault). Run as root, as CI
# is: a store's own disk is a tmpfs it mounts. Prints the seeds'
# trace and the figures; a failure prints its seed and how to replay it.
#
#   scripts/chaos.sh                          30 minutes of seeds (3 rounds each)
#   CHAOS_MINUTES=5 scripts/chaos.sh          a shorter budget
#   CHAOS_SEED=4242 scripts/chaos.sh          replay one seed (its trace is the same)
#   CHAOS_SEED=4242 CHAOS_SEEDS=10 CHAOS_ROUNDS=2 scripts/chaos.sh
#
# CI runs the same test with its default budget: seeds 1 and 2 (one store
# in the bucket, one on its own disk), two rounds each. The
# binaries it runs are the end-to-end tests' (tests/src/procs.rs builds them).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ORCA_ROOT"
if [ -z "${CHAOS_SEED:-}" ] && [ -z "${CHAOS_SEEDS:-}" ]; then
    export CHAOS_MINUTES="${CHAOS_MINUTES:-30}"
fi
export CHAOS_ROUNDS="${CHAOS_ROUNDS:-3}"
"$ORCA_ROOT/scripts/setup.sh" --tests >/dev/null 2>&1 || die "scripts/setup.sh --tests failed: run it to see why"
log="${CHAOS_LOG:-/var/tmp/orca-chaos.log}"
say "the whole output goes to $log"
started=$(date +%s)
set +e
cargo test -q -p orca-tests --test chaos -- --nocapture seeded_rounds 2>&1 |
    tee "$log" | grep --line-buffered -E '^chaos|^  [a-z]'
status=${PIPESTATUS[0]}
set -e
if [ "$status" != 0 ]; then
    sed -n '/panicked/,$p' "$log" | head -300
    die "chaos failed after $(($(date +%s) - started)) s (the replay line above names the seed)"
fi
say "chaos passed in $(($(date +%s) - started)) s"

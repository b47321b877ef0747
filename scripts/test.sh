#!/usr/bin/env bash
# The whole test suite: setup (idempotent), formatting, lints, unit tests,
# integration tests against the installed extension (a fresh database per
# test on the local cluster, plus private clusters for the background worker
# and the upgrade), the simulations, and the quick start itself.
# docs/design/layout.md names the tiers.
#
#   scripts/test.sh                 everything
#   scripts/test.sh --fast          the tiers that need no private cluster:
#                                   unit, SQL integration, end to end, simulation
#   ORCA_SKIP_QUICKSTART=1 scripts/test.sh   everything but the quick start
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ORCA_ROOT"
started=$(date +%s)
fast=0
for arg in "$@"; do
    case "$arg" in
        --fast) fast=1 ;;
        *) die "usage: scripts/test.sh [--fast]" ;;
    esac
done

"$ORCA_ROOT/scripts/setup.sh" --tests

say "cargo fmt --check"
cargo fmt --all -- --check

say "cargo clippy (all targets, warnings are errors)"
cargo clippy -q --workspace --all-targets -- -D warnings

if [ "$fast" = 1 ]; then
    # A test file that starts a private cluster says so by using PrivateCluster:
    # a file target is left out, a module of a folder target is skipped (its
    # other modules run).
    targets=()
    skips=()
    for f in tests/tests/*.rs tests/tests/*/main.rs; do
        [ -e "$f" ] || continue
        if [ "$(basename "$f")" = main.rs ]; then
            targets+=(--test "$(basename "$(dirname "$f")")")
            for m in $(grep -l PrivateCluster "$(dirname "$f")"/*.rs); do
                [ "$(basename "$m")" = main.rs ] && continue
                skips+=(--skip "$(basename "$m" .rs)::")
            done
        else
            grep -q PrivateCluster "$f" && continue
            targets+=(--test "$(basename "$f" .rs)")
        fi
    done
    say "unit tests and simulations"
    cargo test -q --workspace --exclude orca-ext --exclude orca-tests -- --test-threads 4
    say "SQL integration and end-to-end tests (no private clusters)"
    cargo test -q -p orca-tests --lib "${targets[@]}" -- --test-threads 4 "${skips[@]}"
    say "fast tiers passed in $(($(date +%s) - started)) s"
    exit 0
fi

say "building the tests"
cargo test -q --workspace --exclude orca-ext --no-run

# The chaos suite, the SDK's compile-fail cases and the quick start spend
# most of their time waiting (for a lease to lapse, a crashed cluster to
# come back, cargo to check the SDK's dependencies, a one-minute schedule to
# fire), so they run beside the other tests instead of after them: on two
# cores that took the suite from about 33 to about N minutes. Each has
# clusters, ports and directories of its own, as every test does.
beside_tests=(seeded_rounds_of_work_under_faults every_broken_edge_rule_fails_to_compile)
skips=()
for t in "${beside_tests[@]}"; do skips+=(--skip "$t"); done
beside_log="${ORCA_CI_BESIDE_LOG:-/var/tmp/orca-ci-beside.log}"
(
    set -e
    say "the SDK's compile-fail cases and the chaos suite (seeds 1 and 2)"
    cargo test -q --workspace --exclude orca-ext --test compile_fail --test chaos -- --test-threads 4 "${beside_tests[@]}"
    if [ "${ORCA_SKIP_QUICKSTART:-0}" != 1 ]; then
        say "the quick start (scripts/demo.sh)"
        # Ports below the kernel's ephemeral range (32768-60999 here): a port in it can
        # be held by one of the suite's many client connections, still open or in
        # TIME_WAIT, and the demo's listener then fails with "Address already in use".
        # The binaries are those the end-to-end tests built (the chaos suite builds them).
        ORCA_DEMO_STOP=1 ORCA_DEMO_BINARIES=e2e ORCA_PGDIR="/var/tmp/orca-ci-demo/pg" ORCA_PGPORT=24339 ORCA_SERVE_PORT=24340 \
            "$ORCA_ROOT/scripts/demo.sh" >/var/tmp/orca-ci-demo.log 2>&1 ||
            { tail -60 /var/tmp/orca-ci-demo.log; die "the quick start failed"; }
        grep -q "done. Explore" /var/tmp/orca-ci-demo.log || die "the quick start did not finish"
        say "the quick start finished"
    fi
) >"$beside_log" 2>&1 &
beside=$!

say "unit and integration tests (beside them, the compile-fail cases, the chaos suite and the quick start: $beside_log)"
tests_rc=0
cargo test -q --workspace --exclude orca-ext -- --test-threads 4 "${skips[@]}" || tests_rc=$?
say "unit and integration tests finished in $(($(date +%s) - started)) s; waiting for the lane beside them"
beside_rc=0
wait "$beside" || beside_rc=$?
if [ "$beside_rc" != 0 ]; then
    tail -120 "$beside_log"
    die "the compile-fail cases, the chaos suite or the quick start failed (all of it: $beside_log)"
fi
grep -F "==>" "$beside_log" || true
[ "$tests_rc" = 0 ] || die "unit and integration tests failed"
say "all tests passed in $(($(date +%s) - started)) s"

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

# Two lanes, then what must run alone. The SDK's compile-fail cases and the
# engine, tables, Spark and CDC tiers run beside the other tests instead of
# after them: most tests spend most of their time waiting (for cargo, a JVM,
# a process to start, a lease), and one lane alone kept the two cores a
# third busy. Each test has its own databases, clusters, ports and
# directories, so the lanes share nothing but the machine; a test file not
# named here runs in the first lane. Alone, after both: the chaos suite, whose
# checks hold an infrastructure fault to spending no retry (beside a lane of
# other tests one round did: an engine reported its connector's SIGKILL
# where a store outage or a crash of PostgreSQL was the cause); the packages
# test, which installs the Debian packages over the extension's files and
# puts them back (another test's CREATE EXTENSION could read them half
# written). The quick start ends the lane beside: it runs on the binaries
# that lane's tests built and skips its setup (which copies the extension's
# library over in place, under servers that have it loaded).
beside=(compile_fail engine tables spark cdc)
alone=(chaos packages)
mapfile -t others < <(cargo metadata -q --no-deps --format-version 1 | python3 -c '
import json, sys
named = set(sys.argv[1:])
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if "test" in t["kind"] and t["name"] not in named:
            print(t["name"])
' "${beside[@]}" "${alone[@]}" | sort -u)
[ "${#others[@]}" -gt 10 ] || die "cargo metadata named ${#others[@]} test targets besides ${beside[*]} ${alone[*]}"
beside_targets=()
for t in "${beside[@]}"; do beside_targets+=(--test "$t"); done
other_targets=()
for t in "${others[@]}"; do other_targets+=(--test "$t"); done
beside_log="${ORCA_CI_BESIDE_LOG:-/var/tmp/orca-ci-beside.log}"
(
    set -e
    say "beside: ${beside[*]}"
    cargo test -q --workspace --exclude orca-ext "${beside_targets[@]}" -- --test-threads 4
    if [ "${ORCA_SKIP_QUICKSTART:-0}" != 1 ]; then
        say "beside: the quick start (scripts/demo.sh)"
        # Ports below the kernel's ephemeral range (32768-60999 here): a port in it can
        # be held by one of the suite's many client connections, still open or in
        # TIME_WAIT, and the demo's listener then fails with "Address already in use".
        # The binaries are those the end-to-end tests built (this lane's tests
        # build them); the demo skips the setup this script ran.
        ORCA_DEMO_STOP=1 ORCA_DEMO_BINARIES=e2e ORCA_PGDIR="/var/tmp/orca-ci-demo/pg" ORCA_PGPORT=24339 ORCA_SERVE_PORT=24340 \
            "$ORCA_ROOT/scripts/demo.sh" >/var/tmp/orca-ci-demo.log 2>&1 ||
            { tail -60 /var/tmp/orca-ci-demo.log; die "the quick start failed"; }
        grep -q "done. Explore" /var/tmp/orca-ci-demo.log || die "the quick start did not finish"
    fi
    say "beside: passed at +$(($(date +%s) - started)) s"
) >"$beside_log" 2>&1 &
lane=$!

say "unit and integration tests (beside them: ${beside[*]} and the quick start, $beside_log)"
tests_rc=0
{
    cargo test -q --workspace --exclude orca-ext --lib --bins "${other_targets[@]}" -- --test-threads 4 &&
        cargo test -q --workspace --exclude orca-ext --doc -- --test-threads 4
} || tests_rc=$?
say "unit and integration tests finished at +$(($(date +%s) - started)) s"
lane_rc=0
wait "$lane" || lane_rc=$?
if [ "$lane_rc" != 0 ]; then
    tail -120 "$beside_log"
    die "the lane beside failed (${beside[*]} or the quick start; all of it: $beside_log)"
fi
grep -F "==>" "$beside_log" || true
[ "$tests_rc" = 0 ] || die "unit and integration tests failed"
for t in "${alone[@]}"; do
    say "$t (alone)"
    cargo test -q --workspace --exclude orca-ext --test "$t" -- --test-threads 4
done
say "all tests passed in $(($(date +%s) - started)) s"

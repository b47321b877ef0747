#!/usr/bin/env bash
# The whole test suite: setup (idempotent), formatting, lints, unit tests,
# integration tests against the installed extension (a fresh database per
# test on the local cluster, plus private clusters for the background worker),
# and the quick start itself.
#
#   scripts/test.sh                 everything
#   ORCA_SKIP_QUICKSTART=1 scripts/test.sh   everything but the quick start
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ORCA_ROOT"
started=$(date +%s)

"$ORCA_ROOT/scripts/setup.sh"

say "cargo fmt --check"
cargo fmt --all -- --check

say "cargo clippy (all targets, warnings are errors)"
cargo clippy -q --workspace --all-targets -- -D warnings

say "unit and integration tests"
cargo test -q --workspace --exclude orca-ext -- --test-threads 4

if [ "${ORCA_SKIP_QUICKSTART:-0}" != 1 ]; then
    say "the quick start (scripts/demo.sh)"
    ORCA_DEMO_STOP=1 ORCA_PGDIR="/var/tmp/orca-ci-demo/pg" ORCA_PGPORT=54339 \
        "$ORCA_ROOT/scripts/demo.sh" >/var/tmp/orca-ci-demo.log 2>&1 ||
        { tail -60 /var/tmp/orca-ci-demo.log; die "the quick start failed"; }
    grep -q "done. Explore" /var/tmp/orca-ci-demo.log || die "the quick start did not finish"
fi
say "all tests passed in $(($(date +%s) - started)) s"

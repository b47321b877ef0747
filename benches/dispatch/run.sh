#!/usr/bin/env bash
# The dispatch benchmark beside graphile-worker, in the same run, on the same
# PostgreSQL, with the same N and K, by the peer harness benches/peers/run.sh
# (which installs Node 22 and graphile-worker from npm into a cache outside
# the clone; see benches/peers/README.md). Prints each system's line and the
# ratios.
#
#   benches/dispatch/run.sh                 N=20000 K=16
#   N=50000 K="4 16" benches/dispatch/run.sh
#   PEERS_SCRIPT=/path/to/harness benches/dispatch/run.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/env.sh"
cd "$ORCA_ROOT"
PEERS="${PEERS_SCRIPT:-$ORCA_ROOT/benches/peers/run.sh}"
[ -x "$PEERS" ] || die "peer harness not found at $PEERS (set PEERS_SCRIPT)"
export N="${N:-20000}" K="${K:-16}"

"$ORCA_ROOT/scripts/setup.sh" >/dev/null
cargo build --release -q -p orca-bench-dispatch
BIN="$CARGO_TARGET_DIR/release/orca-bench-dispatch"

# orca-each: one orca.finish per attempt, as a runner does; orca-batch: one
# orca.finish_many per claimed batch, as graphile-worker batches completions;
# orca-local: graphile-worker's own shape (a 500-job local queue filled by one
# connection, completions of all K executors batched by another).
# A failed run prints a FAILED line; the others are still shown.
failed=0
each=$(SYSTEMS="graphile-worker" EXTRA_NAME=orca-each \
    EXTRA_CMD="ORCA_FINISH=each $BIN | sed 's/^RESULT orca /RESULT orca-each /'" "$PEERS") || failed=1
batch=$(SYSTEMS=" " EXTRA_NAME=orca-batch \
    EXTRA_CMD="ORCA_FINISH=batch $BIN | sed 's/^RESULT orca /RESULT orca-batch /'" "$PEERS") || failed=1
localq=$(SYSTEMS=" " EXTRA_NAME=orca-local \
    EXTRA_CMD="ORCA_FINISH=local $BIN | sed 's/^RESULT orca /RESULT orca-local /'" "$PEERS") || failed=1
printf '%s\n' "$each" "$(printf '%s\n' "$batch" "$localq" | grep -v '^#')"

# Ratios against graphile-worker, per K.
printf '%s\n' "$each" "$batch" "$localq" | python3 -c '
import re, sys
rows = {}
for line in sys.stdin:
    m = re.match(r"(\S+) burn-down N=(\d+) K=(\d+): ([\d.]+) jobs/s; enqueue ([\d.]+) jobs/s; add->start p50 ([\d.]+) ms p99 ([\d.]+) ms", line)
    if m:
        rows[(m.group(1), m.group(3))] = [float(x) for x in m.group(4, 5, 6, 7)]
for (name, k), (w, e, p50, p99) in sorted(rows.items()):
    g = rows.get(("graphile-worker", k))
    if name == "graphile-worker" or not g:
        continue
    print(f"ratio {name}/graphile-worker K={k}: burn-down {w / g[0]:.2f}x, enqueue {e / g[1]:.2f}x, "
          f"add->start p50 {p50 / g[2]:.2f}x p99 {p99 / g[3]:.2f}x (p99 {p99:.1f} ms, target < 10 ms)")
'
[ "$failed" = 0 ] || die "a run failed (see its FAILED line and the details above)"

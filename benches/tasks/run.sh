#!/usr/bin/env bash
# The tasks benchmark beside graphile-worker, in the same run, on the same
# PostgreSQL, with the same N and each K, by the peer harness
# benches/peers/run.sh (see benches/peers/README.md). Prints each system's
# line and the ratios.
#
#   benches/tasks/run.sh                     N=20000 K="1 4 16"
#   N=50000 K=16 benches/tasks/run.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/env.sh"
cd "$ORCA_ROOT"
PEERS="${PEERS_SCRIPT:-$ORCA_ROOT/benches/peers/run.sh}"
[ -x "$PEERS" ] || die "peer harness not found at $PEERS (set PEERS_SCRIPT)"
export N="${N:-20000}" K="${K:-1 4 16}"

"$ORCA_ROOT/scripts/setup.sh" >/dev/null
cargo build --release -q -p orca-bench-tasks
BIN="$CARGO_TARGET_DIR/release/orca-bench-tasks"

failed=0
out=$(SYSTEMS="graphile-worker" EXTRA_NAME=orca-tasks EXTRA_CMD="$BIN" "$PEERS") || failed=1
printf '%s\n' "$out"

# Ratios against graphile-worker, per K.
printf '%s\n' "$out" | python3 -c '
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
    print(f"ratio {name}/graphile-worker K={k}: burn-down {w / g[0]:.2f}x (goal >= 2x), "
          f"enqueue {e / g[1]:.2f}x, add->start p50 {p50 / g[2]:.2f}x p99 {p99 / g[3]:.2f}x "
          f"(p99 {p99:.1f} ms against {g[3]:.1f} ms: goal no worse)")
'
[ "$failed" = 0 ] || die "a run failed (see its FAILED line and the details above)"

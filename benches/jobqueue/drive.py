#!/usr/bin/env python3
"""Runs the scenarios of hardbyte/postgresql-job-queue-benchmarking natively.

That harness (bench.py) starts Postgres and the adapters with Docker, which
this machine has not. This driver keeps its method and changes only how
things are started: it launches adapters that speak the harness's JSONL
contract (CONTRIBUTING_ADAPTERS.md) as local processes, applies the same
phase types (the phase lists below restate the harness's phases.py), and
restarts Postgres with the commands it is given (pg_ctl) instead of
`docker compose stop/start`. Per phase it takes the median of each metric
(replicas summed per sample for rates and depth, the worst replica for
latency), as the harness's summary does; per cell it prints the ratios the
harness's 2026-05-09 sweep reports: recovery / baseline completion for the
chaos scenarios, stress / clean completion for the pressure ones.

  drive.py --system orca --cmd /path/to/adapter --db orca_bench \
      --admin-url postgres://postgres@127.0.0.1:15555/postgres \
      --pg-stop 'pg_ctl ... stop -m immediate' --pg-start 'pg_ctl ... start' \
      --scenarios chaos --replicas 2 --workers 32 --rate 600 --scale 0.5

`--scale` shortens every phase by that factor (the harness's durations at 1).
Each cell gets a fresh database (dropped WITH (FORCE), made again) and, with
--pg-restart-between, a restarted server (a background worker attached to
the old database lets go of it). Results are appended as JSON lines to
--out. Needs psycopg2.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import psycopg2

# The harness's scenarios (bench_harness/phases.py), phase by phase.
SCENARIOS = {
    "chaos_postgres_restart": [
        ("warmup", "warmup", {}, 30), ("baseline", "clean", {}, 60),
        ("restart", "postgres-restart", {}, 60), ("recovery", "clean", {}, 60)],
    "chaos_pg_backend_kill": [
        ("warmup", "warmup", {}, 30), ("baseline", "clean", {}, 60),
        ("kills", "pg-backend-kill", {"rate": 2}, 60), ("recovery", "clean", {}, 60)],
    "chaos_pool_exhaustion": [
        ("warmup", "warmup", {}, 30), ("baseline", "clean", {}, 60),
        ("exhaustion", "pool-exhaustion", {"idle_conns": 300}, 60),
        ("recovery", "clean", {}, 60)],
    "chaos_crash_recovery": [
        ("warmup", "warmup", {}, 30), ("baseline", "clean", {}, 60),
        ("kill", "kill-worker", {"instance": 0}, 60),
        ("restart", "start-worker", {"instance": 0}, 60), ("recovery", "clean", {}, 60)],
    "chaos_repeated_kills": [
        ("warmup", "warmup", {}, 30), ("baseline", "clean", {}, 60),
        ("repeated", "repeated-kill", {"instance": 0, "period": 20}, 120),
        ("recovery", "clean", {}, 60)],
    # The pressure cells of the sweep's Phase C (stress against clean).
    "idle_in_tx_saturation": [
        ("warmup", "warmup", {}, 600), ("clean_1", "clean", {}, 3600),
        ("idle_1", "idle-in-tx", {}, 3600), ("recovery_1", "recovery", {}, 1800)],
    "sustained_high_load": [
        ("warmup", "warmup", {}, 600), ("clean_1", "clean", {}, 1800),
        ("pressure_1", "high-load", {}, 7200), ("recovery_1", "clean", {}, 1800)],
    "active_readers": [
        ("warmup", "warmup", {}, 600), ("clean_1", "clean", {}, 1800),
        ("readers_1", "active-readers", {}, 3600), ("recovery_1", "clean", {}, 1800)],
    "event_delivery_burst": [
        ("warmup", "warmup", {}, 600), ("clean_1", "clean", {}, 900),
        ("pressure_1", "high-load", {}, 2700), ("recovery_1", "clean", {}, 1800)],
    # Peak throughput (the sweep's Phase A: depth-target producer).
    "peak": [("warmup", "warmup", {}, 30), ("clean", "clean", {}, 180)],
}
GROUPS = {
    "chaos": ["chaos_postgres_restart", "chaos_pg_backend_kill", "chaos_pool_exhaustion",
              "chaos_crash_recovery", "chaos_repeated_kills"],
    "pressure": ["idle_in_tx_saturation", "sustained_high_load", "active_readers",
                 "event_delivery_burst"],
}
# Which phase is compared with which, per cell (numerator, denominator).
RATIOS = {s: ("recovery", "baseline") for s in GROUPS["chaos"]}
RATIOS.update({
    "idle_in_tx_saturation": ("idle_1", "clean_1"),
    "sustained_high_load": ("pressure_1", "clean_1"),
    "active_readers": ("readers_1", "clean_1"),
    "event_delivery_burst": ("pressure_1", "clean_1"),
})


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Replica:
    index: int
    proc: subprocess.Popen | None = None
    starts: int = 0


@dataclass
class Cell:
    args: argparse.Namespace
    scenario: str
    db_url: str
    phase: str = "setup"
    # (replica, phase, t, metric, value)
    samples: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    replicas: list = field(default_factory=list)
    descriptors: list = field(default_factory=list)
    rate_file: str = ""
    # Each replica's offered rate: --rate is the whole system's.
    rate: int = 0
    exits: list = field(default_factory=list)


def db_url(admin_url: str, db: str) -> str:
    return urlunsplit(urlsplit(admin_url)._replace(path="/" + db))


def reader(cell: Cell, rep: Replica, stream) -> None:
    for line in stream:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("kind") == "descriptor":
            cell.descriptors.append(rec)
            continue
        if "metric" in rec:
            with cell.lock:
                cell.samples.append((rep.index, cell.phase, rec.get("t", ""), rec["metric"],
                                     float(rec.get("value") or 0)))


def start(cell: Cell, rep: Replica) -> None:
    a = cell.args
    env = dict(os.environ)
    env.update({
        "DATABASE_URL": cell.db_url, "SCENARIO": "long_horizon",
        "PRODUCER_MODE": "depth-target" if cell.scenario == "peak" else "fixed",
        "PRODUCER_RATE": str(cell.rate), "PRODUCER_RATE_CONTROL_FILE": cell.rate_file,
        "PRODUCER_PACING": "adapter", "PRODUCER_BATCH_MAX": str(a.batch_max),
        "PRODUCER_BATCH_MS": "25", "TARGET_DEPTH": str(a.target_depth),
        "WORKER_COUNT": str(a.workers), "JOB_PAYLOAD_BYTES": "256", "JOB_WORK_MS": "1",
        "SAMPLE_EVERY_S": str(a.sample_every), "BENCH_INSTANCE_ID": str(rep.index),
    })
    err = open(os.path.join(a.logs, f"{a.system}-{cell.scenario}-r{rep.index}.log"), "a")
    rep.proc = subprocess.Popen(shlex.split(a.cmd), env=env, stdout=subprocess.PIPE,
                                stderr=err, stdin=subprocess.DEVNULL, text=True, bufsize=1)
    rep.starts += 1
    threading.Thread(target=reader, args=(cell, rep, rep.proc.stdout), daemon=True).start()


def kill(rep: Replica) -> None:
    if rep.proc and rep.proc.poll() is None:
        rep.proc.send_signal(signal.SIGKILL)
        rep.proc.wait()


def connect(url: str, tries: int = 60):
    for i in range(tries):
        try:
            return psycopg2.connect(url)
        except psycopg2.OperationalError:
            if i == tries - 1:
                raise
            time.sleep(1)


def run_phase(cell: Cell, kind: str, params: dict, secs: float) -> None:
    a = cell.args
    stop = threading.Event()
    threads: list[threading.Thread] = []
    held: list = []

    def spawn(fn, *fa) -> None:
        t = threading.Thread(target=fn, args=fa, daemon=True)
        t.start()
        threads.append(t)

    if kind == "high-load":
        with open(cell.rate_file, "w") as f:
            f.write(str(int(cell.rate * a.high_load_multiplier)))
    elif kind == "idle-in-tx":
        c = connect(cell.db_url)
        c.cursor().execute("SELECT txid_current()")  # psycopg2 opened a transaction
        held.append(c)
    elif kind == "active-readers":
        table = a.hot_table

        def read_loop() -> None:
            c = connect(cell.db_url)
            c.set_session(isolation_level="REPEATABLE READ")
            cur = c.cursor()
            while not stop.is_set():
                try:
                    cur.execute(f"SELECT count(*) FROM {table}")
                    cur.fetchall()
                except psycopg2.Error:
                    c.rollback()
                time.sleep(0.1)
            c.close()
        for _ in range(4):
            spawn(read_loop)
    elif kind == "postgres-restart":
        log("stopping Postgres")
        subprocess.run(a.pg_stop, shell=True, check=True)

        def restart_later() -> None:
            if not stop.wait(secs / 2):
                log("starting Postgres")
                subprocess.run(a.pg_start, shell=True, check=True)
        spawn(restart_later)
    elif kind == "pg-backend-kill":
        period = 1.0 / float(params.get("rate", 2))
        db = cell.db_url.rsplit("/", 1)[1]

        def kill_loop() -> None:
            c = connect(a.admin_url)
            c.autocommit = True
            cur = c.cursor()
            kills = 0
            while not stop.wait(period):
                cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE datname = %s AND pid <> pg_backend_pid() "
                            "AND state IN ('active', 'idle in transaction')", (db,))
                kills += cur.rowcount or 0
            log(f"terminated {kills} backends")
        spawn(kill_loop)
    elif kind == "pool-exhaustion":
        n = int(params.get("idle_conns", 300))
        for _ in range(n):
            try:
                held.append(psycopg2.connect(cell.db_url))
            except psycopg2.Error as e:
                log(f"pool-exhaustion: {len(held)} connections opened, then: {e}")
                break
        log(f"holding {len(held)} idle connections")
    elif kind == "kill-worker":
        kill(cell.replicas[int(params.get("instance", 0))])
    elif kind == "start-worker":
        start(cell, cell.replicas[int(params.get("instance", 0))])
    elif kind == "repeated-kill":
        rep = cell.replicas[int(params.get("instance", 0))]
        period = float(params.get("period", 20)) * a.scale

        def repeat() -> None:
            while not stop.wait(period):
                kill(rep)
                if stop.wait(1.0):
                    return
                start(cell, rep)
        spawn(repeat)

    stop.wait(secs)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    for c in held:
        try:
            c.close()
        except psycopg2.Error:
            pass
    if kind == "high-load":
        with open(cell.rate_file, "w") as f:
            f.write(str(cell.rate))
    if kind == "repeated-kill":
        rep = cell.replicas[int(params.get("instance", 0))]
        if rep.proc is None or rep.proc.poll() is not None:
            start(cell, rep)


def fresh_database(a: argparse.Namespace, db: str) -> None:
    c = connect(a.admin_url)
    c.autocommit = True
    cur = c.cursor()
    cur.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    cur.execute(f'CREATE DATABASE "{db}"')
    c.close()
    if a.pg_restart_between:
        subprocess.run(a.pg_stop_fast, shell=True, check=True)
        subprocess.run(a.pg_start, shell=True, check=True)
    c = connect(db_url(a.admin_url, db))
    c.autocommit = True
    c.cursor().execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
    for ext in a.extension:
        c.cursor().execute(f"CREATE EXTENSION IF NOT EXISTS {ext}")
    c.close()


def summarise(cell: Cell) -> dict:
    """Per phase: the median over samples of each metric, replicas summed
    per sample time (rates, depth) or their worst (latency)."""
    by = {}
    with cell.lock:
        for rep, phase, t, metric, value in cell.samples:
            key = (phase, metric, t[:19])
            by.setdefault(key, []).append(value)
    phases: dict = {}
    for (phase, metric, _), vals in by.items():
        v = max(vals) if metric.startswith("claim_") else sum(vals)
        phases.setdefault(phase, {}).setdefault(metric, []).append(v)
    out = {}
    for phase, metrics in phases.items():
        out[phase] = {m: {"median": statistics.median(v), "peak": max(v), "n": len(v)}
                      for m, v in metrics.items()}
    return out


def run_cell(a: argparse.Namespace, scenario: str) -> dict:
    fresh_database(a, a.db)
    cell = Cell(args=a, scenario=scenario, db_url=db_url(a.admin_url, a.db))
    cell.rate_file = os.path.join(a.logs, f"{a.system}-rate.txt")
    replicas = 1 if scenario == "peak" else a.replicas
    cell.rate = max(1, a.rate // replicas)
    with open(cell.rate_file, "w") as f:
        f.write(str(cell.rate))
    cell.replicas = [Replica(i) for i in range(replicas)]
    for rep in cell.replicas:
        start(cell, rep)
    started = time.time()
    for label, kind, params, secs in SCENARIOS[scenario]:
        scale = a.pressure_scale if scenario in GROUPS["pressure"] else a.scale
        secs = max(secs * scale, a.sample_every * 2)
        cell.phase = label
        log(f"{a.system} {scenario}: {label} ({kind} {params or ''}) for {secs:.0f} s")
        run_phase(cell, kind, params, secs)
    cell.phase = "shutdown"
    # The harness's shutdown: SIGTERM, 5 s to exit, then SIGKILL (exit 137).
    for rep in cell.replicas:
        if rep.proc and rep.proc.poll() is None:
            rep.proc.send_signal(signal.SIGTERM)
    for rep in cell.replicas:
        if rep.proc is None:
            continue
        try:
            cell.exits.append(rep.proc.wait(timeout=a.shutdown_timeout))
        except subprocess.TimeoutExpired:
            rep.proc.kill()
            rep.proc.wait()
            cell.exits.append(137)
    time.sleep(0.5)
    check = None
    if a.check_sql:
        c = connect(cell.db_url)
        cur = c.cursor()
        cur.execute(a.check_sql)
        check = [list(map(str, r)) for r in cur.fetchall()]
        c.close()
    phases = summarise(cell)
    num, den = RATIOS.get(scenario, ("clean", "clean"))
    rate = lambda p: phases.get(p, {}).get("completion_rate", {}).get("median")  # noqa: E731
    ratio = (rate(num) / rate(den)) if rate(num) is not None and rate(den) else None
    return {"system": a.system, "scenario": scenario,
            "replicas": replicas, "workers": a.workers, "rate": a.rate,
            "scale": a.pressure_scale if scenario in GROUPS["pressure"] else a.scale,
            "seconds": round(time.time() - started), "exits": cell.exits,
            "restarts": [r.starts - 1 for r in cell.replicas],
            "ratio": ratio, "ratio_phases": [num, den], "phases": phases,
            "check": check, "descriptor": cell.descriptors[:1]}


def report(r: dict) -> str:
    p = r["phases"]
    num, den = r["ratio_phases"]

    def m(phase: str, metric: str) -> str:
        v = p.get(phase, {}).get(metric, {}).get("median")
        return "-" if v is None else f"{v:.1f}" if metric.startswith("claim") else f"{v:.0f}"
    ratio = "no samples" if r["ratio"] is None else f"{100 * r['ratio']:.0f}%"
    line = (f"{r['system']} {r['scenario']}: {num}/{den} completion {ratio} "
            f"({m(num, 'completion_rate')} / {m(den, 'completion_rate')} jobs/s; "
            f"enqueue {m(num, 'enqueue_rate')} / {m(den, 'enqueue_rate')}; "
            f"claim p99 {m(num, 'claim_p99_ms')} / {m(den, 'claim_p99_ms')} ms; "
            f"depth {m(num, 'queue_depth')}); exits {r['exits']}")
    if r["check"] is not None:
        line += f"; check {r['check']}"
    return line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--system", required=True)
    ap.add_argument("--cmd", required=True, help="the adapter's command line")
    ap.add_argument("--db", required=True)
    ap.add_argument("--admin-url", required=True)
    ap.add_argument("--extension", action="append", default=[])
    ap.add_argument("--hot-table", required=True, help="what active readers scan")
    ap.add_argument("--pg-stop", required=True, help="stops Postgres at once (the outage)")
    ap.add_argument("--pg-stop-fast", default=None, help="stops it between cells")
    ap.add_argument("--pg-start", required=True)
    ap.add_argument("--pg-restart-between", action="store_true")
    ap.add_argument("--scenarios", nargs="+", required=True)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--workers", type=int, default=32)
    ap.add_argument("--rate", type=int, default=600,
                    help="jobs/s offered by all replicas together (each gets its share)")
    ap.add_argument("--batch-max", type=int, default=128)
    ap.add_argument("--target-depth", type=int, default=4000)
    ap.add_argument("--high-load-multiplier", type=float, default=1.5)
    ap.add_argument("--sample-every", type=int, default=5)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--pressure-scale", type=float, default=None,
                    help="--scale for the pressure scenarios (theirs run for hours)")
    ap.add_argument("--shutdown-timeout", type=float, default=5.0)
    ap.add_argument("--check-sql", default=None, help="run after each cell, printed")
    ap.add_argument("--logs", default="/tmp")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    a.pg_stop_fast = a.pg_stop_fast or a.pg_stop
    a.pressure_scale = a.scale if a.pressure_scale is None else a.pressure_scale
    os.makedirs(a.logs, exist_ok=True)
    scenarios = [s for g in a.scenarios for s in GROUPS.get(g, [g])]
    for s in scenarios:
        if s not in SCENARIOS:
            ap.error(f"unknown scenario {s!r}; known: {', '.join(SCENARIOS)} or "
                     f"{', '.join(GROUPS)}")
    for s in scenarios:
        r = run_cell(a, s)
        print(report(r), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

// graphile-worker by the peer method (see README.md): bulk enqueue, burn-down,
// add->start latency. Run by run.sh with Node >= 22.18; the packages are
// loaded from PEERS_NODE_DIR (the cache's node_modules), not from the repo.
// Prints a `detail` line and a `RESULT graphile-worker ...` line.
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

const env = (k, d) => (process.env[k] ? process.env[k] : d);
const int = (k, d) => {
  const v = Number(env(k, String(d)));
  if (!Number.isFinite(v)) throw new Error(`${k}=${process.env[k]} is not a number`);
  return v;
};
const URL_ = env('BENCH_DB_URL', '');
if (!URL_) throw new Error('BENCH_DB_URL (a fresh database) is required');
const NODE_DIR = env('PEERS_NODE_DIR', '');
if (!NODE_DIR) throw new Error('PEERS_NODE_DIR (where graphile-worker and pg are installed) is required');
const req = createRequire(`${NODE_DIR}/package.json`);
const pg = req('pg');
const { run, makeWorkerUtils, Logger } = await import(pathToFileURL(req.resolve('graphile-worker')).href);

const N = int('N', 20000), K = Math.max(1, int('K', 16));
const CHUNK = Math.max(1, int('ENQ_CHUNK', 10000));
const ANALYZE = env('ANALYZE_BEFORE_WORK', '1') === '1';
const LAT_SAMPLES = int('LAT_SAMPLES', 500), LAT_WARMUP = int('LAT_WARMUP', 50);
const LAT_GAP_MS = int('LAT_GAP_MS', 10);
const PHASE_MS = 1000 * int('PHASE_TIMEOUT_S', 120);
// The high-throughput settings of graphile-worker's perfTest/graphile.config.js
// and docs/performance.md; -1 turns a knob off.
const QUEUE = int('GW_LOCAL_QUEUE_SIZE', 500);
const REFETCH_MS = int('GW_REFETCH_DELAY_MS', 10);
const BATCH_DELAY = int('GW_COMPLETE_BATCH_DELAY', 0);
const POOL = int('GW_MAX_POOL', Math.max(10, K + 2));

const now = () => performance.now();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const deferred = () => { let resolve; const promise = new Promise((r) => { resolve = r; }); return { promise, resolve }; };
async function within(ms, what, p) {
  let t;
  const limit = new Promise((_, rej) => { t = setTimeout(() => rej(new Error(`timeout: ${what} took over ${ms} ms`)), ms); });
  try { return await Promise.race([p, limit]); } finally { clearTimeout(t); }
}
const pct = (s, p) => s[Math.min(s.length - 1, Math.max(0, Math.ceil((p * s.length) / 100) - 1))]; // nearest rank
const f1 = (x) => x.toFixed(1);

const worker = { connectionString: URL_, concurrentJobs: K, maxPoolSize: POOL,
  completeJobBatchDelay: BATCH_DELAY, failJobBatchDelay: BATCH_DELAY };
if (QUEUE > 0) worker.localQueue = { size: QUEUE, ...(REFETCH_MS >= 0 ? { refetchDelay: { durationMs: REFETCH_MS } } : {}) };
const logger = new Logger(() => (level, message) => {
  if (level === 'error' || level === 'warning') console.error(`[graphile-worker ${level}] ${message}`);
});

const pool = new pg.Pool({ connectionString: URL_, max: 2 });
pool.on('error', (e) => console.error(`[pool] ${e.message}`));
pool.on('connect', (c) => c.on('error', (e) => console.error(`[pool client] ${e.message}`)));
const unfinished = async () => Number((await pool.query('SELECT count(*) c FROM graphile_worker._private_jobs')).rows[0].c);
const utils = await makeWorkerUtils({ pgPool: pool, logger });
await utils.migrate();

// 1. Bulk enqueue with WorkerUtils.addJobs (SQL graphile_worker.add_jobs), timed.
const specs = Array.from({ length: N }, (_, i) => ({ identifier: 'noop', payload: { i } }));
const te0 = now();
await within(PHASE_MS, 'enqueue', (async () => {
  for (let o = 0; o < N; o += CHUNK) await utils.addJobs(specs.slice(o, o + CHUNK));
})());
const tEnq = now() - te0;
if ((await unfinished()) !== N) throw new Error(`expected ${N} queued jobs, found ${await unfinished()}`);
if (ANALYZE) await pool.query('ANALYZE');

// 2. Burn-down: one run() with concurrency K; the same runner then serves the latency phase.
let done = 0, tFirst = 0, latT0 = 0, latWait = null;
const allDone = deferred();
const lat = [];
const taskList = {
  noop: async () => { if (!tFirst) tFirst = now(); if (++done === N) allDone.resolve(); },
  latency: async (p) => { const ms = now() - latT0; if (p.i >= 0) lat.push(ms); latWait.resolve(); },
};
const tw0 = now();
const cpu0 = process.cpuUsage();
const runner = await run({ preset: { worker }, taskList, logger, noHandleSignals: true });
await within(PHASE_MS, `burn-down (${N} handlers)`, allDone.promise);
const tHandlers = now();
const tDrained = await within(PHASE_MS, 'drain (queue empty)', (async () => {
  while ((await unfinished()) > 0) await sleep(5);
  return now();
})());
const cpu = process.cpuUsage(cpu0);

// 3. add->start latency: the worker is idle and listening; one addJob at a time.
await sleep(500);
for (let i = -LAT_WARMUP; i < LAT_SAMPLES; i++) {
  await sleep(LAT_GAP_MS);
  latWait = deferred();
  latT0 = now();
  await utils.addJob('latency', { i });
  await within(10000, `latency job ${i}`, latWait.promise);
}
await within(10000, 'runner stop', runner.stop());
await utils.release();
await pool.end();

lat.sort((a, b) => a - b);
const rate = (ms) => Math.round(N / (ms / 1000));
console.log(`detail graphile-worker: concurrentJobs=${K} maxPoolSize=${POOL} ` +
  `localQueue=${QUEUE > 0 ? QUEUE : 'off'} refetchDelay=${QUEUE > 0 && REFETCH_MS >= 0 ? `${REFETCH_MS}ms` : 'off'} ` +
  `completeJobBatchDelay=failJobBatchDelay=${BATCH_DELAY}; enqueue (addJobs, chunks of ${CHUNK}) ${f1(tEnq)} ms; ` +
  `start->first job ${f1(tFirst - tw0)} ms, first job->last handler ${f1(tHandlers - tFirst)} ms, ` +
  `last handler->drained ${f1(tDrained - tHandlers)} ms; analyze=${ANALYZE}; incl. startup ${rate(tDrained - tw0)} jobs/s; ` +
  `worker CPU ${Math.round((cpu.user + cpu.system) / 10 / (tDrained - tw0))}% of a core; ` +
  `latency gap=${LAT_GAP_MS}ms n=${lat.length} min ${f1(lat[0])} max ${f1(lat[lat.length - 1])} ms`);
console.log(`RESULT graphile-worker burn-down N=${N} K=${K}: ${rate(tDrained - tFirst)} jobs/s; ` +
  `enqueue ${rate(tEnq)} jobs/s; add->start p50 ${f1(pct(lat, 50))} ms p99 ${f1(pct(lat, 99))} ms`);
process.exit(0);

// The Orca console: pages over the HTTP API (/api/v1), in the caller's
// session (a cookie made from an API key). No framework and no build step:
// the server embeds this file as it is.
"use strict";

const main = document.getElementById("main");
let stopPage = () => {};

// --- helpers -------------------------------------------------------------------

// An element; children are nodes or text (text is never parsed as HTML).
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function cookie(name) {
  const m = document.cookie.split(";").map((c) => c.trim().split("="))
    .find(([k]) => k === name);
  return m ? m.slice(1).join("=") : "";
}

class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code;
    this.hint = e.hint;
  }
}

async function api(method, path, body) {
  const headers = { "Accept": "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET") headers["X-CSRF-Token"] = cookie("orca_csrf");
  const r = await fetch("/api/v1" + path, {
    method, headers, credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  const json = text ? JSON.parse(text) : null;
  if (!r.ok) throw new ApiError(r.status, json);
  return json;
}

const get = (path) => api("GET", path);

function status(s) {
  return h("span", { class: `st st-${s}` }, s || "-");
}

function when(t) {
  if (!t) return "-";
  const d = new Date(t);
  return d.toISOString().replace("T", " ").slice(0, 19);
}

// The size an attempt got (its version's resources, grown after a kill for
// memory), and the kill itself.
function size(a) {
  const parts = [];
  if (a.memory_bytes != null) parts.push(bytes(a.memory_bytes));
  if (a.cpu_millis != null) parts.push(`${a.cpu_millis}m CPU`);
  if (a.killed_for) parts.push(`killed for ${a.killed_for}`);
  return parts.join(", ") || "-";
}

function bytes(b) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
  return `${Number.isInteger(b) ? b : b.toFixed(1)} ${units[i]}`;
}

function took(a, b) {
  if (!a || !b) return "-";
  return ((new Date(b) - new Date(a)) / 1000).toFixed(1) + "s";
}

function table(columns, rows, opts) {
  const o = opts || {};
  return h("table", { "aria-label": o.label },
    h("thead", {}, h("tr", {}, columns.map((c) =>
      h("th", { scope: "col", class: c.startsWith("#") ? "num" : null }, c.replace(/^#/, ""))))),
    h("tbody", {}, rows.length === 0
      ? h("tr", {}, h("td", { colspan: columns.length, class: "muted" }, o.empty || "none"))
      : rows.map((r) => h("tr", {}, r.map((cell, i) =>
        h("td", { class: columns[i].startsWith("#") ? "num" : null }, cell))))));
}

function page(title, ...children) {
  main.replaceChildren(h("h1", {}, title), ...children);
  document.title = `${title} · Orca`;
}

function showError(e, stay) {
  if (!stay && e instanceof ApiError && e.status === 401) {
    location.hash = "#/login";
    return;
  }
  main.append(h("p", { class: "error", role: "alert" },
    e.code ? `${e.message} (${e.code})` : String(e.message || e),
    e.hint ? h("span", { class: "muted" }, ` — ${e.hint}`) : null));
}

// Polls fn every ms until the page changes.
function every(ms, fn) {
  let live = true;
  const loop = async () => {
    while (live) {
      await new Promise((r) => setTimeout(r, ms));
      if (!live) break;
      try { await fn(); } catch (e) { live = false; showError(e); }
    }
  };
  loop();
  return () => { live = false; };
}

// --- pages -----------------------------------------------------------------------

async function login() {
  document.getElementById("logout").hidden = true;
  document.getElementById("who").textContent = "";
  const input = h("input", { type: "password", id: "key", name: "key", autocomplete: "off",
    placeholder: "orca_ak_...", "aria-label": "API key", required: true });
  const form = h("form", { class: "inline", onsubmit: async (ev) => {
    ev.preventDefault();
    try {
      await api("POST", "/session", { key: input.value });
      location.hash = "#/pipelines";
    } catch (e) { showError(e, true); }
  } }, h("label", { for: "key" }, "API key"), input, h("button", { type: "submit" }, "Log in"));
  page("Log in", h("p", { class: "muted" },
    "An API key of your org (orca api-keys create NAME --role viewer|operator|admin)."), form);
  input.focus();
}

async function pipelines() {
  const [list, sensors] = await Promise.all([get("/pipelines"), get("/sensors")]);
  const sensorOf = new Map(sensors.map((x) => [x.pipeline, x]));
  const rows = await Promise.all(list.map(async (p) => {
    const [detail, runs] = await Promise.all([
      get(`/pipelines/${encodeURIComponent(p.pipeline)}`),
      get(`/runs?pipeline=${encodeURIComponent(p.pipeline)}&limit=12`),
    ]);
    const marks = h("span", { class: "marks", "aria-label": "last runs, newest first" },
      runs.items.map((r) => h("a", { class: `mark st-${r.status}`, href: `#/runs/${r.run}`,
        title: `run ${r.run}: ${r.status} (${r.partitions.join(",")})` }, r.status[0].toUpperCase())));
    const next = detail.next_fires.slice(0, 2).map((f) => `${when(f.fire_at)} → ${f.partition}`);
    return [
      h("a", { href: `#/pipelines/${encodeURIComponent(p.pipeline)}` }, p.pipeline),
      p.cron ? `${p.cron} (${p.tz || "UTC"})` : p.partition_kind,
      next.length ? next.join("; ") : "-",
      marks,
      p.paused ? status("paused") : "active",
      sensorOf.has(p.pipeline)
        ? `polled ${when(sensorOf.get(p.pipeline).last_sense_at)}; ${sensorOf.get(p.pipeline).runs_started} run(s) started`
        : "-",
      String(p.queued), String(p.running),
    ];
  }));
  page("Pipelines", table(["pipeline", "schedule", "next fires", "last runs", "state", "sensor",
    "#queued", "#running"], rows, { label: "pipelines", empty: "No pipelines yet (orca register BINARY)." }));
}

// A version's code link: <repo>/tree/<commit> when the source is a URL.
function treeLink(v) {
  if (!v.source || !v.commit || !/^https?:\/\//.test(v.source)) return v.commit || "-";
  const base = v.source.replace(/\.git$/, "").replace(/\/$/, "");
  return h("a", { href: `${base}/tree/${v.commit}`, class: "code-link" },
    v.commit.slice(0, 12) + (v.dirty ? " (dirty)" : ""));
}

// Each step (or task: what = "tasks") linked to its line at the version's
// commit (from orca locate).
function stepLinks(v, what) {
  const steps = (v.locations && v.locations[what || "steps"]) || {};
  const names = Object.keys(steps).sort();
  if (names.length === 0) return "-";
  const repo = v.source && v.commit && /^https?:\/\//.test(v.source)
    ? v.source.replace(/\.git$/, "").replace(/\/$/, "") : null;
  return h("span", {}, names.map((n, i) => {
    const at = steps[n];
    const label = `${n} (${at.file}:${at.line})`;
    const el = repo
      ? h("a", { class: "step-link", href: `${repo}/blob/${v.commit}/${at.file}#L${at.line}` }, label)
      : label;
    return i ? [", ", el] : [el];
  }));
}

async function pipeline(name) {
  const p = await get(`/pipelines/${encodeURIComponent(name)}`);
  const runs = await get(`/runs?pipeline=${encodeURIComponent(name)}&limit=100`);
  const queued = h("div", { id: "queued", "aria-live": "polite" });
  const input = h("input", { type: "text", id: "partitions", name: "partitions",
    placeholder: "2024-01..2024-06, 2024-01,2024-03 or @all", "aria-label": "Backfill partitions" });
  // Partitions a run: empty is the pipeline's own backfill policy.
  const perRun = h("input", { type: "number", id: "per-run", name: "per_run", min: "1",
    placeholder: String(p.backfill_per_run || 1),
    title: "partitions a run (each run is one attempt)", "aria-label": "Partitions per run" });
  let watch = () => {};
  const form = h("form", { class: "inline", id: "backfill", onsubmit: async (ev) => {
    ev.preventDefault();
    try {
      const body = { partitions: input.value };
      if (perRun.value) body.per_run = Number(perRun.value);
      const r = await api("POST", `/pipelines/${encodeURIComponent(name)}/backfill`, body);
      watch();
      const draw = async () => {
        const states = await Promise.all(r.runs.map((id) => get(`/runs/${id}`)));
        const done = states.filter((s) => ["succeeded", "failed", "cancelled"].includes(s.status));
        queued.replaceChildren(
          h("p", {}, `${r.runs.length} run(s) queued; ${done.length} finished.`),
          table(["#run", "partitions", "status", "steps"], states.map((s) => [
            h("a", { href: `#/runs/${s.run}` }, String(s.run)), s.partitions.join(","),
            status(s.status), `${s.steps_succeeded}/${s.steps_total}`]), { label: "queued runs" }));
        const latest = await get(`/runs?pipeline=${encodeURIComponent(name)}&limit=100`);
        drawTimeline(latest.items);
        if (done.length === states.length) watch();
      };
      await draw();
      watch = every(1000, draw);
    } catch (e) { showError(e); }
  } }, h("label", { for: "partitions" }, "Backfill"), input,
    h("label", { for: "per-run" }, "per run"), perRun,
    h("button", { type: "submit" }, "Queue runs"));
  // Partition × run status: the latest run of each partition, and how many.
  const timeline = h("div", { id: "timeline" });
  const drawTimeline = (items) => {
    const byPart = new Map();
    for (const r of items) {
      for (const part of r.partitions) {
        const e = byPart.get(part) || { latest: r, n: 0 };
        e.n += 1;
        byPart.set(part, e);
      }
    }
    const parts = [...byPart.keys()].sort();
    timeline.replaceChildren(table(["partition", "latest run", "status", "#runs"], parts.map((part) => {
      const e = byPart.get(part);
      return [part, h("a", { href: `#/runs/${e.latest.run}` }, String(e.latest.run)),
        status(e.latest.status), String(e.n)];
    }), { label: "partitions by latest run", empty: "No runs yet." }));
  };
  drawTimeline(runs.items);
  const versions = table(["#version", "registry hash", "source", "commit", "steps", "image",
    "registered", "runs"], p.versions.map((v) => [String(v.version), v.registry_hash.slice(0, 16),
    v.source || "-", treeLink(v),
    h("span", {}, stepLinks(v), v.locations && v.locations.tasks ? [" · tasks: ", stepLinks(v, "tasks")] : []),
    v.image || "-", when(v.registered_at),
    h("span", {}, Object.entries(v.runs).map(([st, n]) => [status(st), ` ${n} `]),
      v.last_run ? h("a", { href: `#/runs/${v.last_run}` }, `last: ${v.last_run}`) : "none")]),
  { label: "versions" });
  page(`Pipeline ${name}`,
    h("p", {}, p.cron ? `Schedule ${p.cron} in ${p.tz || "UTC"}` : `Partitions: ${p.partition_kind}`,
      " · ", p.paused ? status("paused") : "active"),
    form, queued,
    h("h2", {}, "Next fires"),
    table(["fire at", "fills"], p.next_fires.map((f) => [when(f.fire_at), f.partition]),
      { label: "next fires", empty: "Not scheduled." }),
    h("h2", {}, "Partitions"), timeline,
    h("h2", {}, "Versions"), versions);
  stopPage = () => watch();
}

async function runsPage() {
  const runs = await get("/runs?limit=100");
  page("Runs", table(["#run", "pipeline", "partitions", "trigger", "status", "queued", "took"],
    runs.items.map((r) => [h("a", { href: `#/runs/${r.run}` }, String(r.run)),
      h("a", { href: `#/pipelines/${encodeURIComponent(r.pipeline)}` }, r.pipeline),
      r.partitions.join(","), r.trigger, status(r.status), when(r.created_at),
      took(r.started_at, r.finished_at)]), { label: "runs", empty: "No runs yet." }));
}

async function run(id) {
  let r = await get(`/runs/${id}`);
  const grid = h("div", { id: "grid" });
  const attempts = h("div", { id: "attempts" });
  const tasks = h("div", { id: "tasks" });
  const events = h("div", { id: "events" });
  const snapshots = h("div", { id: "snapshots" });
  const why = h("div", { id: "why" });
  const timeline = h("div", { id: "run-timeline" });
  const head = h("p", { id: "run-head", "aria-live": "polite" });
  const log = h("pre", { class: "log", id: "log", tabindex: "0", "aria-label": "log" });
  const buttons = h("p", {},
    h("button", { type: "button", class: "danger", id: "cancel", onclick: async () => {
      try { await api("POST", `/runs/${id}/cancel`); await draw(); } catch (e) { showError(e); }
    } }, "Cancel run"), " ",
    h("button", { type: "button", id: "retry", onclick: async () => {
      try {
        const x = await api("POST", `/runs/${id}/retry`);
        location.hash = `#/runs/${x.run}`;
      } catch (e) { showError(e); }
    } }, "Retry run"));
  const draw = async () => {
    r = await get(`/runs/${id}`);
    head.replaceChildren(status(r.status), ` ${r.trigger} run of `,
      h("a", { href: `#/pipelines/${encodeURIComponent(r.pipeline)}` }, r.pipeline),
      ` (version ${r.version}) over ${r.partitions.join(",")}; queued ${when(r.created_at)}, `,
      `took ${took(r.started_at, r.finished_at)}`,
      ...(r.error ? [" ", h("span", { class: "error" }, r.error)] : []));
    document.getElementById("cancel").disabled = ["succeeded", "failed", "cancelled"].includes(r.status);
    document.getElementById("retry").disabled = !["failed", "cancelled"].includes(r.status);
    // Why it is where it is (orca.explain): what holds it, since and until when.
    why.replaceChildren(table(["code", "why", "since", "until"],
      r.why.map((w) => [h("code", {}, w.code), w.message, when(w.since), when(w.until)]),
    { label: "why", empty: "Nothing to explain." }));
    timeline.replaceChildren(timelineSvg(r));
    const steps = [...new Set(r.steps.map((s) => s.step))];
    const parts = [...new Set(r.steps.map((s) => s.partition))].sort();
    // How long each (step, partition) took, from its last step.running
    // event to the step.succeeded or step.failed after it.
    const spans = new Map();
    for (const e of r.events) {
      const k = `${e.data.step}|${e.data.partition}`;
      if (e.kind === "step.running") spans.set(k, { from: e.at, to: null });
      else if ((e.kind === "step.succeeded" || e.kind === "step.failed") && spans.has(k)) {
        spans.get(k).to = e.at;
      }
    }
    const cell = (step, part) => {
      const s = r.steps.find((x) => x.step === step && x.partition === part);
      if (!s) return "";
      const span = spans.get(`${step}|${part}`);
      const dur = span && span.to ? took(span.from, span.to) : null;
      return h("span", { title: `${step} ${part}: ${s.status}, ${s.attempts} attempt(s)` },
        status(s.status), s.attempts > 1 ? ` ×${s.attempts}` : "",
        dur ? h("span", { class: "muted" }, ` ${dur}`) : "");
    };
    grid.replaceChildren(h("table", { class: "grid", "aria-label": "steps by partition" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "step"),
        parts.map((p) => h("th", { scope: "col" }, p)))),
      h("tbody", {}, steps.map((st) => h("tr", {}, h("td", { class: "step" }, st),
        parts.map((p) => h("td", {}, cell(st, p))))))));
    const ms = (v) => (v === null ? "-" : `${v} ms`);
    tasks.replaceChildren(table(["step", "partition", "task", "#tasks", "succeeded", "failed",
      "running", "queued", "cancelled", "retries", "p50", "p95", "p99", "max"],
    r.tasks.map((t) => [t.step, t.partition, t.task, String(t.tasks), String(t.succeeded),
      String(t.failed), String(t.running), String(t.queued), String(t.cancelled),
      String(t.retries), ms(t.p50_millis), ms(t.p95_millis), ms(t.p99_millis), ms(t.max_millis)]),
    { label: "tasks", empty: "No tasks: its steps fanned out none." }),
    ...(r.task_failures.length ? [table(["step", "partition", "task", "#index", "tries", "runner",
      "error"], r.task_failures.map((f) => [f.step, f.partition, f.task, String(f.index),
      String(f.tries), f.runner || "-", h("span", { class: "error lines" }, f.error || "")]),
    { label: "failed tasks" })] : []));
    attempts.replaceChildren(table(["#attempt", "status", "runner", "pool", "size", "leased", "took", "error"],
      r.attempt_list.map((a) => [String(a.number), status(a.status), a.runner || "-", a.pool,
        size(a), when(a.leased_at), took(a.leased_at, a.finished_at), a.error || ""]), { label: "attempts" }));
    snapshots.replaceChildren(table(["role", "dataset", "#snapshot", "step", "partition", "at"],
      r.snapshots.map((x) => [x.role.replace("_", " "),
        h("a", { href: `#/datasets/${encodeURIComponent(x.dataset)}` }, x.dataset),
        x.snapshot === null ? "-" : String(x.snapshot), x.step || "-", x.partition || "-", when(x.at)]),
    { label: "snapshots", empty: "No snapshots read, committed or sensed." }));
    events.replaceChildren(table(["#id", "at", "kind", "data"], r.events.map((e) =>
      [String(e.id), when(e.at), e.kind, JSON.stringify(e.data)]), { label: "events" }));
  };
  page(`Run ${id}`, head, buttons, h("h2", {}, "Why"), why, h("h2", {}, "Timeline"), timeline,
    h("h2", {}, "Steps × partitions"), grid,
    h("h2", {}, "Tasks"), tasks, h("h2", {}, "Attempts"), attempts, h("h2", {}, "Log"), log,
    h("h2", {}, "Snapshots read, committed and sensed"), snapshots, h("h2", {}, "Events"), events);
  await draw();
  // The log, followed while the attempt runs (server-sent events).
  const source = new EventSource(`/api/v1/runs/${id}/log/stream`);
  source.addEventListener("line", (ev) => {
    const l = JSON.parse(ev.data);
    log.append(l.line + "\n");
    log.scrollTop = log.scrollHeight;
  });
  source.addEventListener("end", () => source.close());
  source.addEventListener("error", () => source.close());
  const stop = every(1500, draw);
  stopPage = () => { stop(); source.close(); };
}

const SVG_NS = "http://www.w3.org/2000/svg";
function svgEl(tag, attrs, ...kids) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  for (const k of kids) el.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return el;
}

// A run in time: its wait in the queue, each attempt, and each step and
// partition's tries (every step.running to its end, so retries show) as
// bars on one time axis; what still runs reaches to now.
function timelineSvg(r) {
  const t = (x) => (x ? new Date(x).getTime() : null);
  const now = Date.now();
  const rows = [];
  const t0 = t(r.created_at);
  const leases = r.attempt_list.map((a) => t(a.leased_at)).filter((x) => x !== null);
  if (leases.length) {
    const first = Math.min(...leases);
    rows.push({ label: "queued", bars: [{ from: t0, to: first, cls: "queued",
      title: `queued ${took(r.created_at, new Date(first).toISOString())} before its first lease` }] });
  }
  for (const a of r.attempt_list) {
    if (!a.leased_at) continue;
    rows.push({ label: `attempt ${a.number}`, bars: [{ from: t(a.leased_at), to: t(a.finished_at) ?? now,
      cls: a.status, title: `attempt ${a.number} on ${a.runner || "?"}: ${a.status}${a.error ? ": " + a.error : ""}` }] });
  }
  const tries = new Map();
  for (const e of r.events) {
    if (!e.kind.startsWith("step.") || e.data.step === undefined) continue;
    const k = `${e.data.step} ${e.data.partition}`;
    if (!tries.has(k)) tries.set(k, []);
    const list = tries.get(k);
    const open = list.length && list[list.length - 1].to === null ? list[list.length - 1] : null;
    if (e.kind === "step.running") {
      if (open) { open.to = t(e.at); open.cls = "lost"; }
      list.push({ from: t(e.at), to: null, cls: "running" });
    } else if (open && ["step.succeeded", "step.failed", "step.skipped"].includes(e.kind)) {
      open.to = t(e.at);
      open.cls = e.kind.slice(5);
    }
  }
  for (const [k, list] of [...tries].sort((a, b) => a[1][0].from - b[1][0].from)) {
    rows.push({ label: k, bars: list.map((b, i) => ({ from: b.from, to: b.to ?? (r.finished_at ? t(r.finished_at) : now),
      cls: b.cls, title: `${k}, try ${i + 1}: ${b.cls}` })) });
  }
  const end = Math.max(t0 + 1, ...rows.flatMap((x) => x.bars.map((b) => b.to)));
  const LABEL = 180, W = 760, ROW = 20, TOP = 22;
  const x = (v) => LABEL + ((v - t0) / (end - t0)) * (W - LABEL - 10);
  const svg = svgEl("svg", { class: "run-timeline", width: W, height: TOP + rows.length * ROW + 6, role: "img",
    "aria-label": `timeline of run ${r.run}: ${rows.length} rows over ${took(r.created_at, new Date(end).toISOString())}` });
  for (const f of [0, 0.25, 0.5, 0.75, 1]) {
    const v = t0 + f * (end - t0);
    svg.append(svgEl("line", { class: "tick", x1: x(v), x2: x(v), y1: TOP - 4, y2: TOP + rows.length * ROW }),
      svgEl("text", { class: "axis", x: x(v), y: 12, "text-anchor": f === 0 ? "start" : f === 1 ? "end" : "middle" },
        `+${took(r.created_at, new Date(v).toISOString())}`));
  }
  rows.forEach((row, i) => {
    const y = TOP + i * ROW;
    svg.append(svgEl("text", { class: "label", x: 4, y: y + 14 }, row.label));
    for (const b of row.bars) {
      svg.append(svgEl("rect", { class: `bar st-${b.cls}`, x: x(b.from), y: y + 3,
        width: Math.max(2, x(b.to) - x(b.from)), height: ROW - 6, rx: 2 }, svgEl("title", {}, b.title)));
    }
  });
  return svg;
}

// A sync's epochs as a chart: rows committed per epoch as bars, and the
// seconds each commit came after the one before as a line (how far behind
// its source a stream can be between two commits).
function epochsSvg(items) {
  const es = [...items].sort((a, b) => a.epoch - b.epoch);
  const W = 760, H = 200, L = 60, R = 60, TOP = 14, BOTTOM = 28;
  const svg = svgEl("svg", { class: "epochs", width: W, height: H, role: "img",
    "aria-label": `${es.length} epochs: rows committed and seconds between commits` });
  if (!es.length) return svg;
  const gaps = es.map((e, i) => (i === 0 ? null
    : (new Date(e.committed_at) - new Date(es[i - 1].committed_at)) / 1000));
  const maxRows = Math.max(1, ...es.map((e) => e.total_rows));
  const maxGap = Math.max(1, ...gaps.filter((g) => g !== null));
  const bw = (W - L - R) / es.length;
  const y = (v, max) => TOP + (H - TOP - BOTTOM) * (1 - v / max);
  svg.append(svgEl("text", { class: "axis", x: 4, y: TOP + 4 }, `${maxRows} rows`),
    ...(es.length > 2 ? [svgEl("text", { class: "axis gap-axis", x: W - 4, y: TOP + 4, "text-anchor": "end" },
      `${maxGap.toFixed(1)} s`)] : []),
    svgEl("text", { class: "axis", x: L, y: H - 8 }, `epoch ${es[0].epoch}`),
    svgEl("text", { class: "axis", x: W - R, y: H - 8, "text-anchor": "end" }, `epoch ${es[es.length - 1].epoch}`),
    svgEl("line", { class: "tick", x1: L, x2: W - R, y1: H - BOTTOM, y2: H - BOTTOM }));
  es.forEach((e, i) => {
    svg.append(svgEl("rect", { class: "bar rows", x: L + i * bw + 1, y: y(e.total_rows, maxRows),
      width: Math.max(1, bw - 2), height: H - BOTTOM - y(e.total_rows, maxRows) },
      svgEl("title", {}, `epoch ${e.epoch}: ${e.total_rows} rows, committed ${e.committed_at}`)));
  });
  const pts = gaps.map((g, i) => (g === null ? null : `${L + i * bw + bw / 2},${y(g, maxGap)}`)).filter(Boolean);
  if (pts.length > 1) svg.append(svgEl("polyline", { class: "gap", points: pts.join(" ") }));
  return svg;
}

// Pipelines and datasets in columns by depth, edges as arrows.
function lineageSvg(graph) {
  const nodes = new Map();
  for (const p of graph.pipelines) nodes.set(p, { id: p, kind: "pipeline" });
  for (const d of graph.datasets) nodes.set(d, { id: d, kind: "dataset" });
  const incoming = new Map([...nodes.keys()].map((k) => [k, []]));
  for (const e of graph.edges) if (incoming.has(e.to)) incoming.get(e.to).push(e.from);
  const depth = new Map();
  const depthOf = (n, seen) => {
    if (depth.has(n)) return depth.get(n);
    if (seen.has(n)) return 0;
    seen.add(n);
    const d = Math.max(-1, ...incoming.get(n).map((m) => depthOf(m, seen))) + 1;
    depth.set(n, d);
    return d;
  };
  for (const n of nodes.keys()) depthOf(n, new Set());
  const cols = new Map();
  for (const [n, d] of depth) { if (!cols.has(d)) cols.set(d, []); cols.get(d).push(n); }
  const W = 170, H = 34, GX = 60, GY = 18;
  const pos = new Map();
  let maxRows = 0;
  for (const [d, ns] of cols) {
    ns.sort().forEach((n, i) => pos.set(n, { x: 10 + d * (W + GX), y: 10 + i * (H + GY) }));
    maxRows = Math.max(maxRows, ns.length);
  }
  const width = 20 + cols.size * (W + GX), height = 20 + maxRows * (H + GY);
  const s = svgEl;
  const svg = s("svg", { class: "lineage", width, height, role: "img",
    "aria-label": "lineage: pipelines and datasets" },
    s("defs", {}, s("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5,
      markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
      s("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#8c959f" }))));
  for (const e of graph.edges) {
    const a = pos.get(e.from), b = pos.get(e.to);
    if (!a || !b) continue;
    svg.append(s("path", { class: `edge${e.recorded ? "" : " declared"}`, "marker-end": "url(#arrow)",
      d: `M ${a.x + W} ${a.y + H / 2} C ${a.x + W + GX / 2} ${a.y + H / 2}, ${b.x - GX / 2} ${b.y + H / 2}, ${b.x} ${b.y + H / 2}` },
      s("title", {}, `${e.from} ${e.kind === "writes" ? "writes" : "is read by"} ${e.to}`)));
  }
  for (const [id, n] of nodes) {
    const p = pos.get(id);
    if (!p) continue;
    const link = s("a", { href: n.kind === "pipeline" ? `#/pipelines/${encodeURIComponent(id)}`
      : `#/datasets/${encodeURIComponent(id)}` },
      s("g", { class: n.kind },
        s("rect", { x: p.x, y: p.y, width: W, height: H, rx: n.kind === "pipeline" ? 4 : 14 }),
        s("text", { x: p.x + 10, y: p.y + H / 2 + 4 }, (n.kind === "pipeline" ? "⚙ " : "▤ ") + id)));
    svg.append(link);
  }
  return svg;
}

async function datasets() {
  const [list, graph] = await Promise.all([get("/datasets"), get("/lineage")]);
  page("Datasets and lineage",
    h("p", { class: "legend" }, "⚙ pipeline, ▤ dataset; solid edges were recorded by runs, dashed ones are declared only."),
    lineageSvg(graph),
    table(["dataset", "writers", "readers", "#commits", "#last snapshot", "last commit"],
      list.map((d) => [h("a", { href: `#/datasets/${encodeURIComponent(d.dataset)}` }, d.dataset),
        d.writers.join(", ") || "-", d.readers.join(", ") || "-", String(d.commits),
        d.last_snapshot === null ? "-" : String(d.last_snapshot), when(d.last_committed_at)]),
    { label: "datasets", empty: "No datasets yet." }));
}

// What a maintenance run did, from its dataset.* events.
function maintenanceReport(r) {
  const x = r.report || {};
  const parts = [];
  if (x["dataset.compacted"]) {
    const c = x["dataset.compacted"];
    parts.push(`compacted ${c.files_removed ?? 0} files into ${c.files_added ?? 0}`);
  }
  if (x["dataset.expired"]) {
    parts.push(`expired ${(x["dataset.expired"].snapshots || []).length} snapshots`);
  }
  if (x["dataset.orphans_removed"]) {
    parts.push(`removed ${(x["dataset.orphans_removed"].files || []).length} orphans`);
  }
  return parts.join("; ") || (r.error ? r.error : "-");
}

async function dataset(name) {
  const d = await get(`/datasets/${encodeURIComponent(name)}`);
  const m = d.maintenance;
  const maintain = h("p", {},
    h("button", { type: "button", id: "maintain", onclick: async () => {
      try {
        const x = await api("POST", `/datasets/${encodeURIComponent(name)}/maintain`, {});
        location.hash = `#/runs/${x.run}`;
      } catch (e) { showError(e); }
    } }, "Maintain now"),
    h("span", { class: "muted" }, m.schedule
      ? ` Scheduled: ${m.schedule.cron} (${m.schedule.tz}), next ${when(m.schedule.next_fire_at)}.`
      : " No maintenance schedule."));
  page(`Dataset ${name}`,
    h("p", {}, `Written by ${d.writers.join(", ") || "nobody"}; read by ${d.readers.join(", ") || "nobody"}.`),
    h("h2", {}, "Maintenance"), maintain,
    table(["run", "under", "status", "trigger", "queued", "took", "what it did"],
      m.runs.map((r) => [h("a", { href: `#/runs/${r.run}` }, String(r.run)), r.pipeline, status(r.status),
        r.trigger, when(r.created_at), took(r.created_at, r.finished_at), maintenanceReport(r)]),
      { label: "maintenance runs", empty: "Never maintained." }),
    h("h2", {}, "Snapshots"),
    table(["#snapshot", "operation", "pipeline", "run", "step", "partition", "committed"],
      d.snapshots.map((c) => [String(c.snapshot), c.operation, c.pipeline,
        h("a", { href: `#/runs/${c.run}` }, String(c.run)), c.step, c.partition, when(c.committed_at)]),
      { label: "snapshots", empty: "No snapshots committed by Orca's runs." }),
    h("h2", {}, "Lineage"),
    table(["direction", "#depth", "dataset", "via", "pipeline", "run", "read", "committed"],
      d.lineage.map((l) => [l.direction, String(l.depth),
        h("a", { href: `#/datasets/${encodeURIComponent(l.related)}` }, l.related), l.via, l.pipeline,
        h("a", { href: `#/runs/${l.run}` }, String(l.run)), String(l.read_snapshot ?? "-"),
        String(l.commit_snapshot ?? "-")]), { label: "lineage", empty: "Nothing recorded yet." }));
}

// A CDC sync's slot: its lag behind the WAL, and a warning when nothing
// will read it again (it pins WAL on the source).
function slotLag(s) {
  if (!s.slot) return "-";
  if (s.slot_lag_bytes === null) return "slot on another server";
  const lag = `${s.slot_lag_bytes} B, ${s.slot_lag_seconds} s`;
  return s.slot_held_back ? h("span", { class: "error" }, `${lag}; held back: it pins WAL`) : lag;
}

async function syncs() {
  const list = await get("/syncs");
  page("Syncs", table(["sync", "delivery", "source → destination", "streams", "#generation",
    "#HEAD epoch", "HEAD moved", "#last epoch rows", "#quarantined", "#held", "slot lag", "last run",
    "#queued", "#running"], list.map((s) => [h("a", { href: `#/syncs/${encodeURIComponent(s.sync)}` }, s.sync),
    s.delivery, `${s.source || "?"} → ${s.destination || "?"}`,
    s.stream_levels.map((x) => `${x.stream} (${x.mode || "append"}): ${x.delivery || "-"}`).join("; ") || "-",
    String(s.generation), String(s.head_epoch),
    when(s.head_at), s.last_epoch_rows === null ? "-" : String(s.last_epoch_rows),
    String(s.quarantined), String(s.held), slotLag(s), s.last_run ? h("span", {}, h("a", { href: `#/runs/${s.last_run}` },
      String(s.last_run)), " ", status(s.last_status)) : "-", String(s.queued), String(s.running)]),
  { label: "syncs", empty: "No syncs (orca.create_sync defines one)." }));
}

async function webhooks() {
  const list = await get("/webhooks");
  const sections = await Promise.all(list.map(async (w) => {
    const d = await get(`/webhooks/${w.id}/deliveries?limit=20`);
    return [h("h2", {}, `Endpoint ${w.id}: ${w.url}`),
      h("p", {}, w.enabled ? status("enabled") : status("disabled"),
        ` events ${w.events.join(", ")}; cursor at event ${w.cursor}`,
        w.failures ? `; ${w.failures} failed tries since ${when(w.failing_since)}` : "",
        w.disabled_reason ? h("span", { class: "error" }, ` ${w.disabled_reason}`) : ""),
      table(["#try", "event", "#attempt", "status", "#response", "#latency ms", "relay", "at", "error"],
        d.items.map((x) => [String(x.id), String(x.event), String(x.attempt), status(x.status),
          x.response === null ? "-" : String(x.response), String(x.latency_ms), x.relay || "-",
          when(x.at), x.error || ""]), { label: `deliveries of endpoint ${w.id}`,
          empty: "No delivery tries yet." })];
  }));
  page("Webhooks", ...(list.length ? sections.flat()
    : [h("p", { class: "muted" }, "No endpoints (orca webhooks create URL).")]));
}

async function sync(name) {
  const path = `/syncs/${encodeURIComponent(name)}`;
  const epochs = await get(`${path}/epochs?limit=100`);
  const head = h("p", { id: "sync-head", "aria-live": "polite" });
  const drift = h("div", { id: "sync-drift" });
  const lanes = h("input", { type: "number", id: "lanes", min: "1", max: "64", value: "1",
    "aria-label": "writer lanes" });
  const act = (what, body) => async () => {
    try { await api("POST", `${path}/${what}`, body && body()); await draw(); } catch (e) { showError(e); }
  };
  const buttons = h("p", {},
    h("button", { type: "button", class: "danger", id: "pause", onclick: act("pause") }, "Pause sync"), " ",
    h("button", { type: "button", id: "resume", onclick: act("resume") }, "Resume sync"), " ",
    h("label", { for: "lanes" }, "Writer lanes "), lanes, " ",
    h("button", { type: "button", id: "scale",
      onclick: act("scale", () => ({ lanes: Number(lanes.value) })) }, "Scale"));
  // Its state comes from the listing: lanes, paused, the catalog's drift.
  const draw = async () => {
    const s = (await get("/syncs")).find((x) => x.sync === name);
    if (!s) { head.replaceChildren(h("span", { class: "error" }, "no such sync")); return; }
    head.replaceChildren(status(s.paused ? "paused" : "active"),
      ` ${s.source || "?"} → ${s.destination || "?"}, ${s.lanes || 1} writer lane(s), HEAD at epoch `,
      `${s.head_epoch} (generation ${s.generation})`,
      ...(s.last_run ? ["; last run ", h("a", { href: `#/runs/${s.last_run}` }, String(s.last_run)), " ",
        status(s.last_status)] : []));
    lanes.value = String(s.lanes || 1);
    document.getElementById("pause").disabled = !!s.paused;
    document.getElementById("resume").disabled = !s.paused;
    drift.replaceChildren(...(s.drift && s.drift.length ? [h("h2", {}, "Drift from its catalog"),
      table(["table", "column", "change", "was", "now"], s.drift.map((d) => [d.table, d.column,
        d.change, d.was || "-", d.now || "-"]), { label: "drift" })] : []));
  };
  page(`Sync ${name}`, head, buttons, drift, h("h2", {}, "Epochs"),
    h("div", { id: "epochs-chart" }, epochsSvg(epochs.items)), table(["#epoch", "#generation", "rows by stream", "#rows",
    "#quarantined", "#held", "committed"], epochs.items.map((e) => [String(e.epoch), String(e.generation),
    Object.entries(e.rows).map(([k, v]) => `${k}: ${v}`).join(", ") || "-", String(e.total_rows),
    String(e.quarantined), String(e.held), when(e.committed_at)]),
  { label: "epochs", empty: "No epochs recorded yet." }));
  await draw();
}

async function runners() {
  const list = await get("/runners");
  const now = Date.now();
  page("Runners", table(["runner", "host", "pool", "#slots", "first seen", "last seen", "#seconds since"],
    list.map((r) => [r.name, r.host || "-", r.pool, r.slots === null ? "-" : String(r.slots),
      when(r.first_seen), when(r.last_seen), String(Math.round((now - new Date(r.last_seen)) / 1000))]),
    { label: "runners", empty: "No runners seen." }));
}

async function incidentsPage() {
  const list = await get("/incidents?limit=200");
  const row = (i) => [h("a", { href: `#/incidents/${i.id}` }, String(i.id)),
    i.resolved_at ? status("resolved") : status("open"), i.kind, i.summary,
    when(i.opened_at), String(i.seen), when(i.resolved_at), i.resolution || ""];
  const cols = ["#incident", "state", "kind", "summary", "opened", "#seen", "resolved", "resolution"];
  page("Incidents",
    h("h2", {}, "Open"),
    table(cols, list.filter((i) => !i.resolved_at).map(row), { label: "open incidents", empty: "No open incidents." }),
    h("h2", {}, "Resolved"),
    table(cols, list.filter((i) => i.resolved_at).map(row), { label: "resolved incidents", empty: "None resolved yet." }));
}

// An incident: what it is about, its timeline as bars of time from its
// opening, what its playbooks did, and the datasets it may leave stale.
async function incident(id) {
  const x = await get(`/incidents/${id}`);
  const start = new Date(x.opened_at).getTime();
  const end = x.resolved_at ? new Date(x.resolved_at).getTime() : Date.now();
  const span = Math.max(end - start, 1000);
  const resolve = h("button", { type: "button", id: "resolve", disabled: Boolean(x.resolved_at), onclick: async () => {
    try {
      await api("POST", `/incidents/${id}/resolve`, { note: "resolved from the console" });
      await incident(id);
      await openIncidents();
    } catch (e) { showError(e); }
  } }, "Resolve");
  const bar = h("div", { class: "timeline", role: "img",
    "aria-label": `open ${Math.round(span / 1000)} s, ${x.timeline.length} events` },
    x.timeline.map((e) => h("span", { class: `mark ${e.kind.replace(".", "-")}`,
      title: `${when(e.at)} ${e.kind}`,
      style: `left: ${Math.min(100, ((new Date(e.at).getTime() - start) / span) * 100).toFixed(1)}%` })));
  page(`Incident ${id}`,
    h("p", { id: "incident-head" }, x.resolved_at ? status("resolved") : status("open"), ` ${x.kind}: ${x.summary}`),
    h("p", { class: "muted" }, `opened ${when(x.opened_at)}, seen ${x.seen} time(s), last ${when(x.last_seen_at)}`,
      x.resolved_at ? `; resolved ${when(x.resolved_at)}: ${x.resolution}` : ""),
    h("p", {}, resolve),
    h("h2", {}, "Timeline"), bar,
    table(["#event", "at", "kind", "data"], x.timeline.map((e) =>
      [String(e.id), when(e.at), e.kind, JSON.stringify(e.data)]), { label: "timeline" }),
    h("h2", {}, "Playbooks"),
    table(["#playbook", "action", "outcome", "at"], x.actions.map((a) =>
      [String(a.playbook), a.action, a.outcome, when(a.at)]), { label: "playbook actions", empty: "No playbook ran: it only opened." }),
    h("h2", {}, "Datasets it may leave stale"),
    table(["dataset", "#depth"], x.affected.map((d) =>
      [h("a", { href: `#/datasets/${encodeURIComponent(d.dataset)}` }, d.dataset), String(d.depth)]),
    { label: "affected datasets", empty: "None: it is about no pipeline's output." }),
    h("h2", {}, "Subject"), h("pre", {}, JSON.stringify(x.subject, null, 2)));
}

// The open incidents, on every page.
async function openIncidents() {
  const badge = document.getElementById("open-incidents");
  try {
    const open = await get("/incidents?open=true&limit=1000");
    badge.hidden = open.length === 0;
    badge.textContent = `${open.length} open incident${open.length === 1 ? "" : "s"}`;
    badge.title = open.slice(0, 5).map((i) => `${i.kind}: ${i.summary}`).join("\n");
  } catch (e) {
    badge.hidden = true;
  }
}

// --- routing ---------------------------------------------------------------------

async function route() {
  stopPage();
  stopPage = () => {};
  const [, section, arg] = (location.hash || "#/pipelines").split("/").map(decodeURIComponent);
  try {
    if (section === "login") return await login();
    const who = await get("/session");
    document.getElementById("who").textContent = `${who.org} · ${who.role} (${who.key})`;
    document.getElementById("logout").hidden = false;
    openIncidents();
    if (section === "pipelines" && arg) await pipeline(arg);
    else if (section === "runs" && arg) await run(arg);
    else if (section === "runs") await runsPage();
    else if (section === "datasets" && arg) await dataset(arg);
    else if (section === "datasets") await datasets();
    else if (section === "syncs" && arg) await sync(arg);
    else if (section === "syncs") await syncs();
    else if (section === "runners") await runners();
    else if (section === "webhooks") await webhooks();
    else if (section === "incidents" && arg) await incident(arg);
    else if (section === "incidents") await incidentsPage();
    else await pipelines();
    main.focus();
  } catch (e) {
    main.replaceChildren();
    showError(e);
  }
}

document.getElementById("logout").addEventListener("click", async () => {
  await api("DELETE", "/session").catch(() => {});
  location.hash = "#/login";
});
window.addEventListener("hashchange", route);
route();

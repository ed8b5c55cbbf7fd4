// Polls api/status every POLL_MS and redraws the jobs in place (no reload). The charts keep the last WINDOW_MS
// of samples in the page: batch duration (seconds per batch between two polls, else the last batch's),
// input rate (records per second between two polls) and lag (log versions).
"use strict";
const POLL_MS = 1000;
const WINDOW_MS = 5 * 60 * 1000;
const samplesByJob = new Map(); // job -> [{t, metrics, lag, lastSeconds}]

function el(tag, attrs = {}, text = "") {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text) e.textContent = text;
  return e;
}

function series(samples) {
  const dur = [], rate = [], lag = [];
  for (let i = 0; i < samples.length; i++) {
    const s = samples[i], p = samples[i - 1];
    lag.push([s.t, s.lag ?? 0]);
    if (p && s.metrics && p.metrics) {
      const dt = (s.t - p.t) / 1000, db = s.metrics.batches - p.metrics.batches;
      rate.push([s.t, Math.max(0, (s.metrics.input_records - p.metrics.input_records) / dt)]);
      dur.push([s.t, db > 0 ? (s.metrics.batch_seconds - p.metrics.batch_seconds) / db : s.lastSeconds ?? 0]);
    } else {
      dur.push([s.t, s.lastSeconds ?? 0]);
    }
  }
  return { "batch duration (s)": dur, "input rate (records/s)": rate, "lag (log versions)": lag };
}

function chart(title, points, now) {
  const box = el("div", { class: "chart" });
  const max = Math.max(1e-9, ...points.map((p) => p[1]));
  const last = points.length ? points[points.length - 1][1] : 0;
  box.append(el("div", { class: "title" }, `${title}: ${last.toFixed(2)} (max ${max.toFixed(2)})`));
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", "0 0 260 70");
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute(
    "points",
    points.map(([t, v]) => `${(260 * (1 - (now - t) / WINDOW_MS)).toFixed(1)},${(66 - 62 * (v / max)).toFixed(1)}`).join(" "),
  );
  line.dataset.n = String(points.length);
  svg.append(line);
  box.append(svg);
  return box;
}

function render(data) {
  const now = data.at_ms;
  const root = document.getElementById("jobs");
  const cards = [];
  for (const [job, s] of Object.entries(data.jobs)) {
    const h = samplesByJob.get(job) || [];
    h.push({ t: now, metrics: s.metrics, lag: s.lag_versions, lastSeconds: s.last_batch_seconds });
    while (h.length && now - h[0].t > WINDOW_MS) h.shift();
    samplesByJob.set(job, h);
    const card = el("div", { class: `job ${s.running ? "running" : "stopped"}`, id: `job-${job}` });
    card.append(el("h2", {}, job));
    const facts = el("table", { class: "facts" });
    const rows = [
      ["generation", s.generation],
      ["lag (log versions)", s.lag_versions],
      ["last batch", s.last_batch_ms ? `${new Date(s.last_batch_ms).toLocaleTimeString()} (${s.last_batch_seconds ?? "?"} s)` : "none yet"],
      s.late_events_kept === undefined
        ? ["rejected / late / held", `${s.rejected ?? 0} / ${s.late ?? 0} / ${s.held ?? 0}`]
        : ["rejected / late (kept: as-of lookup) / held", `${s.rejected ?? 0} / ${s.late_events_kept} / ${s.held ?? 0}`],
      ["state", s.state ?? (s.running ? "running" : "stopped")],
    ];
    if (s.replay) rows.push(["replay", `building generation ${s.replay.building}: ${s.replay.processed_versions}/${s.replay.total_versions} log versions`]);
    if (s.metrics_url) rows.push(["metrics", s.metrics_url]);
    for (const [k, v] of rows) {
      const tr = el("tr");
      tr.append(el("td", {}, k), el("td", { class: k.split(" ")[0] }, String(v)));
      facts.append(tr);
    }
    card.append(facts);
    const charts = el("div", { class: "charts" });
    for (const [title, points] of Object.entries(series(h))) charts.append(chart(title, points, now));
    card.append(charts);
    cards.push(card);
  }
  root.replaceChildren(...cards);
  document.getElementById("note").textContent =
    (data.running ? `${data.running} job(s) running` : "no job is running: mview deploy JOB starts one") +
    `, updated ${new Date(now).toLocaleTimeString()}`;
  if (data.page_url) document.getElementById("page-link").href = data.page_url;
}

async function refresh() {
  try {
    const r = await fetch("api/status", { cache: "no-store" });
    if (!r.ok) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
    render(await r.json());
  } catch (e) {
    document.getElementById("note").textContent = "error: " + e.message;
  }
}

refresh();
setInterval(refresh, POLL_MS);

// The coordinator's dashboard: two pages that poll the read-only JSON API (GET /api
// describes it) and redraw. No framework; Chart.js comes from the daemon itself
// (Debian's libjs-chart.js). `?refresh=MS` sets the polling period (default 2000).
"use strict";

const PAGE_QUERY = new URLSearchParams(location.search);
const REFRESH_MS = Number(PAGE_QUERY.get("refresh")) || 2000;
const PART_COLOURS = ["#8c8c8c", "#9467bd", "#1f77b4", "#ff7f0e", "#d62728", "#2ca02c"];

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function when(seconds) {
  return seconds ? new Date(seconds * 1000).toLocaleString() : "";
}

function fixed(value, digits) {
  return typeof value === "number" ? value.toFixed(digits) : "";
}

function showError(message) {
  const box = document.getElementById("error");
  box.hidden = !message;
  box.textContent = message || "";
}

async function getJson(path) {
  const response = await fetch(path, {cache: "no-store"});
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || `${path}: HTTP ${response.status}`);
  return body;
}

function fillTable(id, rows) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren(...rows);
}

function stateBadge(state) {
  return el("span", state, `state ${state}`);
}

// ---- Overview: jobs and workers -------------------------------------------------

function jobRow(job) {
  const tr = el("tr");
  tr.dataset.job = job.id;
  const link = el("a", job.id);
  link.href = `/jobs/${job.id}`;
  const id = el("td");
  id.append(link);
  const state = el("td");
  state.append(stateBadge(job.state));
  // Why it waits (a queued job), else why it ended.
  const why = job.slurm ? `Slurm ${job.slurm}` : (job.waiting || job.reason);
  tr.append(id, el("td", job.name), el("td", job.user || "-"), state, el("td", job.priority, "num"),
            el("td", job.ranks, "num"), el("td", job.device), el("td", job.attempts, "num"),
            el("td", job.epochs, "num"), el("td", fixed(job.ms_per_step, 1), "num"), el("td", when(job.submitted_at)),
            el("td", why));
  return tr;
}

function workerRow(worker) {
  const tr = el("tr");
  tr.dataset.world = worker.world;
  tr.dataset.rank = worker.rank;
  let job = "";
  if (worker.job) {
    job = el("a", `${worker.job} (attempt ${worker.attempt})`);
    job.href = `/jobs/${worker.job}`;
  }
  const jobCell = el("td");
  jobCell.append(job);
  tr.append(el("td", worker.world), el("td", worker.rank, "num"), el("td", worker.host), el("td", worker.slot, "num"),
            el("td", worker.device),
            el("td", worker.pid, "num"), jobCell, el("td", `${fixed(worker.seconds_since_heartbeat, 1)} s ago`, "num"),
            el("td", worker.alive ? "yes" : "no", worker.alive ? "" : "alive-no"), el("td", worker.last_log_line));
  return tr;
}

// The overview shows one page of the job listing, newest first (Note [Paged job listing]
// in coordinator/server_web.cc): the page's own ?limit (default 100), ?before, ?state
// and ?user go to /api/jobs as they are, and the API's `next` becomes the older-jobs link.
function jobsQuery() {
  const query = new URLSearchParams({limit: PAGE_QUERY.get("limit") || "100"});
  for (const field of ["before", "state", "user"]) {
    if (PAGE_QUERY.get(field)) query.set(field, PAGE_QUERY.get(field));
  }
  return `/api/jobs?${query}`;
}

function showJobPaging(jobs) {
  document.getElementById("job-count").textContent = `(${jobs.jobs.length} of ${jobs.total} shown)`;
  const older = document.getElementById("older-jobs");
  older.hidden = !jobs.next;
  if (jobs.next) {
    const query = new URLSearchParams(jobs.next.split("?")[1]);
    if (PAGE_QUERY.get("refresh")) query.set("refresh", PAGE_QUERY.get("refresh"));
    older.href = `/?${query}`;
  }
  document.getElementById("newest-jobs").hidden = !PAGE_QUERY.get("before");
}

async function refreshOverview() {
  const [jobs, workers] = await Promise.all([getJson(jobsQuery()), getJson("/api/workers")]);
  fillTable("jobs-table", jobs.jobs.map(jobRow));
  fillTable("workers-table", workers.workers.map(workerRow));
  showJobPaging(jobs);
  document.getElementById("worker-count").textContent =
      `(${workers.workers.length} slots; lost after ${workers.lost_after_s} s without a heartbeat)`;
  // Refused registrations as another agent's world (squat attempts), newest first.
  const warnings = document.getElementById("worker-warnings");
  warnings.replaceChildren(...workers.warnings.slice().reverse().map(w => el("li", `${when(w.at)}: ${w.text}`)));
}

// ---- One job: curves, per-rank breakdown, heatmap, attempts, events -------------

const charts = {};

function lineChart(id, title, yTitle) {
  return new Chart(document.getElementById(id), {
    type: "line",
    data: {labels: [], datasets: []},
    options: {
      animation: false, maintainAspectRatio: false,
      plugins: {title: {display: true, text: title}},
      scales: {x: {title: {display: true, text: "epoch"}}, y: {title: {display: true, text: yTitle}}},
    },
  });
}

function breakdownChart() {
  return new Chart(document.getElementById("chart-breakdown"), {
    type: "bar",
    data: {labels: [], datasets: []},
    options: {
      animation: false, maintainAspectRatio: false,
      plugins: {title: {display: true, text: "mean ms per step of each part, by rank"}},
      scales: {x: {stacked: true}, y: {stacked: true, title: {display: true, text: "ms per step"}}},
    },
  });
}

function makeJobCharts() {
  if (typeof Chart === "undefined") {
    showError("Chart.js is not available from this coordinator (install Debian's libjs-chart.js); " +
              "charts are off, tables still update.");
    return;
  }
  charts.loss = lineChart("chart-loss", "loss", "loss");
  charts.accuracy = lineChart("chart-accuracy", "dev accuracy", "accuracy");
  charts.ms = lineChart("chart-ms", "ms per step", "ms");
  charts.breakdown = breakdownChart();
}

function series(label, colour, epochs, column) {
  return {label, borderColor: colour, backgroundColor: colour, data: epochs.map((e) => e[column]), spanGaps: true};
}

function updateCurves(epochs) {
  document.getElementById("no-epochs").hidden = epochs.length > 0;
  if (!charts.loss) return;
  const labels = epochs.map((e) => e.epoch);
  const set = (chart, datasets) => {
    chart.data.labels = labels;
    chart.data.datasets = datasets;
    chart.update("none");
  };
  set(charts.loss, [series("train loss", "#1f77b4", epochs, "train_loss"),
                    series("dev loss", "#ff7f0e", epochs, "eval_loss")]);
  set(charts.accuracy, [series("dev accuracy", "#2ca02c", epochs, "eval_acc")]);
  set(charts.ms, [series("rank 0", "#1f77b4", epochs, "ms_per_step"),
                  series("slowest rank", "#d62728", epochs, "slowest_ms_per_step")]);
}

// The latest epoch's parts as one stacked bar per rank; the slowest rank's bar is
// outlined in red and named in its label.
function updateBreakdown(job) {
  const latest = job.breakdown.length ? job.breakdown[job.breakdown.length - 1] : null;
  const ranks = latest && Array.isArray(latest.ranks) ? latest.ranks : [];
  document.getElementById("breakdown-epoch").textContent = latest ? `(epoch ${latest.epoch})` : "";
  const straggler = document.getElementById("straggler");
  straggler.textContent = ranks.length > 1
      ? `slowest: rank ${latest.slowest_rank}, ${fixed(latest.slowest_ms_per_step, 1)} ms per step`
      : "";
  straggler.dataset.rank = ranks.length > 1 ? latest.slowest_rank : "";
  if (!charts.breakdown) return;
  const isSlowest = (r) => ranks.length > 1 && r === latest.slowest_rank;
  charts.breakdown.data.labels = ranks.map((_, r) => (isSlowest(r) ? `rank ${r} (slowest)` : `rank ${r}`));
  charts.breakdown.data.datasets = job.step_parts.map((part, i) => ({
    label: part,
    backgroundColor: PART_COLOURS[i % PART_COLOURS.length],
    data: ranks.map((parts) => parts[i]),
    borderColor: ranks.map((_, r) => (isSlowest(r) ? "#d62728" : "rgba(0,0,0,0)")),
    borderWidth: ranks.map((_, r) => (isSlowest(r) ? 3 : 0)),
  }));
  charts.breakdown.update("none");
}

function updateJobTables(job) {
  fillTable("attempts-table", job.attempt_list.map((a) => {
    const tr = el("tr");
    tr.append(el("td", a.attempt, "num"), el("td", a.placement), el("td", when(a.started_at)),
              el("td", when(a.ended_at)), el("td", a.outcome || "running"));
    return tr;
  }));
  fillTable("events-table", job.events.map((e) => {
    const tr = el("tr");
    tr.append(el("td", when(e.at)), el("td", e.text));
    return tr;
  }));
}

async function refreshJob(id) {
  const job = await getJson(`/api/jobs/${id}`);
  document.title = `Trainyard job ${job.id}: ${job.name}`;
  document.getElementById("job-title").textContent = `Job ${job.id}: ${job.name}`;
  const state = document.getElementById("job-state");
  state.textContent = job.state;
  state.className = `state ${job.state}`;
  document.getElementById("job-facts").textContent = (job.kind === "search"
      ? "a search: its trials are jobs of their own; "
      : `${job.ranks} rank(s) on ${job.device}; attempt ${job.attempts} of at most ${job.max_restarts + 1}; `) +
      `owner ${job.user || "-"}, priority ${job.priority}${job.preemptible ? "" : ", not preemptible"}; ` +
      `submitted ${when(job.submitted_at)}` + (job.slurm ? `; Slurm ${job.slurm}` : "");
  document.getElementById("job-reason").textContent = job.waiting ? `waiting: ${job.waiting}` : job.reason;
  updateCurves(job.epochs);
  updateBreakdown(job);
  updateJobTables(job);
  const heatmap = document.getElementById("heatmap");
  document.getElementById("heatmap-section").hidden = !job.heatmap;
  // A benchmark job has a heatmap and no epochs: its page shows just that.
  const benchmark = Boolean(job.heatmap) && job.epochs.length === 0;
  document.getElementById("curves").hidden = benchmark;
  document.getElementById("breakdown").hidden = benchmark;
  if (job.heatmap && heatmap.getAttribute("src") !== job.heatmap) heatmap.src = job.heatmap;
  updateSearch(job);
  updateOutput(job.output);
}

// The tail of the latest attempt's output.log (Note [Job output]), kept scrolled to its
// end unless the reader scrolled up.
function updateOutput(output) {
  const pre = document.getElementById("output-tail");
  const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  document.getElementById("no-output").hidden = Boolean(output.tail);
  document.getElementById("output-attempt").textContent =
      output.attempt ? `(attempt ${output.attempt}, its last lines; all of it: jobctl logs --output)` : "";
  if (pre.textContent !== output.tail) {
    pre.textContent = output.tail;
    if (atEnd) pre.scrollTop = pre.scrollHeight;
  }
}

// ---- A search: every trial's curve on one chart, stopped trials in grey -----------

const STOPPED_GREY = "rgba(140, 140, 140, 0.55)";
const TRIAL_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#17becf", "#bcbd22", "#e377c2"];

function trialColour(trial, index) {
  return trial.state === "STOPPED" ? STOPPED_GREY : TRIAL_COLOURS[index % TRIAL_COLOURS.length];
}

function updateSearch(job) {
  const s = job.search;
  document.getElementById("search-section").hidden = !s;
  if (!s) return;
  document.getElementById("curves").hidden = true;
  document.getElementById("breakdown").hidden = true;
  const best = s.trials.find((t) => t.trial === s.best_trial);
  document.getElementById("search-facts").textContent =
      `${s.method} on ${s.metric} (${s.mode}), ${s.trials.length} trials, at most ${s.max_concurrent} at once` +
      (s.rungs.length ? `; judged at epochs ${s.rungs.join(", ")} of ${s.max_epochs}` : "") +
      (best ? `; best: trial ${best.trial}, ${s.metric} ${fixed(best.best, 4)}` : "");
  if (typeof Chart !== "undefined" && !charts.search)
    charts.search = lineChart("chart-search", `${s.metric} by epoch, every trial (stopped by the search: grey)`,
                              s.metric);
  if (charts.search) {
    const longest = Math.max(s.max_epochs, ...s.trials.map((t) => t.curve.length));
    charts.search.data.labels = Array.from({length: longest}, (_, i) => i + 1);
    charts.search.data.datasets = s.trials.filter((t) => t.curve.length).map((t, i) => ({
      label: `trial ${t.trial}`, data: t.curve, spanGaps: true,
      borderColor: trialColour(t, i), backgroundColor: trialColour(t, i),
      borderWidth: t.trial === s.best_trial ? 3 : 1.5,
    }));
    charts.search.update("none");
  }
  document.getElementById("search-section").dataset.stopped =
      String(s.trials.filter((t) => t.state === "STOPPED").length);
  fillTable("trials-table", s.trials.map((t) => {
    const tr = el("tr", null, t.state === "STOPPED" ? "stopped" : "");
    const link = el("a", t.job ? String(t.job) : "-");
    if (t.job) link.href = `/jobs/${t.job}`;
    const cell = el("td");
    cell.append(link);
    tr.append(el("td", t.trial, "num"), cell, el("td", t.state), el("td", t.curve.length, "num"),
              el("td", t.stopped_at || "-", "num"), el("td", t.best === null ? "-" : fixed(t.best, 4), "num"),
              el("td", fixed(t.rank_seconds, 1), "num"), el("td", t.params.join(" ")));
    return tr;
  }));
}

// ---- Polling ---------------------------------------------------------------------

async function poll(refresh) {
  try {
    await refresh();
    showError(charts.missing);
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
  } catch (error) {
    showError(error.message);
  }
  setTimeout(() => poll(refresh), REFRESH_MS);
}

window.addEventListener("DOMContentLoaded", () => {
  if (document.body.dataset.page === "job") {
    const id = location.pathname.split("/").filter(Boolean)[1];
    document.getElementById("api-link").href = `/api/jobs/${id}`;
    makeJobCharts();
    if (!charts.loss) charts.missing = document.getElementById("error").textContent;
    poll(() => refreshJob(id));
  } else {
    poll(refreshOverview);
  }
});

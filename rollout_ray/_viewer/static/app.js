// rollout-ray view: plain JS, no framework, no build step.
// Every string from a run (the conversation is model output) reaches the DOM as a text node
// or an attribute value through h(); no string is ever parsed as HTML.
"use strict";

const app = document.getElementById("app");
const crumbs = document.getElementById("crumbs");
const PAGE_SIZE = 50;
const FILTERS = ["reward_min", "reward_max", "ok", "stop", "error", "task", "group"];
const lastRunHash = new Map();  // run id -> its table's hash, so "back" keeps the filters
let renderToken = 0;

// -- DOM and data helpers -----------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

async function api(path, params) {
  const query = new URLSearchParams(params || {}).toString();
  const response = await fetch(`/api/${path}${query ? "?" + query : ""}`);
  const body = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

const runHref = (run, params) => `#/run/${encodeURIComponent(run)}` + (params && params.toString() ? "?" + params : "");
const rolloutHref = (run, id) => `#/run/${encodeURIComponent(run)}/rollout/${encodeURIComponent(id)}`;

function num(value, digits = 3) {
  if (value === null || value === undefined) return "–";
  if (typeof value !== "number") return String(value);
  return Number.isInteger(value) ? value.toLocaleString("en-US") : value.toFixed(digits);
}
const secs = (value) => (value === null || value === undefined ? "–" : `${(value * 1000).toFixed(1)} ms`);
const when = (epoch) => (epoch ? new Date(epoch * 1000).toISOString().replace("T", " ").slice(0, 19) : "–");
const badge = (ok) => h("span", { class: ok ? "badge ok" : "badge failed" }, ok ? "ok" : "failed");
const short = (id) => (id && id.length > 12 ? id.slice(0, 12) + "…" : id);

function show(token, view, ...nodes) {
  if (token !== renderToken) return false;  // a newer route won the race
  app.replaceChildren(...nodes.filter((node) => node !== null && node !== undefined && node !== false));
  app.dataset.view = view;
  app.dataset.state = "ready";
  return true;
}

function setCrumbs(...items) {
  crumbs.replaceChildren(...items.flatMap((item, i) => (i ? [" / ", item] : [item])));
}

function table(headers, rows, attrs) {
  return h("table", attrs || {}, h("thead", {}, h("tr", {}, headers)), h("tbody", {}, rows));
}

// -- routing ------------------------------------------------------------------------------

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/runs";
  const [path, query] = raw.split("?");
  return { parts: path.split("/").filter(Boolean).map(decodeURIComponent), params: new URLSearchParams(query || "") };
}

async function route() {
  const token = ++renderToken;
  const { parts, params } = parseHash();
  app.dataset.state = "loading";
  try {
    if (parts[0] === "run" && parts[2] === "rollout" && parts[3]) await rolloutView(token, parts[1], parts[3]);
    else if (parts[0] === "run" && parts[1]) await runView(token, parts[1], params);
    else await runsView(token);
  } catch (error) {
    show(token, "error", h("div", { class: "error-banner" }, String(error.message || error)));
  }
}

// -- the runs list ------------------------------------------------------------------------

async function runsView(token) {
  const { runs } = await api("runs");
  setCrumbs(h("span", {}, "runs"));
  const rows = runs.map((run) => h("tr", {},
    h("td", {}, h("a", { href: runHref(run.id), class: "run-link" }, run.id)),
    h("td", { class: "num" }, num(run.rollouts)),
    h("td", {}, when(run.created)),
    h("td", {}, run.taskset || "–"),
    h("td", {}, modelShown(run.model)),
    h("td", { class: "path" }, run.error ? `${run.path} (${run.error})` : run.path)));
  show(token, "runs", h("h1", {}, "Runs"),
    runs.length ? table(["run", "rollouts", "created (UTC)", "taskset", "model", "path"].map((x) => h("th", {}, x)),
      rows, { class: "grid runs" }) : h("p", {}, "No runs found."));
}

// The manifest's model is a record ({name, served} from the API): its name, then where it is served.
function modelShown(model) {
  if (!model) return "–";
  return model.served ? [model.name || "–", h("span", { class: "muted" }, ` at ${model.served}`)] : model.name || "–";
}

// -- one run: the rollout table -----------------------------------------------------------

const COLUMNS = [
  ["rollout_id", "rollout", (r, run) => h("a", { href: rolloutHref(run, r.rollout_id) }, short(r.rollout_id))],
  ["task_type", "task", (r) => `${r.task_type} #${r.task_idx}`],
  ["group_id", "group", (r) => short(r.group_id)],
  ["sample_idx", "sample", (r) => r.attempt ? `${r.sample_idx} (attempt ${r.attempt})` : r.sample_idx],
  ["ok", "ok", (r) => badge(r.ok)],
  ["stop_condition", "stop", (r) => r.stop_condition || "–"],
  ["error_type", "error", (r) => r.error_type ? h("span", { title: r.error_message || "" }, r.error_type) : "–"],
  ["reward", "reward", (r) => num(r.reward)],
  ["advantage", "advantage", (r) => num(r.advantage)],
  ["num_turns", "turns", (r) => num(r.num_turns)],
  ["num_total_tokens", "tokens", (r) => num(r.num_total_tokens)],
  ["num_tool_calls", "tools", (r) => num(r.num_tool_calls)],
  ["agent_s", "agent", (r) => secs(r.agent_s)],
];

async function runView(token, runId, params) {
  const query = { run: runId, offset: params.get("offset") || "0", limit: String(PAGE_SIZE) };
  for (const name of [...FILTERS, "sort", "order"]) if (params.get(name)) query[name] = params.get(name);
  const [run, result, live] = await Promise.all([api("run", { run: runId }), api("rollouts", query),
    api("live", { run: runId })]);
  lastRunHash.set(runId, location.hash);
  setCrumbs(h("a", { href: "#/runs" }, "runs"), h("span", {}, runId));
  const columns = COLUMNS.filter(([key]) => key !== "advantage" || run.extras.includes("advantage"));
  show(token, "run",
    h("h1", {}, `Run ${runId}`),
    live.live ? livePanel(token, live.status) : null,
    live.error ? h("p", { class: "error-banner" }, live.error) : null,
    runSummary(run),
    plots(run),
    filterForm(run, runId, params),
    h("p", { class: "matched" }, `${num(result.matched)} matching of ${num(result.total)} rollouts`),
    rolloutTable(runId, params, columns, result.rows),
    pager(runId, params, result));
}

// -- a live run: its driver's status.json, refreshed ---------------------------------------

const LIVE_REFRESH_MS = 3000;

function livePanel(token, s) {
  setTimeout(() => { if (token === renderToken) route(); }, LIVE_REFRESH_MS);
  const p = s.progress;
  const phases = Object.entries(s.phases).filter(([, n]) => n).map(([name, n]) => `${name} ${n}`).join("  ");
  const rows = s.rollouts.map((r) => h("tr", { class: r.stalled ? "stalled" : null },
    h("td", {}, r.stalled ? h("span", { class: "badge failed" }, "stalled") : ""),
    h("td", {}, r.id ? short(r.id) : "–"), h("td", {}, r.label), h("td", { class: "num" }, r.task),
    h("td", {}, r.phase), h("td", { class: "num" }, `${r.age.toFixed(1)} s`)));
  return h("section", { class: "live" },
    h("h2", {}, `Live: ${s.state}`),
    h("p", {}, `done ${num(p.done)}${p.total === null ? "" : " of " + num(p.total - p.skipped)}, failed ${num(p.failed)}, `
      + `in flight ${num(p.in_flight)} (max ${num(s.max_in_flight)}), ${num(p.rate, 2)} rollouts/s, stalled ${num(s.stalled)}`
      + ` — updated ${when(s.updated_at)} UTC`),
    h("p", {}, phases ? `phases: ${phases}` : "nothing in flight"),
    rows.length ? table(["", "rollout", "label", "task", "phase", "age"].map((x) => h("th", {}, x)), rows,
      { class: "grid live-rollouts" }) : null);
}

function runSummary(run) {
  const facts = [["rollouts", num(run.rollouts)], ["ok", num(run.ok)], ["failed", num(run.failed)],
    ["groups", num(run.groups)], ["mean reward", num(run.mean_reward, 4)],
    ["taskset", run.config.taskset || "–"], ["model", modelShown(run.model)], ["created (UTC)", when(run.created)]];
  return h("dl", { class: "facts" }, facts.map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, v))));
}

function plots(run) {
  if (!run.plots || !run.rollouts) return null;
  const image = h("img", { alt: "reward distribution and time per span", class: "plot" });
  const details = h("details", { class: "plots" }, h("summary", {}, "Plots (reward distribution, time per span)"), image);
  details.addEventListener("toggle", () => {  // drawn on the server on first open only
    if (details.open && !image.src) image.src = `/api/plot.png?run=${encodeURIComponent(run.id)}`;
  });
  image.addEventListener("load", () => { details.dataset.state = "loaded"; });
  image.addEventListener("error", () => {
    details.dataset.state = "failed";
    image.replaceWith(h("p", { class: "muted" }, "the plot could not be drawn"));
  });
  return details;
}

function navigate(runId, params) {
  location.hash = runHref(runId, params);
}

function filterForm(run, runId, params) {
  const input = (name, attrs) => h("input", { name, value: params.get(name) || "", ...attrs });
  const choice = (name, options) => {
    const select = h("select", { name }, h("option", { value: "" }, "any"),
      options.map(([value, label]) => h("option", { value }, label)));
    select.value = params.get(name) || "";
    return select;
  };
  const facet = (name) => run.facets[name].map(([value, count]) => [value, `${value} (${count})`]);
  const form = h("form", { class: "filters", id: "filters" },
    h("label", {}, "reward ≥ ", input("reward_min", { type: "number", step: "any", size: 6 })),
    h("label", {}, "reward ≤ ", input("reward_max", { type: "number", step: "any", size: 6 })),
    h("label", {}, "ok ", choice("ok", [["true", "ok"], ["false", "failed"]])),
    h("label", {}, "stop ", choice("stop", facet("stop_condition"))),
    h("label", {}, "error ", choice("error", [["(any)", "(any error)"], ...facet("error_type")])),
    h("label", {}, "task ", input("task", { placeholder: "idx, type or key", size: 14 })),
    h("label", {}, "group ", input("group", { placeholder: "group id prefix", size: 14 })),
    h("button", { type: "submit" }, "Apply"),
    h("button", { type: "button", onclick: () => navigate(runId, new URLSearchParams()) }, "Clear"));
  const apply = (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    for (const name of ["sort", "order"]) if (params.get(name)) next.set(name, params.get(name));
    for (const [name, value] of new FormData(form)) if (String(value).trim()) next.set(name, String(value).trim());
    navigate(runId, next);
  };
  form.addEventListener("submit", apply);
  for (const select of form.querySelectorAll("select")) select.addEventListener("change", apply);
  return form;
}

function rolloutTable(runId, params, columns, rows) {
  const sort = params.get("sort");
  const descending = params.get("order") === "desc";
  const headers = columns.map(([key, label]) => {
    const next = new URLSearchParams(params);
    next.delete("offset");
    next.set("sort", key);
    next.set("order", sort === key && !descending ? "desc" : "asc");
    const arrow = sort === key ? (descending ? " ▼" : " ▲") : "";
    return h("th", { class: "sortable", "data-key": key, onclick: () => navigate(runId, next) }, label + arrow);
  });
  const body = rows.map((row) => h("tr", {
    class: row.ok ? "rollout-row" : "rollout-row failed", "data-id": row.rollout_id,
    onclick: () => { location.hash = rolloutHref(runId, row.rollout_id); },
  }, columns.map(([key, , render]) => h("td", { class: `col-${key}` }, render(row, runId)))));
  return table(headers, body.length ? body : [h("tr", {}, h("td", { colspan: columns.length }, "No rollouts match."))],
    { class: "grid rollouts", id: "rollouts" });
}

function pager(runId, params, result) {
  const link = (offset, label, enabled) => {
    const next = new URLSearchParams(params);
    next.set("offset", String(offset));
    return enabled ? h("a", { href: runHref(runId, next), class: "page-link" }, label) : h("span", { class: "disabled" }, label);
  };
  const first = result.matched ? result.offset + 1 : 0;
  const last = Math.min(result.offset + result.limit, result.matched);
  return h("div", { class: "pager" },
    link(Math.max(0, result.offset - result.limit), "« previous", result.offset > 0),
    h("span", {}, ` ${num(first)}–${num(last)} of ${num(result.matched)} `),
    link(result.offset + result.limit, "next »", last < result.matched));
}

// -- one rollout --------------------------------------------------------------------------

async function rolloutView(token, runId, rolloutId) {
  const [r, group] = await Promise.all([api("rollout", { run: runId, id: rolloutId }),
    api("siblings", { run: runId, id: rolloutId })]);
  setCrumbs(h("a", { href: "#/runs" }, "runs"), h("a", { href: lastRunHash.get(runId) || runHref(runId) }, runId),
    h("span", {}, short(rolloutId)));
  show(token, "rollout",
    h("h1", {}, "Rollout ", h("code", {}, r.id), " ", badge(r.ok)),
    rolloutFacts(r),
    r.errors.length ? section("Errors", r.errors.map(errorBlock), "errors") : null,
    section(`Conversation (${r.messages.length} messages` + (r.num_branches > 1
      ? `, branch ${r.num_branches - 1} of ${r.num_branches}: ${r.branch_reasons[r.num_branches - 1] || "?"})` : ")"),
      [h("div", { class: "chat" }, r.messages.map(bubble)), (r.other_branches || []).map(otherBranch)], "conversation"),
    r.tokens.length ? section(`Tokens (${r.tokens.length} sequence${r.tokens.length > 1 ? "s" : ""}`
      + `, ${r.branch_reasons.length} branch${r.branch_reasons.length > 1 ? "es" : ""})`, tokenView(r.tokens), "tokens") : null,
    section("Rewards and metrics", scores(r), "scores"),
    section("Timing", timeline(r.timing, r.calls), "timing"),
    r.calls.length ? section("Model calls", callsTable(r.calls), "calls") : null,
    r.tool_calls.length ? section("Tool calls", toolsTable(r.tool_calls), "tools") : null,
    section(`Group ${short(group.group_id)} (advantage ${group.advantage_source})`, siblingsTable(runId, r.id, group), "siblings"),
    section("Task", h("pre", { class: "json" }, JSON.stringify(r.task, null, 2)), "task"),
    Object.keys(r.info).length ? section("Info", h("pre", { class: "json" }, JSON.stringify(r.info, null, 2)), "info") : null);
}

const section = (title, body, name) => h("section", { class: `block ${name}` }, h("h2", {}, title), body);

function rolloutFacts(r) {
  const runtime = r.agent.runtime ? `${r.agent.runtime.type} ${r.agent.runtime.name}` + (r.agent.runtime.borrowed ? " (borrowed)" : "") : "–";
  const facts = [["stop", r.stop_condition || "–"], ["reward", num(r.reward, 4)], ["task", `${r.task.type} #${num(r.task.idx)}`],
    ["group", r.group_id], ["sample", `${r.sample_idx}` + (r.attempt ? ` (attempt ${r.attempt})` : "")],
    ["model", r.agent.model || "–"], ["harness", r.agent.harness || "–"], ["runtime", runtime],
    ["turns", num(r.counts.turns)], ["tokens in / out", `${num(r.counts.input_tokens)} / ${num(r.counts.output_tokens)}`]];
  return h("dl", { class: "facts" }, facts.map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, v))));
}

function errorBlock(e) {
  return h("div", { class: "error-block" },
    h("div", { class: "error-head" }, h("span", { class: "error-type" }, e.type),
      e.status_code ? ` (status ${e.status_code})` : "", ": ", h("span", { class: "error-message" }, e.message)),
    e.traceback ? h("pre", { class: "traceback" }, e.traceback) : h("p", { class: "muted" }, "no traceback recorded"));
}

function bubble(m) {
  const meta = [`#${m.node}`];
  if (m.at !== null && m.at !== undefined) meta.push(`t+${m.at.toFixed(3)} s`);
  if (m.call) {
    if (m.call.finish_reason) meta.push(m.call.finish_reason);
    if (m.call.usage) meta.push(`${m.call.usage.input} in / ${m.call.usage.output} out`);
  }
  let label = m.role === "tool" ? `tool result${m.name ? ": " + m.name : ""}` : m.role;
  // Who said a user turn: a simulated user or another agent (by name) is told from the task.
  if (m.role === "user" && m.by_kind && m.by_kind !== "task") label += ` · ${m.by_kind} ${m.by}`;
  if (m.agent) label += ` · ${m.agent}`;
  return h("div", { class: `bubble ${m.role}`, "data-role": m.role },
    h("div", { class: "bubble-head" }, h("span", { class: "role" }, label), h("span", { class: "meta" }, meta.join(" · "))),
    m.reasoning ? h("details", { class: "reasoning" }, h("summary", {}, "reasoning"), h("div", { class: "text" }, m.reasoning)) : null,
    m.text ? h("div", { class: "text" }, m.text) : null,
    (m.tool_calls || []).map((c) => h("div", { class: "toolcall" },
      h("div", { class: "toolcall-head" }, "→ ", h("code", {}, c.name), h("span", { class: "meta" }, ` ${c.id}`)),
      h("pre", { class: "arguments" }, c.arguments))),
    m.tool_call_id ? h("div", { class: "meta" }, `answers ${m.tool_call_id}`) : null);
}

// A branch the conversation above does not show (an agent's context before it compacted, a
// sub-agent's own): folded, from the node where it leaves the shown branch.
function otherBranch(b) {
  const where = b.forks_after === null ? "its own context" : `leaves the shown branch after #${b.forks_after}`;
  return h("details", { class: "other-branch", "data-branch": b.branch, "data-reason": b.reason || "" },
    h("summary", {}, `branch ${b.branch} (${b.reason || "?"}) · ${where} · ${b.messages.length} messages`),
    h("div", { class: "chat" }, b.messages.map(bubble)));
}

// The token view: each sequence as the trainer reads it. Prompt ids grey, sampled ids (loss
// mask 1) coloured by their sampling probability (red unlikely → green certain), a bar where a
// turn's new prompt begins and a tick where its completion begins, a thick border where the
// policy version changes (new weights took over mid-sequence).
const heat = (logprob) => `hsl(${Math.round(120 * Math.exp(logprob))}, 75%, 78%)`;

function heatSwatch(logprob) {
  const swatch = h("i", { class: "swatch" });
  swatch.style.background = heat(logprob);  // CSSOM: the page's CSP refuses style attributes
  return swatch;
}

function tokenView(sequences) {
  return h("div", {}, sequences.map((s, k) => {
    const marks = new Map();
    for (const t of s.turns) { marks.set(t.prompt, "turn-start"); if (t.completion !== t.prompt) marks.set(t.completion, "completion-start"); }
    let version = null;
    const ids = s.ids.map((id, j) => {
      const classes = ["tok", s.mask[j] ? "sampled" : "prompt"];
      if (marks.has(j)) classes.push(marks.get(j));
      const v = s.policy[j];
      if (s.mask[j] && v !== null && version !== null && v !== version) classes.push("policy-change");
      if (s.mask[j] && v !== null) version = v;
      const lp = s.logprobs[j];
      const title = `#${j} id ${id}` + (s.mask[j] ? ` · sampled · logprob ${lp === null ? "not returned" : lp}` : " · prompt")
        + (v !== null ? ` · policy ${v}` : "");
      const text = s.texts ? s.texts[j] : null;  // whitespace made visible: a token is often one
      const el = h("span", { class: classes.join(" ") + (text === null ? "" : " text"), title, "data-j": j, "data-id": id },
        text === null ? String(id) : text.replace(/ /g, "·").replace(/\n/g, "↵"));
      if (s.mask[j] && lp !== null) el.style.background = heat(lp);
      return el;
    });
    const trained = s.mask.reduce((a, m) => a + m, 0);
    const head = `sequence ${k} · branch ${s.branch} (${s.reason || "?"})` + (s.drift ? " · after drift" : "")
      + ` · ${num(s.size)} ids, ${num(trained)} trained` + (s.size > s.ids.length ? ` (first ${num(s.ids.length)} shown)` : "");
    return h("div", { class: `sequence reason-${s.reason}${s.drift ? " drift" : ""}`, "data-branch": s.branch },
      h("div", { class: "sequence-head" }, head), h("div", { class: "token-ids" }, ids));
  }), h("div", { class: "legend-row" },
    h("span", { class: "legend" }, h("i", { class: "swatch tok prompt" }), "prompt (loss mask 0)"),
    h("span", { class: "legend" }, [-3, -1, 0].map(heatSwatch), "sampled, by probability (logprob -3, -1, 0)"),
    h("span", { class: "legend" }, "| turn's prompt, ⁞ its completion, ▌ new policy version")));
}

function scores(r) {
  const rewards = r.rewards.map((x) => h("tr", {}, h("td", {}, x.name), h("td", { class: "num" }, num(x.score, 4)),
    h("td", { class: "num" }, num(x.weight, 3))));
  const metrics = r.metrics.map((x) => h("tr", {}, h("td", {}, x.name), h("td", { class: "num" }, num(x.value, 4))));
  return h("div", { class: "columns" },
    rewards.length ? table(["reward", "score", "weight"].map((x) => h("th", {}, x)), rewards, { class: "grid small" }) : h("p", { class: "muted" }, "no rewards scored"),
    metrics.length ? table(["metric", "value"].map((x) => h("th", {}, x)), metrics, { class: "grid small" }) : h("p", { class: "muted" }, "no metrics"));
}

function timeline(timing, calls) {
  const total = timing.total || 0;
  if (!total) return h("p", { class: "muted" }, "no timing recorded");
  const place = (el, start, end) => {
    el.style.left = `${(100 * start) / total}%`;
    el.style.width = `${Math.max(0.3, (100 * (end - start)) / total)}%`;
    return el;
  };
  const spans = timing.spans.map((s) => place(h("div", { class: `span span-${s.name}`, title: `${s.name}: ${secs(s.duration)}` }),
    s.start, s.end ?? total));
  const callBars = calls.filter((c) => c.start !== null).map((c, i) => place(h("div", {
    class: c.error ? "span call failed" : "span call", title: `model call ${i + 1}: ${secs(c.duration)}` }), c.start, c.start + c.duration));
  const legend = timing.spans.map((s) => h("span", { class: "legend" }, h("i", { class: `swatch span-${s.name}` }), `${s.name} ${secs(s.duration)}`));
  return h("div", {},
    h("div", { class: "timeline" }, spans),
    callBars.length ? h("div", { class: "timeline calls" }, callBars) : null,
    h("div", { class: "legend-row" }, legend, h("span", { class: "legend" }, `agent split: model ${secs(timing.agent_model)}, harness ${secs(timing.agent_harness)}; total ${secs(total)}`)));
}

function callsTable(calls) {
  const rows = calls.map((c, i) => h("tr", { class: c.error ? "failed" : "" }, h("td", {}, i + 1), h("td", {}, c.model || "–"),
    h("td", {}, c.finish_reason || "–"), h("td", { class: "num" }, c.usage ? num(c.usage.input) : "–"),
    h("td", { class: "num" }, c.usage ? num(c.usage.output) : "–"), h("td", { class: "num" }, secs(c.duration)),
    h("td", {}, c.error ? `${c.error.type}: ${c.error.message}` : "")));
  return table(["#", "model", "finish", "in", "out", "time", "error"].map((x) => h("th", {}, x)), rows, { class: "grid small" });
}

function toolsTable(tools) {
  const rows = tools.map((t) => h("tr", { class: t.ok ? "" : "failed" }, h("td", {}, `${t.server}.${t.name}`),
    h("td", {}, h("pre", { class: "arguments" }, t.arguments)), h("td", {}, t.ok ? "ok" : t.error || "failed"),
    h("td", { class: "num" }, secs(t.duration))));
  return table(["tool", "arguments", "outcome", "time"].map((x) => h("th", {}, x)), rows, { class: "grid small" });
}

function siblingsTable(runId, currentId, group) {
  const rows = group.rows.map((s) => h("tr", { class: s.rollout_id === currentId ? "current sibling" : "sibling" },
    h("td", {}, h("a", { href: rolloutHref(runId, s.rollout_id) }, short(s.rollout_id))),
    h("td", {}, s.attempt ? `${s.sample_idx} (attempt ${s.attempt})` : s.sample_idx), h("td", {}, badge(s.ok)),
    h("td", { class: "num" }, num(s.reward, 4)), h("td", { class: "num advantage" }, num(s.advantage, 4)),
    h("td", {}, s.stop_condition || "–"), h("td", {}, s.error_type || "–")));
  const stats = h("p", { class: "muted" }, `mean reward of ok samples ${num(group.mean_reward, 4)}, std ${num(group.std_reward, 4)}`);
  return h("div", {}, table(["rollout", "sample", "ok", "reward", "advantage", "stop", "error"].map((x) => h("th", {}, x)),
    rows, { class: "grid small" }), stats);
}

window.addEventListener("hashchange", route);
route();

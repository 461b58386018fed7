// The Sluice console: a small single-page view over the HTTP API.
//
// Every call is a same-origin `fetch` with the header `X-Sluice-Console`:
// with it, the server accepts the session cookie set by the sign-in form
// (HttpOnly, SameSite=Strict: this script never sees the token). Views:
// `#/` pipelines, `#/p/NAME` one pipeline, `#/admin` the host (admin only).
// Charts are uPlot's (vendored, see assets/vendor/uplot).
"use strict";

const HEADERS = { "X-Sluice-Console": "1" };
const who = JSON.parse(document.getElementById("who").textContent);
const app = document.getElementById("app");
let timer = null;
let cleanup = [];

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

async function api(method, path, body, type) {
  const init = { method, headers: { ...HEADERS }, credentials: "same-origin" };
  if (body !== undefined) {
    init.body = body;
    init.headers["Content-Type"] = type || "application/json";
  }
  const r = await fetch(path, init);
  const text = await r.text();
  if (!r.ok) {
    let message = text;
    try {
      const e = JSON.parse(text).error;
      message = `${e.message} (${e.code})`;
    } catch (_) { /* not JSON */ }
    if (r.status === 401) location.reload();
    throw new Error(message);
  }
  return text ? JSON.parse(text) : null;
}

function rate(x) {
  if (x === undefined || x === null) return "–";
  if (x >= 1e6) return (x / 1e6).toFixed(1) + "M";
  if (x >= 1e3) return (x / 1e3).toFixed(1) + "k";
  return x >= 10 ? x.toFixed(0) : x.toFixed(1);
}

function age(ms) {
  if (ms === undefined || ms === null) return "–";
  const s = ms / 1000;
  if (s < 60) return s.toFixed(0) + " s ago";
  if (s < 3600) return (s / 60).toFixed(0) + " min ago";
  return (s / 3600).toFixed(1) + " h ago";
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + units[i];
}

function flash(text, kind = "error") {
  const m = el("div", { class: `message ${kind}` }, text);
  app.prepend(m);
  setTimeout(() => m.remove(), 8000);
}

function stateCell(s) {
  return el("td", { class: `state ${s}`, "data-state": s }, s);
}

// While an upgrade this console asked for runs, the pipeline answers 503
// `upgrading` to everything but its status: the views' polls and the
// output tail hold off until it is over (`quiet` is then null).
let quiet = null;

async function whileQuiet(f) {
  let done;
  quiet = new Promise((r) => { done = r; });
  try { return await f(); } finally { quiet = null; done(); }
}

function every(ms, f) {
  f();
  timer = setInterval(f, ms);
}

function leave() {
  if (timer) clearInterval(timer);
  timer = null;
  cleanup.forEach((f) => f());
  cleanup = [];
}

async function control(name, action) {
  try {
    if (action === "delete") {
      if (!confirm(`Delete pipeline ${name} and all its data?`)) return;
      await api("DELETE", `/pipelines/${name}`);
      location.hash = "#/";
    } else {
      await api("POST", `/pipelines/${name}/${action}`);
    }
  } catch (e) {
    flash(`${action} ${name}: ${e.message}`);
  }
}

function actionButtons(p) {
  return el("span", { class: "actions" },
    el("button", { onclick: () => control(p.name, "start"), "data-action": "start" }, "Start"),
    el("button", { onclick: () => control(p.name, "pause"), "data-action": "pause" }, "Pause"),
    el("button", { onclick: () => control(p.name, "stop"), "data-action": "stop" }, "Stop"),
    el("button", { class: "danger", onclick: () => control(p.name, "delete"), "data-action": "delete" }, "Delete"));
}

// ------------------------------------------------------------ pipelines --

function pipelinesView() {
  const body = el("tbody");
  const table = el("table", { id: "pipelines" },
    el("thead", {}, el("tr", {},
      el("th", {}, "Pipeline"), el("th", {}, "State"), el("th", { class: "num" }, "W"),
      el("th", { class: "num" }, "Steps/s"), el("th", { class: "num" }, "In/s"),
      el("th", { class: "num" }, "Out/s"), el("th", { class: "num" }, "Input lag"),
      el("th", {}, "Checkpoint"), el("th", {}, "Last error"), el("th", {}, ""))),
    body);
  const components = el("tbody");
  app.replaceChildren(
    el("h2", {}, "Pipelines"),
    el("div", { class: "card" }, table),
    deployCard(),
    el("div", { class: "card" }, el("h3", {}, "Components"),
      el("table", { id: "components" }, el("thead", {}, el("tr", {},
        el("th", {}, "Name"), el("th", {}, "SHA-256"), el("th", { class: "num" }, "Size"))), components)));
  every(1000, async () => {
    try {
      const list = await api("GET", "/pipelines");
      list.sort((a, b) => a.name.localeCompare(b.name));
      body.replaceChildren(...(list.length ? list.map((p) => el("tr", { "data-pipeline": p.name },
        el("td", {}, el("a", { href: `#/p/${p.name}` }, p.name)),
        stateCell(p.state),
        el("td", { class: "num" }, p.workers),
        el("td", { class: "num" }, rate(p.steps_per_sec)),
        el("td", { class: "num" }, rate(p.events_in_per_sec)),
        el("td", { class: "num" }, rate(p.events_out_per_sec)),
        el("td", { class: "num" }, p.input_lag),
        el("td", { title: p.checkpoints_behind || "" }, (p.last_checkpoint === null ? "none" : `step ${p.last_checkpoint}, ${age(p.last_checkpoint_age_ms)}`) + (p.checkpoints_behind ? " (behind)" : "")),
        el("td", { class: "err" }, p.last_error || ""),
        el("td", {}, actionButtons(p)))) : [el("tr", {}, el("td", { colspan: 10, class: "muted" }, "No pipelines yet: deploy one below."))]));
      const comps = await api("GET", "/components");
      components.replaceChildren(...comps.map((c) => el("tr", {},
        el("td", {}, c.name), el("td", { class: "muted" }, c.hash.slice(0, 16) + "…"), el("td", { class: "num" }, bytes(c.size)))));
    } catch (e) {
      flash(e.message);
    }
  });
}

function deployCard() {
  const file = el("input", { type: "file", name: "component", accept: ".wasm", required: "" });
  const name = el("input", { name: "name", placeholder: "wordcount", required: "", pattern: "[a-z0-9][a-z0-9_\\-]{0,63}" });
  const workers = el("input", { name: "workers", type: "number", min: "1", value: "1", style: "width:5em" });
  const form = el("form", { class: "inline", id: "deploy" },
    el("label", {}, "Component (.wasm)", file),
    el("label", {}, "Pipeline name", name),
    el("label", {}, "Workers", workers),
    el("button", { class: "primary", type: "submit" }, "Deploy"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = file.files[0];
    if (!f) return;
    const button = form.querySelector("button");
    button.disabled = true;
    try {
      await api("PUT", `/components/${name.value}`, await f.arrayBuffer(), "application/wasm");
      await api("POST", "/pipelines", JSON.stringify({ name: name.value, component: name.value, workers: Number(workers.value) }));
      flash(`Deployed ${name.value}.`, "info");
      form.reset();
    } catch (e) {
      flash(`deploy: ${e.message}`);
    } finally {
      button.disabled = false;
    }
  });
  return el("div", { class: "card" }, el("h3", {}, "Deploy a component"), form);
}

// -------------------------------------------------------------- upgrade --

// A new version of the pipeline's circuit: compared first (the server's
// diff, operator by operator), switched to only after the diff accepts it
// and the user confirms.
function upgradeCard(pipeline) {
  const file = el("input", { type: "file", accept: ".wasm", id: "upgrade-file" });
  const name = el("input", { id: "upgrade-name", placeholder: "wordcount-v2", pattern: "[a-z0-9][a-z0-9_\\-]{0,63}" });
  const startEmpty = el("input", { id: "upgrade-start-empty", placeholder: "ID,ID…" });
  // A pipeline created with "retain_input" can have its state rebuilt
  // from all its input instead (every operator; none starts empty).
  const rebuild = el("input", { type: "checkbox", id: "upgrade-rebuild" });
  const result = el("div", { id: "upgrade-diff" });
  const go = el("button", { class: "primary", type: "button", id: "upgrade-go", disabled: "" }, "Upgrade");
  let compared = null;
  file.addEventListener("change", () => {
    const f = file.files[0];
    if (f && !name.value) name.value = f.name.replace(/\.wasm$/, "").toLowerCase().replace(/[^a-z0-9_-]/g, "-");
    go.disabled = true;
    result.replaceChildren();
  });
  startEmpty.addEventListener("input", () => { go.disabled = true; });
  rebuild.addEventListener("change", () => { go.disabled = true; });
  const compare = async (ev) => {
    ev.preventDefault();
    go.disabled = true;
    const f = file.files[0];
    if (!f) return flash("upgrade: choose the new version's component (.wasm) first");
    try {
      const list = startEmpty.value.split(",").map((s) => s.trim()).filter((s) => s);
      const params = [];
      if (list.length) params.push(`start_empty=${encodeURIComponent(list.join(","))}`);
      if (rebuild.checked) params.push("rebuild=true");
      const query = params.length ? `?${params.join("&")}` : "";
      const bytes = await f.arrayBuffer();
      const d = await api("POST", `/pipelines/${pipeline}/diff${query}`, bytes, "application/wasm");
      const ports = [];
      if (d.ports.outputs_added.length) ports.push(`outputs added: ${d.ports.outputs_added.join(", ")}`);
      if (d.ports.outputs_removed.length) ports.push(`outputs removed: ${d.ports.outputs_removed.join(", ")}`);
      result.replaceChildren(
        el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "Operator"), el("th", {}, "Change"), el("th", {}, "What the upgrade does"))),
          el("tbody", {}, ...d.operators.map((o) => el("tr", { "data-operator": o.id, "data-change": o.change },
            el("td", {}, o.id), el("td", {}, o.change), el("td", {}, o.action))))),
        ports.length ? el("p", {}, ports.join("; ")) : null,
        el("p", { id: "upgrade-verdict", "data-accepted": String(d.accepted) },
          d.accepted ? "The upgrade would be accepted." : "The upgrade would be refused: start the changed operators empty, or keep them as they were."));
      compared = { bytes, list, rebuild: rebuild.checked };
      go.disabled = !d.accepted;
    } catch (e) { flash(`diff: ${e.message}`); }
  };
  go.addEventListener("click", async () => {
    if (!compared || !name.value) return flash("upgrade: name the new version's component");
    if (!confirm(`Upgrade pipeline ${pipeline} to ${name.value}? It checkpoints, and the new version takes the state the diff shows.`)) return;
    go.disabled = true;
    try {
      await api("PUT", `/components/${name.value}`, compared.bytes, "application/wasm");
      await whileQuiet(() => api("PATCH", `/pipelines/${pipeline}`,
        JSON.stringify({ component: name.value, start_empty: compared.list, rebuild: compared.rebuild })));
      flash(`Upgraded ${pipeline} to ${name.value}.`, "info");
      result.replaceChildren();
    } catch (e) { flash(`upgrade: ${e.message}`); }
  });
  return el("div", { class: "card", id: "upgrade" }, el("h3", {}, "Upgrade to a new version"),
    el("form", { class: "inline", onsubmit: compare },
      el("label", {}, "New version (.wasm)", file),
      el("label", {}, "Component name", name),
      el("label", {}, "Start empty", startEmpty),
      el("label", {}, rebuild, " Rebuild from retained input"),
      el("button", { type: "submit", id: "upgrade-compare" }, "Compare"), go),
    result);
}

// ------------------------------------------------------------- pipeline --

// The time window every chart shows: the samples' (so a chart with one
// point, such as the checkpoints', lines up with the others).
let window_ = null;

function chart(target, title, series, opts = {}) {
  const width = Math.max(320, target.clientWidth || 420);
  const u = new uPlot({
    title, width, height: 190,
    scales: { x: { time: true, range: (u, min, max) => window_ || [min - 1, max + 1] } },
    series: [{}, ...series.map((s) => ({ label: s.label, stroke: s.color, width: 2, points: { show: !!opts.points } }))],
    axes: [{}, { size: 60 }],
  }, [[], ...series.map(() => [])], target);
  cleanup.push(() => u.destroy());
  return u;
}

function pipelineView(name) {
  const title = el("h2", {}, "Pipeline ", el("span", { id: "name" }, name), " ");
  const figures = el("div", { class: "figures" });
  const charts = el("div", { class: "grid" });
  const slots = [0, 1, 2, 3].map(() => el("div", { class: "card chart" }));
  charts.append(...slots);
  const workers = el("tbody");
  const checkpoints = el("tbody");
  const tail = el("pre", { class: "tail", id: "tail" });
  const port = el("select", { id: "tail-port" });
  const pushPort = el("select", { id: "push-port" });
  const pushText = el("textarea", { id: "push-text", placeholder: '"one line of JSON per event"' });
  const scaleTo = el("input", { type: "number", min: "1", style: "width:5em", id: "scale-to" });
  app.replaceChildren(
    el("p", {}, el("a", { href: "#/" }, "← Pipelines")),
    title,
    el("div", { class: "card" }, figures),
    charts,
    el("div", { class: "grid" },
      el("div", { class: "card" }, el("h3", {}, "Workers"),
        el("table", { id: "workers" }, el("thead", {}, el("tr", {},
          el("th", {}, "Worker"), el("th", { class: "num" }, "Shards"), el("th", { class: "num" }, "Partitions"),
          el("th", { class: "num" }, "Lag"), el("th", {}, ""))), workers),
        el("form", { class: "inline", style: "margin-top:1em", onsubmit: async (ev) => {
          ev.preventDefault();
          try {
            await api("PATCH", `/pipelines/${name}`, JSON.stringify({ workers: Number(scaleTo.value) }));
            flash(`Rescaling to ${scaleTo.value} workers.`, "info");
          } catch (e) { flash(`scale: ${e.message}`); }
        } }, el("label", {}, "Workers", scaleTo), el("button", { type: "submit" }, "Rescale"))),
      el("div", { class: "card" }, el("h3", {}, "Checkpoints"),
        el("table", { id: "checkpoints" }, el("thead", {}, el("tr", {},
          el("th", { class: "num" }, "Step"), el("th", {}, "When"), el("th", { class: "num" }, "Pause"),
          el("th", { class: "num" }, "With write"))), checkpoints))),
    el("div", { class: "grid" },
      el("div", { class: "card" }, el("h3", {}, "Output (live)"), el("p", {}, el("label", {}, "Port", port)), tail),
      el("div", { class: "card" }, el("h3", {}, "Push input"),
        el("form", { id: "push", onsubmit: async (ev) => {
          ev.preventDefault();
          try {
            const ack = await api("POST", `/pipelines/${name}/input/${pushPort.value}`, pushText.value, "application/x-ndjson");
            flash(`Appended ${ack.events} events.`, "info");
            pushText.value = "";
          } catch (e) { flash(`push: ${e.message}`); }
        } }, el("p", {}, el("label", {}, "Port", pushPort)), pushText,
          el("p", {}, el("button", { class: "primary", type: "submit" }, "Push"))))),
    upgradeCard(name));
  let plots = null;
  let streaming = null;
  const stream = (p) => {
    if (streaming === p) return;
    streaming = p;
    tail.textContent = "";
    const abort = new AbortController();
    cleanup.push(() => abort.abort());
    tailStream(`/pipelines/${name}/output/${p}/stream`, abort.signal, (id, data) => {
      tail.textContent += `${id}  ${data}\n`;
      const lines = tail.textContent.split("\n");
      if (lines.length > 400) tail.textContent = lines.slice(-400).join("\n");
      tail.scrollTop = tail.scrollHeight;
    });
  };
  port.addEventListener("change", () => stream(port.value));
  every(1000, async () => {
    if (quiet) return;
    try {
      const s = await api("GET", `/pipelines/${name}`);
      title.replaceChildren("Pipeline ", el("span", { id: "name" }, s.name), " ",
        el("span", { class: `state ${s.state}`, id: "state", "data-state": s.state }, s.state), " ", actionButtons(s));
      // Upgraded by someone else: the figures wait for the new version.
      if (s.state === "upgrading") return;
      const m = await api("GET", `/pipelines/${name}/metrics`);
      const fig = (label, value, id) => el("div", { class: "figure" }, el("div", { class: "value", id }, value), el("div", { class: "label" }, label));
      figures.replaceChildren(
        fig("workers", s.workers, "fig-workers"), fig("steps", s.steps, "fig-steps"),
        fig("events in", s.events_in, "fig-in"), fig("events out", s.events_out, "fig-out"),
        fig("dead letters", s.dead_letters || 0, "fig-dead-letters"),
        fig("in / s", rate(s.events_in_per_sec), "fig-in-rate"), fig("input lag", s.input_lag, "fig-lag"),
        fig("last checkpoint", (s.last_checkpoint === null ? "none" : `step ${s.last_checkpoint}`) + (s.checkpoints_behind ? " — behind: " + s.checkpoints_behind : ""), "fig-checkpoint"),
        fig("component", s.component_hash.slice(0, 12), "fig-component"),
        // Across hosts with replicas: each worker's replica set (the
        // primary, which commits, first) and the failovers so far.
        ...(s.hosts && s.hosts.replicas && s.hosts.replicas.length
          ? [fig("replicas (primary first)", s.hosts.replicas.map((on, w) => `w${w}: ${on.join(", ")}`).join("; "), "fig-replicas"),
             fig("failovers / checked", `${s.hosts.failovers} / ${s.hosts.replica_steps_checked}`, "fig-failovers"),
             // Whose output each worker's steps committed, from which step.
             ...(s.hosts.committed_by && s.hosts.committed_by.length
               ? [fig("committed by", s.hosts.committed_by.slice(-3).map((c) => `from step ${c.from_step}: ${c.hosts.map((h, w) => `w${w} ${h}`).join(", ")}`).join("; "), "fig-committed-by")]
               : [])]
          : []));
      if (!scaleTo.value) scaleTo.value = s.workers;
      if (!port.options.length) {
        s.outputs.forEach((o) => port.append(el("option", { value: o }, o)));
        s.inputs.forEach((i) => pushPort.append(el("option", { value: i }, i)));
        if (s.outputs.length) stream(s.outputs[0]);
      }
      if (!plots) {
        plots = [
          chart(slots[0], "Events / s", [{ label: "in", color: "#2458d4" }, { label: "out", color: "#11803c" }]),
          chart(slots[1], "Input lag (events)", [{ label: "lag", color: "#a86400" }]),
          chart(slots[2], "Step time (ms)", [{ label: "p50", color: "#2458d4" }, { label: "p99", color: "#b42318" }]),
          chart(slots[3], "Checkpoint pause (ms)", [{ label: "pause", color: "#6941c6" }, { label: "with write", color: "#98a2b3" }], { points: true }),
        ];
      }
      const t = m.samples.map((x) => x.t_ms / 1000);
      window_ = t.length > 1 ? [t[0], t[t.length - 1]] : null;
      plots[0].setData([t, m.samples.map((x) => x.events_in_per_sec), m.samples.map((x) => x.events_out_per_sec)]);
      plots[1].setData([t, m.samples.map((x) => x.input_lag)]);
      plots[2].setData([t, m.samples.map((x) => x.step_p50_ms), m.samples.map((x) => x.step_p99_ms)]);
      plots[3].setData([m.checkpoints.map((c) => c.at_ms / 1000), m.checkpoints.map((c) => c.pause_ms), m.checkpoints.map((c) => c.total_ms)]);
      slots[0].dataset.samples = String(m.samples.length);
      const maxLag = Math.max(1, ...m.workers.map((w) => w.lag));
      workers.replaceChildren(...m.workers.map((w) => el("tr", {},
        el("td", {}, w.worker), el("td", { class: "num" }, w.shards), el("td", { class: "num" }, w.partitions),
        el("td", { class: "num" }, w.lag),
        el("td", { style: "width:40%" }, el("div", { class: "bar" }, el("div", { style: `width:${(100 * w.lag) / maxLag}%` }))))));
      checkpoints.replaceChildren(...m.checkpoints.slice(-8).reverse().map((c) => el("tr", {},
        el("td", { class: "num" }, c.step), el("td", {}, age(Date.now() - c.at_ms)),
        el("td", { class: "num" }, c.pause_ms.toFixed(1) + " ms"), el("td", { class: "num" }, c.total_ms.toFixed(1) + " ms"))));
    } catch (e) {
      flash(e.message);
    }
  });
}

// Server-sent events over fetch (EventSource cannot send the console's
// header): calls `on(id, data)` per event until `signal` aborts.
async function tailStream(path, signal, on) {
  let last = null;
  while (!signal.aborted) {
    if (quiet) await quiet;
    try {
      const headers = { ...HEADERS };
      if (last) headers["Last-Event-ID"] = last;
      const r = await fetch(path, { headers, signal, credentials: "same-origin" });
      if (!r.ok) throw new Error(`stream: ${r.status}`);
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, i);
          buf = buf.slice(i + 2);
          let id = null, data = [];
          for (const line of block.split("\n")) {
            if (line.startsWith("id:")) id = line.slice(3).trim();
            else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
          }
          if (data.length) { last = id; on(id, data.join("\n")); }
        }
      }
    } catch (e) {
      if (signal.aborted) return;
    }
    await new Promise((r) => setTimeout(r, 1000));
  }
}

// ---------------------------------------------------------------- admin --

function adminView() {
  const host = el("div", { class: "figures" });
  const tenants = el("tbody");
  app.replaceChildren(
    el("h2", {}, "Host"),
    el("div", { class: "card" }, host),
    el("div", { class: "card" }, el("h3", {}, "Tenants"),
      el("table", { id: "tenants" }, el("thead", {}, el("tr", {},
        el("th", {}, "Tenant"), el("th", { class: "num" }, "Pipelines"), el("th", {}, "Disk"),
        el("th", {}, ""), el("th", {}, "Memory promised"), el("th", {}, "Host memory"))), tenants)));
  every(2000, async () => {
    try {
      const u = await api("GET", "/tenants");
      const fig = (label, value) => el("div", { class: "figure" }, el("div", { class: "value" }, value), el("div", { class: "label" }, label));
      host.replaceChildren(
        fig("memory promised / budget", `${bytes(u.memory_promised_bytes)} / ${bytes(u.memory_budget_bytes)}`),
        fig("server resident (heap in use)", `${bytes(u.resident_bytes)} (${bytes(u.heap_in_use_bytes)})`),
        fig("host memory besides instances (databases, pushes)", bytes(u.host_memory_bytes)),
        fig("instances promised", u.pool_instances === null ? `${u.instances_promised}` : `${u.instances_promised} / ${u.pool_instances}`),
        fig("disk free / total", `${bytes(u.disk_free_bytes)} / ${bytes(u.disk_total_bytes)}`),
        fig("tenants", u.tenants.length));
      tenants.replaceChildren(...u.tenants.map((t) => el("tr", { "data-tenant": t.name },
        el("td", {}, t.name),
        el("td", { class: "num" }, `${t.pipelines} / ${t.limits.max_pipelines}`),
        el("td", {}, `${bytes(t.disk_used_bytes)} / ${bytes(t.disk_quota_bytes)}`),
        el("td", { style: "width:25%" }, el("div", { class: "bar" }, el("div", { style: `width:${Math.min(100, (100 * t.disk_used_bytes) / Math.max(1, t.disk_quota_bytes))}%` }))),
        el("td", {}, bytes(t.memory_promised_bytes)),
        el("td", {}, bytes(t.host_memory_bytes)))));
    } catch (e) {
      flash(e.message);
    }
  });
}

// --------------------------------------------------------------- routing --

function route() {
  leave();
  const hash = location.hash || "#/";
  document.querySelectorAll("header nav a").forEach((a) => a.classList.toggle("active", a.getAttribute("href") === hash));
  if (who.admin) {
    adminView();
  } else if (hash.startsWith("#/p/")) {
    pipelineView(decodeURIComponent(hash.slice(4)));
  } else {
    pipelinesView();
  }
}

window.addEventListener("hashchange", route);
route();

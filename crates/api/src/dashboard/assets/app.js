// tandem's dashboard: a few views over the JSON API, built node by node (data is never parsed as
// HTML). The API key stays in this tab's sessionStorage and goes out as a Bearer header, so no
// cookie is ever sent on the user's behalf (no CSRF to defend against).
import { extent, scale, ticks, linePath, nearest } from "./chart.js";

const KEY = "tandem-api-key";
const main = document.getElementById("main");
let refresh = null; // the timer of a live view
let generation = 0; // bumped by each navigation: a view whose number is stale stops writing
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

const key = () => sessionStorage.getItem(KEY);

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== false && v !== null && v !== undefined) e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function svg(tag, attrs = {}, ...children) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function errorText(body, status) {
  const d = body && body.detail;
  if (typeof d === "string") return d;
  if (Array.isArray(d) && d[0] && d[0].msg) return d[0].msg;
  if (body && body.error && body.error.message) return body.error.message;
  return `HTTP ${status}`;
}

class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

async function api(path, method = "GET", body = undefined) {
  const headers = { Authorization: `Bearer ${key()}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const answer = await r.json().catch(() => null);
  if (r.status === 401) throw new ApiError("This API key was not accepted.", 401);
  if (!r.ok) throw new ApiError(errorText(answer, r.status), r.status);
  return answer;
}

function show(...nodes) {
  if (refresh) clearTimeout(refresh);
  refresh = null;
  main.replaceChildren(...nodes);
}

function signOut() {
  sessionStorage.removeItem(KEY);
  route();
}

function signIn(why = "") {
  const input = el("input", { id: "key", type: "password", autocomplete: "off", required: true, spellcheck: "false" });
  const status = el("p", { class: "error", role: "alert" }, why);
  const form = el(
    "form",
    {
      class: "signin",
      onsubmit: async (ev) => {
        ev.preventDefault();
        sessionStorage.setItem(KEY, input.value.trim());
        try {
          await api("/v1/preview/models?limit=1");
          route();
        } catch (e) {
          sessionStorage.removeItem(KEY);
          status.textContent = e.message;
        }
      },
    },
    el("h1", {}, "Sign in"),
    el("label", { for: "key" }, "API key (printed by `make run`, kept in this tab only)"),
    input,
    el("button", { class: "primary", type: "submit" }, "Sign in"),
    status,
  );
  show(form);
  input.focus();
}

async function models(after, gen) {
  const q = new URLSearchParams({ limit: "50" });
  if (after) q.set("after", after);
  const page = await api(`/v1/preview/models?${q}`);
  if (gen !== generation) return;
  const filter = el("input", { type: "search", id: "filter", placeholder: "name or project" });
  const rows = page.data.map((m) =>
    el("tr", { "data-text": `${m.project}/${m.name}`.toLowerCase() },
      el("td", {}, el("a", { href: `#/models/${m.id}` }, m.name)),
      el("td", {}, m.project),
      el("td", {}, m.base_model),
      el("td", {}, m.created_at || "")),
  );
  filter.addEventListener("input", () => {
    const f = filter.value.toLowerCase();
    for (const r of rows) r.hidden = !r.dataset.text.includes(f);
  });
  const last = page.data[page.data.length - 1];
  show(
    el("h1", {}, "Models"),
    el("div", { class: "toolbar" }, el("label", { for: "filter" }, "Filter"), filter),
    el("div", { class: "table-wrap" },
      el("table", {},
        el("thead", {}, el("tr", {}, ["Name", "Project", "Base model", "Created"].map((h) => el("th", { scope: "col" }, h)))),
        el("tbody", {}, rows))),
    page.data.length === 0 ? el("p", {}, "No models yet: ART's ServerlessBackend creates one when it registers a model.") : "",
    el("p", {},
      after ? el("a", { href: "#/" }, "First page") : "",
      after && page.has_more ? " · " : "",
      page.has_more && last ? el("a", { href: `#/?after=${last.id}` }, "Next page") : ""),
  );
}

const W = 480;
const H = 220;
const PAD = { l: 48, r: 10, t: 10, b: 26 };

function chart(series, checkpoints, xMode) {
  const pts = series.points.map((p) => ({
    x: xMode === "time" ? p.time_ms : p.step, y: p.value, min: p.min, max: p.max, count: p.count, step: p.step,
  }));
  // Points come in step order; over time (a deleted checkpoint's step is written again) that
  // order can go back, so the line is drawn in the order of the x-axis.
  pts.sort((a, b) => a.x - b.x);
  const [x0, x1] = extent(pts.map((p) => p.x));
  const [y0, y1] = extent(pts.flatMap((p) => [p.min, p.max]));
  const sx = scale([x0, x1], [PAD.l, W - PAD.r]);
  const sy = scale([y0, y1], [H - PAD.b, PAD.t]);
  const g = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `${series.key}: ${pts.length} points` });
  g.append(svg("line", { class: "axis", x1: PAD.l, y1: H - PAD.b, x2: W - PAD.r, y2: H - PAD.b }));
  for (const t of ticks(y0, y1, 4)) {
    g.append(svg("line", { class: "axis", x1: PAD.l, y1: sy(t), x2: W - PAD.r, y2: sy(t), "stroke-opacity": "0.4" }));
    g.append(svg("text", { x: PAD.l - 4, y: sy(t) + 4, "text-anchor": "end" }, Number(t.toPrecision(4))));
  }
  if (xMode === "step") {
    // Steps are whole numbers: no tick between two of them.
    for (const t of ticks(x0, x1, 6).filter(Number.isInteger)) {
      g.append(svg("text", { x: sx(t), y: H - 8, "text-anchor": "middle" }, t));
    }
    for (const c of checkpoints) {
      if (c.step >= x0 && c.step <= x1) g.append(svg("line", { class: "ckpt", x1: sx(c.step), y1: PAD.t, x2: sx(c.step), y2: H - PAD.b }));
    }
  } else {
    g.append(svg("text", { x: W - PAD.r, y: H - 8, "text-anchor": "end" }, new Date(x1).toLocaleString()));
  }
  if (pts.some((p) => p.count > 1)) {
    const upper = pts.map((p) => ({ x: p.x, y: p.max }));
    const lower = pts.map((p) => ({ x: p.x, y: p.min })).reverse();
    g.append(svg("path", { class: "band", d: `${linePath(upper, sx, sy)} ${linePath(lower, sx, sy).replace(/^M/, "L")} Z` }));
  }
  g.append(svg("path", { class: "line", d: linePath(pts, sx, sy) }));
  // A few points (or one, which a line cannot show) are marked one by one.
  if (pts.length <= 60) {
    for (const p of pts) g.append(svg("circle", { class: "dot", cx: sx(p.x), cy: sy(p.y), r: 2.5 }));
  }
  const cursor = svg("circle", { r: 4, fill: "#0b5cad", visibility: "hidden" });
  g.append(cursor);
  const readout = el("p", { class: "readout", "aria-live": "polite" }, `${series.total} ${series.total === 1 ? "observation" : "observations"}`);
  let at = pts.length - 1;
  let shown = false;
  const read = (p) => {
    if (!p) return;
    shown = true;
    cursor.setAttribute("cx", sx(p.x));
    cursor.setAttribute("cy", sy(p.y));
    cursor.setAttribute("visibility", "visible");
    const where = xMode === "time" ? new Date(p.x).toLocaleString() : `step ${Number(p.step.toFixed(2))}`;
    const spread = p.count > 1 ? ` (mean of ${p.count}, ${Number(p.min.toPrecision(4))} to ${Number(p.max.toPrecision(4))})` : "";
    readout.textContent = `${where}: ${Number(p.y.toPrecision(5))}${spread}`;
  };
  g.addEventListener("pointermove", (ev) => {
    const box = g.getBoundingClientRect();
    const x = ((ev.clientX - box.left) / box.width) * W;
    const p = nearest(pts, scale([PAD.l, W - PAD.r], [x0, x1])(x));
    at = pts.indexOf(p);
    read(p);
  });
  const fig = el("figure", {
    tabindex: "0",
    onkeydown: (ev) => {
      if (ev.key === "ArrowLeft" || ev.key === "ArrowRight") {
        ev.preventDefault();
        // The first key shows the newest point; later ones step from the one shown.
        if (shown) at = Math.max(0, Math.min(pts.length - 1, at + (ev.key === "ArrowLeft" ? -1 : 1)));
        read(pts[at]);
      }
    },
  }, el("figcaption", {}, series.key), g, readout);
  return fig;
}

/** Reads an OpenAI chat stream, calling `onText` with each content delta; resolves at [DONE]. */
async function streamChat(body, onText) {
  const r = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: { Authorization: `Bearer ${key()}`, "Content-Type": "application/json" },
    body: JSON.stringify({ ...body, stream: true }),
  });
  if (!r.ok) {
    const answer = await r.json().catch(() => null);
    throw new ApiError(errorText(answer, r.status), r.status);
  }
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        const text = chunk.choices && chunk.choices[0] && chunk.choices[0].delta && chunk.choices[0].delta.content;
        if (text) onText(text);
      }
    }
  }
}

/** Chat with the base model or any checkpoint, streamed; a second model answers side by side. */
function playground(model, steps) {
  const address = `wandb-artifact:///${model.entity}/${model.project}/${model.name}`;
  const choices = [[model.base_model, `base model (${model.base_model})`], [address, "latest checkpoint"],
    ...steps.map((s) => [`${address}:step${s}`, `step ${s}`])];
  const select = (id, first) => el("select", { id },
    ...(first ? [] : [el("option", { value: "" }, "none")]),
    ...choices.map(([v, label]) => el("option", { value: v }, label)));
  const a = select("pg-a", true);
  const b = select("pg-b", false);
  const system = el("textarea", { id: "pg-system", rows: "2" });
  const prompt = el("textarea", { id: "pg-prompt", rows: "3", required: true });
  const temperature = el("input", { id: "pg-temperature", type: "number", min: "0", max: "2", step: "any", value: "0.7" });
  const topP = el("input", { id: "pg-top-p", type: "number", min: "0.01", max: "1", step: "any", value: "1" });
  const maxTokens = el("input", { id: "pg-max-tokens", type: "number", min: "1", max: "2048", step: "1", value: "128" });
  const outA = el("pre", { class: "answer", "aria-live": "polite", id: "pg-out-a" });
  const outB = el("pre", { class: "answer", "aria-live": "polite", id: "pg-out-b" });
  const status = el("p", { class: "error", role: "alert" });
  const send = el("button", { class: "primary", type: "submit" }, "Send");
  const form = el("form", {
    class: "playground",
    onsubmit: async (ev) => {
      ev.preventDefault();
      status.textContent = "";
      send.disabled = true;
      const messages = [...(system.value.trim() ? [{ role: "system", content: system.value }] : []),
        { role: "user", content: prompt.value }];
      const params = { messages, temperature: Number(temperature.value), top_p: Number(topP.value),
        max_tokens: Number(maxTokens.value) };
      const run = (target, out) => {
        out.textContent = "";
        return target ? streamChat({ model: target, ...params }, (t) => out.append(t)) : Promise.resolve();
      };
      try {
        await Promise.all([run(a.value, outA), run(b.value, outB)]);
      } catch (e) {
        status.textContent = e.message;
      } finally {
        send.disabled = false;
      }
    },
  },
  el("div", { class: "toolbar" }, el("label", { for: "pg-a" }, "Model"), a, el("label", { for: "pg-b" }, "side by side with"), b),
  el("label", { for: "pg-system" }, "System prompt"), system,
  el("label", { for: "pg-prompt" }, "Message"), prompt,
  el("div", { class: "toolbar" },
    el("label", { for: "pg-temperature" }, "temperature"), temperature,
    el("label", { for: "pg-top-p" }, "top_p"), topP,
    el("label", { for: "pg-max-tokens" }, "max tokens"), maxTokens, send),
  status,
  el("div", { class: "answers" }, outA, outB));
  return form;
}

function seconds(a, b) {
  return a && b ? `${Math.round((Date.parse(b) - Date.parse(a)) / 100) / 10} s` : "";
}

/** One job: its state, and a cancel button while it is queued or running. */
function jobRow(j, changed) {
  const live = j.status === "queued" || j.status === "running";
  const status = el("td", {}, j.status);
  if (j.error_message) status.append(el("details", {}, el("summary", {}, "error"), el("pre", {}, j.error_message)));
  const cancel = live
    ? el("button", {
      type: "button",
      onclick: async (ev) => {
        if (!confirm(`Cancel this ${j.kind} job?`)) return;
        ev.target.disabled = true;
        try {
          await api(`/v1/preview/training-jobs/${j.id}/cancel`, "POST");
        } finally {
          changed();
        }
      },
    }, "Cancel")
    : "";
  return el("tr", {},
    el("td", {}, j.kind), status, el("td", {}, j.step ?? ""),
    el("td", {}, j.created_at ? new Date(j.created_at).toLocaleString() : ""),
    el("td", {}, seconds(j.started_at, j.finished_at)), el("td", {}, cancel));
}

function ordered(series) {
  const rank = (k) => (k.endsWith("/reward") ? 0 : k.startsWith("training/") ? 1 : 2);
  return [...series].sort((a, b) => rank(a.key) - rank(b.key) || a.key.localeCompare(b.key));
}

async function model(id, gen) {
  const m = await api(`/v1/preview/models/${id}`);
  if (gen !== generation) return;
  let xMode = "step";
  const charts = el("div", { class: "charts" });
  const more = el("div", { class: "charts" });
  const ckpts = el("tbody");
  const jobs = el("tbody");
  const playgroundSlot = el("div");
  let playgroundSteps = null;
  const updated = el("span", { class: "readout" });
  const draw = async () => {
    const h = await api(`/v1/preview/models/${id}/history?max_points=400`);
    if (gen !== generation) return;
    const primary = [];
    const rest = [];
    for (const s of ordered(h.series)) {
      const first = s.key.endsWith("/reward") || ["training/loss", "training/entropy", "training/grad_norm"].includes(s.key);
      (first ? primary : rest).push(chart(s, h.checkpoints, xMode));
    }
    charts.replaceChildren(...(primary.length ? primary : [el("p", {}, "Nothing logged yet.")]));
    more.replaceChildren(...rest);
    ckpts.replaceChildren(...[...h.checkpoints].reverse().map((c) =>
      el("tr", {}, el("td", {}, c.step), el("td", {}, new Date(c.time_ms).toLocaleString()),
        el("td", {}, el("button", {
          type: "button",
          "aria-label": `Delete checkpoint ${c.step}`,
          onclick: async (ev) => {
            if (!confirm(`Delete checkpoint ${c.step}? Its adapter files are removed and it is no longer served.`)) return;
            ev.target.disabled = true;
            try {
              await api(`/v1/preview/models/${id}/checkpoints`, "DELETE", { steps: [c.step] });
            } catch (e) {
              updated.textContent = `could not delete: ${e.message}`;
            }
            draw().catch(failed);
          },
        }, "Delete")))));
    // The playground is rebuilt only when the checkpoints change (never under the user's typing).
    const steps = h.checkpoints.map((c) => c.step).reverse();
    if (JSON.stringify(steps) !== playgroundSteps) {
      playgroundSteps = JSON.stringify(steps);
      playgroundSlot.replaceChildren(playground(m, steps));
    }
    const js = await api(`/v1/preview/models/${id}/training-jobs?order=desc&limit=20`);
    if (gen !== generation) return;
    jobs.replaceChildren(...js.data.map((j) => jobRow(j, () => draw().catch(failed))));
    updated.textContent = `${h.truncated ? "truncated history; " : ""}updated ${new Date().toLocaleTimeString()}`;
  };
  const failed = (e) => {
    if (e.status === 401) return route();
    updated.textContent = `could not refresh: ${e.message}`;
  };
  const xSelect = el("select", { id: "xaxis", onchange: () => { xMode = xSelect.value; draw().catch(failed); } },
    el("option", { value: "step" }, "training step"), el("option", { value: "time" }, "time"));
  show(
    el("h1", {}, `${m.project} / ${m.name}`),
    el("p", {}, `Base model ${m.base_model} · served as `, el("code", {}, `wandb-artifact:///${m.entity}/${m.project}/${m.name}`)),
    el("div", { class: "toolbar" }, el("label", { for: "xaxis" }, "x-axis"), xSelect, updated),
    charts,
    el("details", {}, el("summary", {}, "More metrics"), more),
    el("h2", {}, "Playground"),
    playgroundSlot,
    el("h2", {}, "Training jobs (newest 20)"),
    el("div", { class: "table-wrap" },
      el("table", {}, el("thead", {}, el("tr", {}, ["Kind", "Status", "Step", "Created", "Duration", "Action"].map((h) => el("th", { scope: "col" }, h)))), jobs)),
    el("h2", {}, "Checkpoints"),
    el("div", { class: "table-wrap" },
      el("table", {}, el("thead", {}, el("tr", {}, ["Step", "Created", "Action"].map((h) => el("th", { scope: "col" }, h)))), ckpts)),
  );
  await draw();
  // Live: the curves follow a running job. One read at a time (the next is scheduled when one
  // ends), only while the tab is visible and this view is the current one.
  const tick = async () => {
    if (gen !== generation) return;
    if (!document.hidden) await draw().catch(failed);
    if (gen === generation) refresh = setTimeout(tick, 5000);
  };
  if (gen === generation) refresh = setTimeout(tick, 5000);
}

async function route() {
  const signedIn = Boolean(key());
  document.getElementById("signout").hidden = !signedIn;
  document.getElementById("who").textContent = signedIn ? "signed in" : "";
  const gen = ++generation;
  if (!signedIn) return signIn();
  const [path, query] = location.hash.replace(/^#\/?/, "").split("?");
  const parts = path.split("/");
  const after = new URLSearchParams(query || "").get("after");
  try {
    if (parts[0] === "models" && UUID.test(parts[1] || "")) await model(parts[1], gen);
    else if (parts[0] === "models") throw new ApiError("No such model.", 404);
    else await models(after && UUID.test(after) ? after : null, gen);
  } catch (e) {
    if (gen !== generation) return;
    if (e.status === 401) {
      // A key revoked meanwhile: back to the sign-in form, saying why.
      sessionStorage.removeItem(KEY);
      document.getElementById("signout").hidden = true;
      document.getElementById("who").textContent = "";
      return signIn(e.message);
    }
    show(el("h1", {}, "Something went wrong"), el("p", { class: "error", role: "alert" }, e.message));
  }
  if (gen === generation) main.focus();
}

document.getElementById("signout").addEventListener("click", signOut);
window.addEventListener("hashchange", route);
route();

// The trajectory browser: a model's RL jobs and trajectory logs; for one of them, its groups
// side by side (what the advantage compares), each trajectory as a chat (tool calls and results
// shown) with its reward and metrics, and the tokens it trains on coloured by logprob (hover or
// focus a token to read it). Sorted and filtered by reward on the server. Without a chosen
// source the newest job is shown, and followed as new jobs arrive.
import { el, api, nav, show, every, when, num, UUID } from "./dom.js";
import { logprobColor } from "./chart.js";

const PER_PAGE = 10;

function message(m) {
  return el("div", { class: `msg ${m.sampled ? "sampled" : ""}` },
    el("div", { class: "role" }, m.role, m.sampled ? " · sampled" : "", m.tool_call_id ? ` · result of ${m.tool_call_id}` : ""),
    m.content ? el("div", { class: "content" }, m.content) : "",
    ...m.tool_calls.map((c) => el("div", { class: "tool-call mono" }, `→ ${c.name}(${c.arguments})`)));
}

/** A sequence's text with its sampled tokens coloured. One tab stop per sequence: arrow keys move
 * between its tokens (a long answer would otherwise be thousands of tab stops). */
function tokens(seq, readout) {
  let first = true;
  const p = el("p", {
    class: "tokens mono",
    onkeydown: (ev) => {
      if (!["ArrowLeft", "ArrowRight", "Home", "End"].includes(ev.key) || !ev.target.classList.contains("tok")) return;
      const all = [...p.querySelectorAll(".tok")];
      const at = all.indexOf(ev.target);
      const to = ev.key === "Home" ? 0 : ev.key === "End" ? all.length - 1
        : Math.max(0, Math.min(all.length - 1, at + (ev.key === "ArrowLeft" ? -1 : 1)));
      ev.preventDefault();
      ev.target.tabIndex = -1;
      all[to].tabIndex = 0;
      all[to].focus();
    },
  }, ...seq.map((run) => {
    if (!run.trained) return el("span", { class: "context" }, run.text);
    const color = logprobColor(run.logprob);
    const say = run.logprob === null || run.logprob === undefined
      ? `${JSON.stringify(run.text)}: logprob unknown`
      : `${JSON.stringify(run.text)}: logprob ${num(run.logprob, 4)}, p ${num(Math.exp(run.logprob), 3)}`;
    const span = el("span", { class: "tok", tabindex: first ? "0" : "-1", title: say }, run.text);
    first = false;
    // Set through CSSOM: the page's CSP allows no inline style attributes.
    if (color) span.style.background = color;
    else span.classList.add("unknown");
    const read = () => { readout.textContent = say; };
    span.addEventListener("pointerenter", read);
    span.addEventListener("focus", read);
    return span;
  }));
  return p;
}

function trajectory(t) {
  const readout = el("p", { class: "readout", "aria-live": "polite" });
  const metrics = Object.entries(t.metrics);
  return el("article", { class: "trajectory" },
    el("h4", {}, `Trajectory ${t.index} · reward ${num(t.reward, 4)}`),
    metrics.length ? el("p", { class: "mono" }, metrics.map(([k, v]) => `${k}=${typeof v === "number" ? num(v, 4) : JSON.stringify(v)}`).join(" ")) : "",
    t.exchanges ? el("p", { class: "hint" }, `${t.exchanges} recorded calls; the last to this model is shown.`) : "",
    ...t.histories.map((h, i) => el("section", { class: "chat", "aria-label": i === 0 ? "conversation" : `additional history ${i}` },
      i > 0 ? el("h5", {}, `Additional history ${i}`) : "",
      h.tools.length ? el("p", { class: "hint" }, `tools: ${h.tools.join(", ")}`) : "",
      ...h.messages.map(message))),
    el("details", {}, el("summary", {}, `Tokens trained on (${t.sequences.length} ${t.sequences.length === 1 ? "sequence" : "sequences"})`),
      t.sequences_error ? el("p", { class: "error" }, t.sequences_error) : "",
      t.sequences.length ? el("p", { class: "hint" }, "Tab to a sequence, then arrow keys to read its tokens.") : "",
      readout, ...t.sequences.map((s) => tokens(s, readout))));
}

function group(g) {
  const mean = g.trajectories.reduce((a, t) => a + t.reward, 0) / g.trajectories.length;
  return el("section", { class: "group" },
    el("h3", {}, `Group ${g.index} · mean reward ${num(mean, 4)} · ${g.trajectories.length} shown`),
    el("div", { class: "side-by-side" }, ...g.trajectories.map(trajectory)));
}

export async function trajectories(modelId, params, gen) {
  const [m, js, logs] = await Promise.all([
    api(`/v1/preview/models/${modelId}`),
    api(`/v1/preview/models/${modelId}/training-jobs?order=desc&limit=20`),
    api(`/v1/preview/models/${modelId}/logs?order=desc&limit=20`),
  ]);
  if (gen !== nav.generation) return;
  const rl = js.data.filter((j) => j.kind === "rl");
  const follow = !params.get("job") && !params.get("log");
  const jobId = params.get("job") || (follow && rl[0] ? rl[0].id : null);
  const logId = params.get("log");
  if ((jobId && !UUID.test(jobId)) || (logId && !UUID.test(logId))) throw new Error("Not a job or log id.");
  const offset = Math.max(0, Number.parseInt(params.get("offset") || "0", 10) || 0);
  const sort = ["index", "reward_desc", "reward_asc"].includes(params.get("sort")) ? params.get("sort") : "index";
  const base = `#/models/${modelId}/trajectories`;
  let shown = null;
  // Paging links name the job shown (in follow mode too), so "next" stays on it.
  const link = (over) => {
    const q = new URLSearchParams({ ...(shown && !logId ? { job: shown } : {}), ...(logId ? { log: logId } : {}), sort });
    for (const k of ["min_reward", "max_reward"]) if (params.get(k)) q.set(k, params.get(k));
    for (const [k, v] of Object.entries(over)) q.set(k, v);
    return `${base}?${q}`;
  };
  const sources = el("ul", { class: "sources" },
    ...rl.map((j) => el("li", {}, el("a", { href: `${base}?job=${j.id}`, "aria-current": j.id === jobId ? "true" : null },
      `job ${when(j.created_at)} · ${j.status}${j.step ? ` · step ${j.step}` : ""}`,
      Number.isFinite(j.rollout_metrics && j.rollout_metrics["train/reward"]) ? ` · reward ${num(j.rollout_metrics["train/reward"], 4)}` : ""))),
    ...logs.data.map((l) => el("li", {}, el("a", { href: `${base}?log=${l.id}`, "aria-current": l.id === logId ? "true" : null },
      `log ${l.split} · step ${l.step} · ${when(l.created_at)}`))));
  const sortSelect = el("select", { id: "tr-sort" },
    ...[["index", "as submitted"], ["reward_desc", "reward, highest first"], ["reward_asc", "reward, lowest first"]]
      .map(([v, label]) => el("option", { value: v, selected: v === sort }, label)));
  const minR = el("input", { id: "tr-min", type: "number", step: "any", value: params.get("min_reward") || "" });
  const maxR = el("input", { id: "tr-max", type: "number", step: "any", value: params.get("max_reward") || "" });
  const filters = el("form", {
    class: "toolbar",
    onsubmit: (ev) => {
      ev.preventDefault();
      const q = new URLSearchParams({ ...(jobId && !follow ? { job: jobId } : {}), ...(logId ? { log: logId } : {}), sort: sortSelect.value });
      if (minR.value !== "") q.set("min_reward", minR.value);
      if (maxR.value !== "") q.set("max_reward", maxR.value);
      location.hash = `${base}?${q}`;
    },
  }, el("label", { for: "tr-sort" }, "sort"), sortSelect, el("label", { for: "tr-min" }, "reward from"), minR,
  el("label", { for: "tr-max" }, "to"), maxR, el("button", { type: "submit" }, "Apply"));
  const body = el("div", { id: "groups" });
  show(
    el("h1", {}, `Trajectories · ${m.project} / ${m.name}`),
    el("p", {}, el("a", { href: `#/models/${modelId}` }, "Back to the model"),
      follow ? " · following the newest job" : ""),
    el("details", { open: !jobId && !logId }, el("summary", {}, "Jobs and logs"),
      rl.length || logs.data.length ? sources : el("p", {}, "No RL jobs or logs yet.")),
    filters,
    body,
  );
  const load = async (id) => {
    if (!id && !logId) return;
    const q = new URLSearchParams({ offset: String(offset), limit: String(PER_PAGE), sort });
    for (const k of ["min_reward", "max_reward"]) if (params.get(k)) q.set(k, params.get(k));
    const path = logId ? `/v1/preview/models/${modelId}/logs/${logId}/trajectories` : `/v1/preview/training-jobs/${id}/trajectories`;
    const page = await api(`${path}?${q}`);
    if (gen !== nav.generation) return;
    shown = id;
    const pager = el("p", {},
      `groups ${page.total_groups ? offset + 1 : 0}-${offset + page.groups.length} of ${page.total_groups}`,
      offset > 0 ? [" · ", el("a", { href: link({ offset: String(Math.max(0, offset - PER_PAGE)) }) }, "previous")] : "",
      offset + page.groups.length < page.total_groups ? [" · ", el("a", { href: link({ offset: String(offset + PER_PAGE) }) }, "next")] : "");
    body.replaceChildren(el("h2", {}, logId ? "Log" : `Job ${id}`), pager, ...page.groups.map(group));
  };
  // A source that cannot be shown (an old job, a bad filter) says why below the choices, which
  // stay usable.
  const loadOrSay = (id) => load(id).catch((e) => {
    if (gen !== nav.generation) return;
    if (e.status === 401) throw e;
    shown = id;
    body.replaceChildren(el("p", { class: "error", role: "alert" }, e.message));
  });
  await loadOrSay(jobId);
  if (follow) {
    every(gen, 5000, async () => {
      const newest = await api(`/v1/preview/models/${modelId}/training-jobs?order=desc&limit=20`).catch(() => null);
      const top = newest && newest.data.find((j) => j.kind === "rl");
      if (top && top.id !== shown) await loadOrSay(top.id).catch(() => {});
    });
  }
}

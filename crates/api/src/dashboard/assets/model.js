// A model's page: its curves (reward, training metrics; zoom to a step range, hover or arrow
// keys to read a value), its jobs, checkpoints and the playground.
import { extent, scale, ticks, linePath, nearest, zoomRange, bands } from "./chart.js";
import { el, svg, api, ApiError, errorText, key, nav, show, every, seconds, table, when, num } from "./dom.js";

const W = 480;
const H = 220;
const PAD = { l: 48, r: 10, t: 10, b: 26 };

/** A series' name: a job's rollout metrics are told apart from a log's of the same key. */
export const caption = (s) => (s.source === "jobs" ? `${s.key} (training jobs' rollouts)` : s.key);

function chart(series, checkpoints, xMode, onZoom, spread) {
  const pts = bands(series.points, spread && spread.points).map((p) => ({
    x: xMode === "time" ? p.time_ms : p.step, y: p.value, min: p.min, max: p.max, count: p.count, step: p.step,
    sd: p.sd, banded: p.banded,
  }));
  // Points come in step order; over time (a deleted checkpoint's step is written again) that
  // order can go back, so the line is drawn in the order of the x-axis.
  pts.sort((a, b) => a.x - b.x);
  const [x0, x1] = extent(pts.map((p) => p.x));
  const [y0, y1] = extent(pts.flatMap((p) => [p.min, p.max]));
  const sx = scale([x0, x1], [PAD.l, W - PAD.r]);
  const sy = scale([y0, y1], [H - PAD.b, PAD.t]);
  const g = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `${caption(series)}: ${pts.length} points` });
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
  if (pts.some((p) => p.banded)) {
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
    const spread = p.count > 1 ? ` (mean of ${p.count}, ${Number(p.min.toPrecision(4))} to ${Number(p.max.toPrecision(4))})`
      : Number.isFinite(p.sd) ? ` (std dev ${Number(p.sd.toPrecision(4))})` : "";
    readout.textContent = `${where}: ${Number(p.y.toPrecision(5))}${spread}`;
  };
  const toX = (ev) => {
    const box = g.getBoundingClientRect();
    return scale([PAD.l, W - PAD.r], [x0, x1])(((ev.clientX - box.left) / box.width) * W);
  };
  // Dragging across the chart (step axis) zooms every chart to the steps dragged over.
  const brush = svg("rect", { class: "brush", x: 0, y: PAD.t, width: 0, height: H - PAD.t - PAD.b, visibility: "hidden" });
  g.append(brush);
  let dragFrom = null;
  g.addEventListener("pointerdown", (ev) => {
    if (xMode !== "step" || !onZoom) return;
    dragFrom = toX(ev);
    g.setPointerCapture(ev.pointerId);
  });
  g.addEventListener("pointermove", (ev) => {
    const x = toX(ev);
    const p = nearest(pts, x);
    at = pts.indexOf(p);
    read(p);
    if (dragFrom !== null) {
      const [a, b] = [sx(Math.min(dragFrom, x)), sx(Math.max(dragFrom, x))];
      brush.setAttribute("x", a);
      brush.setAttribute("width", Math.max(0, b - a));
      brush.setAttribute("visibility", "visible");
    }
  });
  g.addEventListener("pointerup", (ev) => {
    if (dragFrom === null) return;
    const range = zoomRange(dragFrom, toX(ev));
    dragFrom = null;
    brush.setAttribute("visibility", "hidden");
    if (range) onZoom(range);
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
  }, el("figcaption", {}, caption(series)), g, readout);
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
  const progress = j.status === "running" ? " (see progress)" : "";
  return el("tr", {},
    el("td", {}, el("a", { href: `#/jobs/${j.id}` }, `${j.kind} job`), progress),
    status, el("td", {}, j.step ?? ""),
    el("td", {}, j.rollout_metrics && Number.isFinite(j.rollout_metrics["train/reward"]) ? Number(j.rollout_metrics["train/reward"].toPrecision(4)) : ""),
    el("td", {}, j.created_at ? new Date(j.created_at).toLocaleString() : ""),
    el("td", {}, seconds(j.started_at, j.finished_at)), el("td", {}, cancel));
}

/** Saves what a keyed GET answers as a file: a plain link could not send the key. */
async function download(path, button) {
  button.disabled = true;
  try {
    const r = await fetch(path, { headers: { Authorization: `Bearer ${key()}` } });
    if (!r.ok) throw new ApiError(errorText(await r.json().catch(() => null), r.status), r.status);
    const name = (/filename="([^"]+)"/.exec(r.headers.get("Content-Disposition") || "") || [])[1] || "adapter.tar";
    const url = URL.createObjectURL(await r.blob());
    const a = el("a", { href: url, download: name, hidden: true });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
  } finally {
    button.disabled = false;
  }
}

/** A checkpoint's rewards and loss in a line; every metric on request. */
function checkpointMetrics(metrics) {
  const all = Object.entries(metrics || {});
  const main = all.filter(([k]) => k.endsWith("/reward") || k === "loss");
  const line = main.map(([k, v]) => `${k} ${num(v, 4)}`).join(" · ");
  if (all.length <= main.length) return line;
  return el("details", {}, el("summary", {}, line || `${all.length} ${all.length === 1 ? "metric" : "metrics"}`),
    el("p", { class: "mono" }, all.map(([k, v]) => `${k}=${num(v, 5)}`).join(" ")));
}

function ordered(series) {
  const rank = (k) => (k.endsWith("/reward") ? 0 : k.startsWith("training/") ? 1 : 2);
  return [...series].sort((a, b) => rank(a.key) - rank(b.key) || a.key.localeCompare(b.key));
}

export async function model(id, gen) {
  const m = await api(`/v1/preview/models/${id}`);
  if (gen !== nav.generation) return;
  let xMode = "step";
  let zoom = null; // [first step, last step] when zoomed
  const zoomFrom = el("input", { id: "zoom-from", type: "number", min: "0", step: "1", inputmode: "numeric", size: "6" });
  const zoomTo = el("input", { id: "zoom-to", type: "number", min: "0", step: "1", inputmode: "numeric", size: "6" });
  const setZoom = (range) => {
    zoom = range;
    zoomFrom.value = range ? range[0] : "";
    zoomTo.value = range ? range[1] : "";
    draw().catch(failed);
  };
  const charts = el("div", { class: "charts" });
  const more = el("div", { class: "charts" });
  const ckpts = el("tbody");
  const ckptStatus = el("p", { class: "error", role: "alert" });
  const jobs = el("tbody");
  const playgroundSlot = el("div");
  let playgroundSteps = null;
  const updated = el("span", { class: "readout" });
  let drawnCharts = null;
  const drawCharts = (h) => {
    // A chart that had the focus has it again once redrawn (its caption names it).
    const had = document.activeElement && document.activeElement.closest("figure");
    const focused = had ? had.querySelector("figcaption").textContent : null;
    const primary = [];
    const rest = [];
    for (const s of ordered(h.series)) {
      const first = s.key.endsWith("/reward") || ["training/loss", "training/entropy", "training/grad_norm"].includes(s.key);
      // A reward's spread is drawn around it: its std dev series of the same source.
      const spread = s.key.endsWith("/reward")
        ? h.series.find((o) => o.source === s.source && o.key === `${s.key}_std_dev`) : undefined;
      (first ? primary : rest).push(chart(s, h.checkpoints, xMode, setZoom, spread));
    }
    charts.replaceChildren(...(primary.length ? primary : [el("p", {}, "Nothing logged yet.")]));
    more.replaceChildren(...rest);
    if (focused !== null) {
      const again = [...charts.querySelectorAll("figure"), ...more.querySelectorAll("figure")]
        .find((f) => f.querySelector("figcaption").textContent === focused);
      if (again) again.focus();
    }
  };
  const drawOnce = async () => {
    const q = new URLSearchParams({ max_points: "400" });
    if (zoom) {
      q.set("min_step", zoom[0]);
      q.set("max_step", zoom[1]);
    }
    const h = await api(`/v1/preview/models/${id}/history?${q}`);
    if (gen !== nav.generation) return;
    // The charts are rebuilt only when what they show changed, so the poll never takes away a
    // chart's focus (and the point its arrow keys are reading) for nothing.
    const shows = JSON.stringify([h.series, h.checkpoints, xMode]);
    if (shows !== drawnCharts) {
      drawnCharts = shows;
      drawCharts(h);
    }
    // The newest 100 with their metrics (the training summary and the logs made at that step).
    const cps = await api(`/v1/preview/models/${id}/checkpoints?order=desc&limit=100`);
    if (gen !== nav.generation) return;
    ckpts.replaceChildren(...cps.data.map((c) =>
      el("tr", {}, el("td", {}, c.step), el("td", {}, when(c.created_at)), el("td", {}, checkpointMetrics(c.metrics)),
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
        }, "Delete"), " ", el("button", {
          type: "button",
          "aria-label": `Download checkpoint ${c.step} as a PEFT adapter`,
          onclick: (ev) => {
            ckptStatus.textContent = "";
            download(`/v1/preview/models/${id}/checkpoints/${c.step}/adapter`, ev.target).catch((e) => {
              if (e.status === 401) return failed(e);
              ckptStatus.textContent = `could not download checkpoint ${c.step}: ${e.message}`;
            });
          },
        }, "Download")))));
    // The playground is rebuilt only when the checkpoints change (never under the user's typing).
    const steps = h.checkpoints.map((c) => c.step).reverse();
    if (JSON.stringify(steps) !== playgroundSteps) {
      playgroundSteps = JSON.stringify(steps);
      playgroundSlot.replaceChildren(playground(m, steps));
    }
    const js = await api(`/v1/preview/models/${id}/training-jobs?order=desc&limit=20`);
    if (gen !== nav.generation) return;
    jobs.replaceChildren(...js.data.map((j) => jobRow(j, () => draw().catch(failed))));
    updated.textContent = `${h.truncated ? "truncated history; " : ""}updated ${new Date().toLocaleTimeString()}`;
  };
  // One read of the page's data at a time: a zoom, a delete or the poll that comes while one is
  // under way runs after it, so an older answer never lands over a newer request's.
  let drawing = Promise.resolve();
  const draw = () => {
    drawing = drawing.catch(() => {}).then(drawOnce);
    return drawing;
  };
  const failed = (e) => {
    if (e.status === 401) return window.dispatchEvent(new HashChangeEvent("hashchange"));
    updated.textContent = `could not refresh: ${e.message}`;
  };
  const xSelect = el("select", { id: "xaxis", onchange: () => { xMode = xSelect.value; draw().catch(failed); } },
    el("option", { value: "step" }, "training step"), el("option", { value: "time" }, "time"));
  const zoomForm = el("form", {
    class: "toolbar",
    "aria-label": "Zoom to steps",
    onsubmit: (ev) => {
      ev.preventDefault();
      const a = zoomFrom.value === "" ? 0 : Number(zoomFrom.value);
      const b = zoomTo.value === "" ? Number.MAX_SAFE_INTEGER : Number(zoomTo.value);
      setZoom(Number.isInteger(a) && Number.isInteger(b) && a <= b ? [a, b] : null);
    },
  }, el("label", { for: "zoom-from" }, "steps from"), zoomFrom, el("label", { for: "zoom-to" }, "to"), zoomTo,
  el("button", { type: "submit" }, "Zoom"), el("button", { type: "button", onclick: () => setZoom(null) }, "All steps"));
  show(
    el("h1", {}, `${m.project} / ${m.name}`),
    el("p", {}, `Base model ${m.base_model} · served as `, el("code", {}, `wandb-artifact:///${m.entity}/${m.project}/${m.name}`),
      " · ", el("a", { href: `#/models/${id}/trajectories` }, "Trajectories")),
    el("div", { class: "toolbar" }, el("label", { for: "xaxis" }, "x-axis"), xSelect, updated),
    zoomForm,
    el("p", { class: "hint" }, "Drag across a chart to zoom to those steps; arrow keys on a focused chart read its points."),
    charts,
    el("details", {}, el("summary", {}, "More metrics"), more),
    el("h2", {}, "Playground"),
    playgroundSlot,
    el("h2", {}, "Training jobs (newest 20)"),
    table(["Job", "Status", "Step", "Reward", "Created", "Duration", "Action"], jobs),
    el("h2", {}, "Checkpoints (newest 100)"),
    table(["Step", "Created", "Metrics", "Actions"], ckpts),
    ckptStatus,
  );
  await draw();
  // Live: the curves follow a running job.
  every(gen, 5000, () => draw().catch(failed));
}


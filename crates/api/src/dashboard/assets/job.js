// A training job's page: status, progress (gradient steps done of the total), duration, its
// error in full, its event stream (followed live while it runs), cancel, and a link to the
// trajectories it trains on.
import { el, api, nav, show, every, seconds, when, num, table } from "./dom.js";
import { progress } from "./metrics.js";

const POLL_MS = 2000;
const SHOWN_EVENTS = 500;
const live = (j) => j.status === "queued" || j.status === "running";

function summary(data) {
  if (!data || typeof data !== "object") return "";
  return Object.entries(data)
    .map(([k, v]) => `${k}=${typeof v === "number" ? num(v, 5) : JSON.stringify(v)}`)
    .join(" ");
}

export async function job(id, gen) {
  let j = await api(`/v1/preview/training-jobs/${id}`);
  if (gen !== nav.generation) return;
  const events = [];
  const head = el("p");
  const bar = el("progress", { id: "job-progress", max: "1", value: "0", "aria-label": "gradient steps done" });
  const barText = el("span", { class: "readout", "aria-live": "polite" });
  const eventsTitle = el("h2", {}, "Events (newest first)");
  const error = el("div");
  const rows = el("tbody");
  const actions = el("div", { class: "toolbar" });
  const render = () => {
    const p = progress(events);
    const last = events[events.length - 1];
    const ended = j.finished_at || (last && !live(j) ? last.created_at : null);
    head.textContent = `${j.kind} job · ${j.status}${j.step ? ` · produced step ${j.step}` : ""} · created ${when(j.created_at)}`
      + `${j.started_at ? ` · ran ${seconds(j.started_at, ended || new Date().toISOString())}` : ""}`;
    bar.max = String(p.total || 1);
    bar.value = String(p.total ? p.done : j.status === "succeeded" ? 1 : 0);
    barText.textContent = p.total ? `${p.done} of ${p.total} gradient steps` : j.status === "queued" ? "waiting for the trainer" : "";
    error.replaceChildren(...(j.error_message
      ? [el("h2", {}, "Error"), el("pre", { class: "error-text" }, j.error_message)] : []));
    const shown = events.slice(-SHOWN_EVENTS).reverse();
    eventsTitle.textContent = `Events (newest first${events.length > SHOWN_EVENTS ? `, the last ${SHOWN_EVENTS} of ${events.length}` : ""})`;
    rows.replaceChildren(...shown.map((e) => el("tr", {},
      el("td", {}, e.type), el("td", {}, when(e.created_at)), el("td", { class: "mono" }, summary(e.data)))));
    actions.replaceChildren(
      el("a", { href: `#/models/${j.model_id}` }, "The model"),
      j.kind === "rl" ? el("a", { href: `#/models/${j.model_id}/trajectories?job=${j.id}` }, "Its trajectories") : "",
      live(j) ? el("button", {
        type: "button",
        onclick: async (ev) => {
          if (!confirm(`Cancel this ${j.kind} job?`)) return;
          ev.target.disabled = true;
          await api(`/v1/preview/training-jobs/${id}/cancel`, "POST").catch(() => null);
          await read();
        },
      }, "Cancel") : "");
  };
  // Events are read onwards from the last one seen, a page at a time; one read at a time (a
  // cancel during a poll waits for it, then reads again), so no page is appended twice.
  let reading = Promise.resolve();
  const read = () => {
    reading = reading.then(readOnce, readOnce);
    return reading;
  };
  const readOnce = async () => {
    for (;;) {
      const q = new URLSearchParams({ limit: "100" });
      if (events.length) q.set("after", events[events.length - 1].id);
      const page = await api(`/v1/preview/training-jobs/${id}/events?${q}`);
      if (gen !== nav.generation) return;
      events.push(...page.data);
      if (!page.has_more) break;
    }
    j = await api(`/v1/preview/training-jobs/${id}`);
    if (gen !== nav.generation) return;
    render();
  };
  show(
    el("h1", {}, "Training job"),
    el("p", { class: "mono" }, id),
    head,
    el("p", {}, bar, " ", barText),
    actions,
    error,
    eventsTitle,
    table(["Type", "When", "Data"], rows),
  );
  await read();
  every(gen, POLL_MS, async () => {
    if (live(j)) await read().catch((e) => { barText.textContent = `could not refresh: ${e.message}`; });
  });
}

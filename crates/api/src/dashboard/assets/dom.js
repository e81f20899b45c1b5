// What every view of the dashboard shares: building nodes (data is never parsed as HTML), the
// API with the signed-in key, and which view is current. The key stays in this tab's
// sessionStorage and goes out as a Bearer header, so no cookie is ever sent on the user's behalf
// (no CSRF to defend against).

export const KEY = "tandem-api-key";
export const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
export const key = () => sessionStorage.getItem(KEY);

/** The current view: `generation` is bumped by each navigation, so a view whose number is
 * stale stops writing; `timer` is the poll of a live view. */
export const nav = { generation: 0, timer: null };
const main = () => document.getElementById("main");

export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== false && v !== null && v !== undefined) e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

export function svg(tag, attrs = {}, ...children) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

export function errorText(body, status) {
  const d = body && body.detail;
  if (typeof d === "string") return d;
  if (Array.isArray(d) && d[0] && d[0].msg) return d[0].msg;
  if (body && body.error && body.error.message) return body.error.message;
  return `HTTP ${status}`;
}

export class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

export async function api(path, method = "GET", body = undefined) {
  const headers = { Authorization: `Bearer ${key()}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const answer = await r.json().catch(() => null);
  if (r.status === 401) throw new ApiError("This API key was not accepted.", 401);
  if (!r.ok) throw new ApiError(errorText(answer, r.status), r.status);
  return answer;
}

/** Text that is not JSON (`/metrics`), with the key. */
export async function apiText(path) {
  const r = await fetch(path, { headers: { Authorization: `Bearer ${key()}` } });
  if (r.status === 401) throw new ApiError("This API key was not accepted.", 401);
  if (!r.ok) throw new ApiError(`HTTP ${r.status}`, r.status);
  return r.text();
}

export function show(...nodes) {
  if (nav.timer) clearTimeout(nav.timer);
  nav.timer = null;
  main().replaceChildren(...nodes);
}

/** Calls `poll` every `ms` while view `gen` is current: one call at a time (the next is
 * scheduled when one ends), skipped while the tab is hidden. */
export function every(gen, ms, poll) {
  const tick = async () => {
    if (gen !== nav.generation) return;
    if (!document.hidden) await poll();
    if (gen === nav.generation) nav.timer = setTimeout(tick, ms);
  };
  if (gen === nav.generation) nav.timer = setTimeout(tick, ms);
}

export function seconds(a, b) {
  return a && b ? `${Math.round((Date.parse(b) - Date.parse(a)) / 100) / 10} s` : "";
}

export const when = (iso) => (iso ? new Date(iso).toLocaleString() : "");
export const num = (x, digits = 4) => (Number.isFinite(x) ? String(Number(x.toPrecision(digits))) : "");

export function table(headers, body) {
  return el("div", { class: "table-wrap" },
    el("table", {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", { scope: "col" }, h)))), body));
}

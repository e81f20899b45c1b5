// Pure reading of `/metrics` (classic or OpenMetrics text: only the samples, the same in both) for the server page: no DOM here, so
// `node --test` checks it (metrics.test.mjs).

/** Every sample line as { name, labels, value }; comments and malformed lines are skipped. */
export function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    // Label values are quoted with \\, \" and \n escaped.
    const re = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
    let l;
    while ((l = re.exec(m[3] || "")) !== null) {
      labels[l[1]] = l[2].replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
    }
    const value = Number(m[4] === "+Inf" ? Infinity : m[4] === "-Inf" ? -Infinity : m[4]);
    if (Number.isNaN(value) && m[4] !== "NaN") continue;
    out.push({ name: m[1], labels, value });
  }
  return out;
}

/** The sum of the samples named `name` whose labels include every pair of `match`. */
export function total(samples, name, match = {}) {
  let sum = 0;
  for (const s of samples) {
    if (s.name !== name) continue;
    if (Object.entries(match).every(([k, v]) => s.labels[k] === v)) sum += s.value;
  }
  return sum;
}

/** The distinct values of one label among samples named `name`, sorted. */
export function labelValues(samples, name, label) {
  return [...new Set(samples.filter((s) => s.name === name && label in s.labels).map((s) => s.labels[label]))].sort();
}

/** A histogram's mean (`_sum` / `_count`), or NaN before any observation. */
export function mean(samples, name, match = {}) {
  const n = total(samples, `${name}_count`, match);
  return n > 0 ? total(samples, `${name}_sum`, match) / n : NaN;
}

/** Per second between two readings of a counter; NaN without an earlier reading, 0 after a
 * restart (a counter that went down). */
export function rate(before, after, seconds) {
  if (!Number.isFinite(before) || !(seconds > 0)) return NaN;
  return after >= before ? (after - before) / seconds : 0;
}

/** HTTP answers of status class 4xx or 5xx by route since the last reading: [{ handler,
 * status, count }], most first. */
export function newErrors(before, after) {
  const key = (s) => `${s.labels.method} ${s.labels.handler} ${s.labels.status}`;
  const was = new Map(before.filter((s) => s.name === "http_requests_total").map((s) => [key(s), s.value]));
  const out = [];
  for (const s of after) {
    if (s.name !== "http_requests_total" || !/^[45]xx$/.test(s.labels.status || "")) continue;
    const count = s.value - (was.get(key(s)) || 0);
    if (count > 0) out.push({ handler: s.labels.handler, method: s.labels.method, status: s.labels.status, count });
  }
  return out.sort((a, b) => b.count - a.count);
}

/** A training job's progress from its events (oldest first): gradient steps done of the total
 * `training_started` announced (`num_sequences`: one gradient step each), counted from the
 * latest start (a restarted job begins again). */
export function progress(events) {
  let totalSteps = null;
  let done = 0;
  for (const e of events) {
    if (e.type === "training_started") {
      totalSteps = Number.isFinite(e.data && e.data.num_sequences) ? e.data.num_sequences : null;
      done = 0;
    } else if (e.type === "training_restarted") {
      totalSteps = null;
      done = 0;
    } else if (e.type === "gradient_step") {
      done += 1;
    }
  }
  return { done, total: totalSteps };
}

/** A registry entry's state in words, as `tandem nodes list` puts it. */
export function nodeState(n) {
  if (!n.alive) return "gone";
  if (n.draining) return n.busy ? "draining (finishing a job)" : "drained (idle: safe to stop)";
  return n.busy ? "training" : "ready";
}

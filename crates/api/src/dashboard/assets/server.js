// The server page: health, and what `/metrics` says of inference and training (requests
// running and waiting, KV-cache use, token throughput, latencies, jobs), with the HTTP errors
// answered since the page opened, and the cluster's nodes from the registry (`/v1/nodes`).
// Throughput is the difference between two readings.
import { el, api, apiText, nav, show, every, num, table } from "./dom.js";
import { parseMetrics, total, labelValues, mean, rate, newErrors, nodeState } from "./metrics.js";

const POLL_MS = 3000;

export async function server(gen) {
  const health = el("p", { id: "health", role: "status" });
  const models = el("tbody");
  const training = el("tbody");
  const errors = el("tbody");
  const nodes = el("tbody");
  const updated = el("span", { class: "readout" });
  const recent = []; // { at, handler, method, status, count }, newest first, at most 50
  let before = null; // { at, samples }

  const read = async () => {
    const checked = await fetch("/v1/system-check").then((r) => r.json()).catch(() => null);
    const [text, h, listed] = await Promise.all([
      apiText("/metrics"),
      api("/health").catch((e) => ({ status: e.message })),
      api("/v1/nodes").catch(() => ({ data: [] })),
    ]);
    if (gen !== nav.generation) return;
    const now = Date.now();
    const samples = parseMetrics(text);
    const secs = before ? (now - before.at) / 1000 : 0;
    const per = (name, match) => rate(before ? total(before.samples, name, match) : NaN, total(samples, name, match), secs);
    const parts = checked ? Object.entries(checked).filter(([k]) => k !== "api")
      .map(([k, v]) => `${k.replace("_", " ")}: ${v && v.success === false ? `down (${v.error || "error"})` : "up"}`) : [];
    health.textContent = `Health: ${h.status}${parts.length ? ` · ${parts.join(" · ")}` : ""}`;
    models.replaceChildren(...labelValues(samples, "vllm:num_requests_running", "model_name").map((m) => {
      const at = { model_name: m };
      const kv = total(samples, "vllm:kv_cache_usage_perc", at);
      return el("tr", {},
        el("th", { scope: "row" }, m),
        el("td", {}, total(samples, "vllm:num_requests_running", at)),
        el("td", {}, total(samples, "vllm:num_requests_waiting", at)),
        el("td", {}, `${num(kv * 100, 3)} %`),
        el("td", {}, num(per("vllm:generation_tokens_total", at), 4)),
        el("td", {}, num(per("vllm:prompt_tokens_total", at), 4)),
        el("td", {}, total(samples, "vllm:request_success_total", at)),
        el("td", {}, num(mean(samples, "vllm:time_to_first_token_seconds", at), 3)),
        el("td", {}, num(mean(samples, "vllm:e2e_request_latency_seconds", at), 3)));
    }));
    const jobs = (state) => total(samples, "tandem:training_jobs", { state });
    training.replaceChildren(el("tr", {},
      el("td", {}, jobs("queued")), el("td", {}, jobs("running")),
      el("td", {}, total(samples, "tandem:training_gradient_steps_total")),
      el("td", {}, num(per("tandem:training_trained_tokens_total", {}), 4))));
    if (before) {
      for (const e of newErrors(before.samples, samples)) recent.unshift({ at: now, ...e });
      recent.splice(50);
    }
    errors.replaceChildren(...recent.map((e) => el("tr", {},
      el("td", {}, new Date(e.at).toLocaleTimeString()), el("td", {}, e.method), el("td", {}, e.handler),
      el("td", {}, e.status), el("td", {}, e.count))));
    if (recent.length === 0) errors.append(el("tr", {}, el("td", { colspan: "5" }, "None since this page opened.")));
    nodes.replaceChildren(...listed.data.map((n) => el("tr", {},
      el("th", { scope: "row" }, n.name), el("td", {}, n.role), el("td", {}, nodeState(n)),
      el("td", {}, `${Math.max(0, Math.round(now / 1000 - n.heartbeat_at))} s ago`), el("td", {}, n.version))));
    before = { at: now, samples };
    updated.textContent = `updated ${new Date(now).toLocaleTimeString()} (every ${POLL_MS / 1000} s)`;
  };
  show(
    el("h1", {}, "Server"),
    health,
    updated,
    el("h2", {}, "Inference, per served model"),
    table(["Model", "Running", "Waiting", "KV cache", "Generated tok/s", "Prompt tok/s", "Succeeded", "Mean TTFT (s)", "Mean latency (s)"], models),
    el("h2", {}, "Training (every entity)"),
    table(["Jobs queued", "Jobs running", "Gradient steps", "Trained tok/s"], training),
    el("h2", {}, "Nodes"),
    table(["Node", "Role", "State", "Last heartbeat", "Version"], nodes),
    el("h2", {}, "Errors answered since this page opened"),
    table(["When", "Method", "Route", "Status", "Count"], errors),
    el("p", { class: "hint" }, "Counts come from this server's /metrics (every tenant's requests, no contents)."),
  );
  await read();
  every(gen, POLL_MS, () => read().catch((e) => { updated.textContent = `could not refresh: ${e.message}`; }));
}

// node --test: reading /metrics for the server page, against hand-written samples.
import { test } from "node:test";
import assert from "node:assert/strict";
import { parseMetrics, total, labelValues, mean, rate, newErrors, progress, nodeState } from "./metrics.js";

const TEXT = `# HELP vllm:num_requests_running Number of requests
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a",engine="0"} 2
vllm:num_requests_running{model_name="b \\"x\\"",engine="1"} 1
vllm:e2e_request_latency_seconds_sum{model_name="a",engine="0"} 3.0
vllm:e2e_request_latency_seconds_count{model_name="a",engine="0"} 4
http_requests_total{handler="/v1/chat/completions",method="POST",status="4xx"} 3
http_requests_total{handler="/v1/chat/completions",method="POST",status="2xx"} 9
http_requests_total{handler="/v1/models",method="GET",status="5xx"} 1
broken line
# EOF
`;

test("samples are parsed with their labels, escapes undone", () => {
  const s = parseMetrics(TEXT);
  assert.equal(s.length, 7);
  assert.deepEqual(s[1], { name: "vllm:num_requests_running", labels: { model_name: 'b "x"', engine: "1" }, value: 1 });
  assert.equal(total(s, "vllm:num_requests_running"), 3);
  assert.equal(total(s, "vllm:num_requests_running", { model_name: "a" }), 2);
  assert.deepEqual(labelValues(s, "vllm:num_requests_running", "model_name"), ["a", 'b "x"']);
  assert.equal(mean(s, "vllm:e2e_request_latency_seconds", { model_name: "a" }), 0.75);
  assert.ok(Number.isNaN(mean(s, "vllm:e2e_request_latency_seconds", { model_name: "b" })));
});

test("rates per second, and a restarted counter is not negative", () => {
  assert.equal(rate(10, 25, 5), 3);
  assert.equal(rate(25, 10, 5), 0);
  assert.ok(Number.isNaN(rate(undefined, 10, 5)));
});

test("new errors are the 4xx and 5xx answers since the last reading", () => {
  const before = parseMetrics(TEXT);
  const after = parseMetrics(TEXT.replace('status="4xx"} 3', 'status="4xx"} 5'));
  assert.deepEqual(newErrors(before, after), [{ handler: "/v1/chat/completions", method: "POST", status: "4xx", count: 2 }]);
  assert.equal(newErrors([], before).length, 2);
  // One route, two methods: each counter is compared with its own earlier value.
  const two = (get, del) => parseMetrics(`http_requests_total{handler="/m",method="GET",status="4xx"} ${get}
http_requests_total{handler="/m",method="DELETE",status="4xx"} ${del}
`);
  assert.deepEqual(newErrors(two(5, 1), two(5, 1)), []);
  assert.deepEqual(newErrors(two(5, 1), two(5, 3)), [{ handler: "/m", method: "DELETE", status: "4xx", count: 2 }]);
});

test("a job's progress counts gradient steps since its latest start", () => {
  const ev = (type, data = {}) => ({ type, data });
  assert.deepEqual(progress([]), { done: 0, total: null });
  const first = [ev("training_started", { num_sequences: 4 }), ev("gradient_step"), ev("gradient_step")];
  assert.deepEqual(progress(first), { done: 2, total: 4 });
  const again = [...first, ev("training_restarted"), ev("training_started", { num_sequences: 4 }), ev("gradient_step")];
  assert.deepEqual(progress(again), { done: 1, total: 4 });
  assert.deepEqual(progress([...again, ev("training_restarted")]), { done: 0, total: null });
});

test("a node's state reads as the command line prints it", () => {
  const n = (alive, draining, busy) => ({ alive, draining, busy });
  assert.equal(nodeState(n(false, true, true)), "gone");
  assert.equal(nodeState(n(true, true, true)), "draining (finishing a job)");
  assert.equal(nodeState(n(true, true, false)), "drained (idle: safe to stop)");
  assert.equal(nodeState(n(true, false, true)), "training");
  assert.equal(nodeState(n(true, false, false)), "ready");
});
